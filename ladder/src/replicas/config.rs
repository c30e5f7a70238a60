//! The replica events' flags (flattened into the fleet's) and the checks
//! that refuse what makes no sense before anything starts.

use crate::error::{LadderError, Result};

/// Default `--stop-control-plane-secs`.
pub const DEFAULT_STOP_SECS: u64 = 30;

/// The hold events that act on control-plane replicas (local mode, with
/// `--control-planes 2` or more).
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Control-plane replicas (local mode, --control-planes 2 or more)")]
pub struct ReplicaEventsConfig {
    /// SIGKILL a random live control-plane replica every this many seconds of
    /// the hold (at S, 2S, … s) and start it again on its address at once,
    /// seconds. Default: none.
    #[arg(long = "kill-control-plane-every-secs",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub kill_every_secs: Option<u64>,
    /// Seed of the draws that pick each kill's replica, a number (the same
    /// seed and live replicas give the same victims; recorded in the report).
    /// Default: drawn at start and printed.
    #[arg(long = "kill-control-plane-seed")]
    pub kill_seed: Option<u64>,
    /// SIGTERM each control-plane replica in turn this many seconds into the
    /// hold, start it again on its address and wait for its `/readyz` before
    /// the next, seconds. Default: none.
    #[arg(long = "rolling-restart-control-planes-at")]
    pub rolling_restart_at_secs: Option<u64>,
    /// SIGSTOP the control-plane replica holding the most routers' Watch
    /// streams this many seconds into the hold (SIGCONT after
    /// `--stop-control-plane-secs`), seconds. Default: none.
    #[arg(long = "stop-control-plane-at")]
    pub stop_at_secs: Option<u64>,
    /// How long `--stop-control-plane-at` keeps the replica stopped, seconds.
    /// Default 30.
    #[arg(long = "stop-control-plane-secs", default_value_t = DEFAULT_STOP_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub stop_secs: u64,
}

impl Default for ReplicaEventsConfig {
    fn default() -> Self {
        Self {
            kill_every_secs: None,
            kill_seed: None,
            rolling_restart_at_secs: None,
            stop_at_secs: None,
            stop_secs: DEFAULT_STOP_SECS,
        }
    }
}

/// What the checks need from the mesh's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshShape {
    /// `--control-planes`.
    pub control_planes: u32,
    /// Whether the store is PostgreSQL (`--control-plane-store postgres`
    /// or a `postgres://` `--control-plane-db`).
    pub postgres: bool,
    /// `--hold-secs`.
    pub hold_secs: u64,
    /// `--restart-control-plane-at` was given.
    pub restart_control_plane: bool,
}

impl ReplicaEventsConfig {
    /// The flags that act on the mesh's processes (refused in remote mode).
    pub fn local_only(&self) -> [(&'static str, Option<u64>); 3] {
        [
            ("--kill-control-plane-every-secs", self.kill_every_secs),
            (
                "--rolling-restart-control-planes-at",
                self.rolling_restart_at_secs,
            ),
            ("--stop-control-plane-at", self.stop_at_secs),
        ]
    }

    /// Whether any replica event is asked for.
    pub fn any(&self) -> bool {
        self.local_only().iter().any(|(_, v)| v.is_some())
    }

    /// Refuses replicas without a shared database, replica events without
    /// replicas, the single control plane's restart beside replicas, and a
    /// kill period no kill of the hold would fit in.
    pub fn check(&self, mesh: MeshShape) -> Result<()> {
        if mesh.control_planes > 1 && !mesh.postgres {
            return Err(LadderError::Args(format!(
                "--control-planes {}: replicas share one database, which needs PostgreSQL \
                 (--control-plane-store postgres or --control-plane-db postgres://…); \
                 SQLite is one process's file",
                mesh.control_planes
            )));
        }
        if mesh.control_planes < 2
            && let Some((flag, _)) = self.local_only().iter().find(|(_, v)| v.is_some())
        {
            return Err(LadderError::Args(format!(
                "{flag} acts on control-plane replicas: it needs --control-planes 2 or \
                 more (one control plane: --restart-control-plane-at)"
            )));
        }
        if mesh.control_planes > 1 && mesh.restart_control_plane {
            return Err(LadderError::Args(
                "--restart-control-plane-at restarts the one control plane: with \
                 --control-planes use --rolling-restart-control-planes-at or \
                 --kill-control-plane-every-secs"
                    .into(),
            ));
        }
        if self.kill_seed.is_some() && self.kill_every_secs.is_none() {
            return Err(LadderError::Args(
                "--kill-control-plane-seed seeds --kill-control-plane-every-secs, which is not given"
                    .into(),
            ));
        }
        if let Some(every) = self.kill_every_secs
            && every >= mesh.hold_secs
        {
            return Err(LadderError::Args(format!(
                "--kill-control-plane-every-secs {every}: no kill falls in the hold \
                 (--hold-secs {})",
                mesh.hold_secs
            )));
        }
        Ok(())
    }
}

impl ReplicaEventsConfig {
    /// A warning when a replica event falls after `--revoke-token-at`
    /// `revoke_at` in a hold of `hold_secs`: the revoked members hold no
    /// router from then on, so every later window counts them as lost.
    pub fn after_revocation(&self, revoke_at: Option<u64>, hold_secs: u64) -> Option<String> {
        let revoke_at = revoke_at?;
        let kills = self
            .kill_every_secs
            .map(|every| super::choice::kill_times(every, hold_secs))
            .unwrap_or_default();
        let later = kills
            .into_iter()
            .chain(self.rolling_restart_at_secs)
            .chain(self.stop_at_secs)
            .filter(|at| *at > revoke_at && *at < hold_secs)
            .min()?;
        Some(format!(
            "the replica event at {later} s comes after --revoke-token-at {revoke_at}: its \
             window counts the revoked members as lost (put the revocation after the last \
             replica event to keep them apart)"
        ))
    }
}

/// Whether `--control-plane-db` names a PostgreSQL database.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The value of `flag` among extra program arguments (`--flag=V` or
/// `--flag V`; the last one wins, as clap takes it).
pub fn arg_value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        } else if a == flag {
            found = it.next().cloned();
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(control_planes: u32, postgres: bool) -> MeshShape {
        MeshShape {
            control_planes,
            postgres,
            hold_secs: 60,
            restart_control_plane: false,
        }
    }

    fn refused(cfg: &ReplicaEventsConfig, mesh: MeshShape) -> String {
        match cfg.check(mesh) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{cfg:?} with {mesh:?} was accepted"),
        }
    }

    #[test]
    fn replicas_need_postgres() {
        let none = ReplicaEventsConfig::default();
        assert!(refused(&none, shape(3, false)).contains("needs PostgreSQL"));
        none.check(shape(3, true)).expect("replicas on PostgreSQL");
        none.check(shape(1, false))
            .expect("one control plane on SQLite");
    }

    #[test]
    fn replica_events_need_replicas() {
        for cfg in [
            ReplicaEventsConfig {
                kill_every_secs: Some(10),
                ..ReplicaEventsConfig::default()
            },
            ReplicaEventsConfig {
                rolling_restart_at_secs: Some(10),
                ..ReplicaEventsConfig::default()
            },
            ReplicaEventsConfig {
                stop_at_secs: Some(10),
                ..ReplicaEventsConfig::default()
            },
        ] {
            let why = refused(&cfg, shape(1, true));
            assert!(why.contains("needs --control-planes 2"), "{why}");
            cfg.check(shape(2, true)).expect("two replicas");
            assert!(cfg.any());
        }
        assert!(!ReplicaEventsConfig::default().any());
    }

    #[test]
    fn the_single_restart_the_seed_and_the_kill_period_are_checked() {
        let none = ReplicaEventsConfig::default();
        let mut mesh = shape(3, true);
        mesh.restart_control_plane = true;
        assert!(refused(&none, mesh).contains("--rolling-restart-control-planes-at"));
        let seed_alone = ReplicaEventsConfig {
            kill_seed: Some(7),
            ..ReplicaEventsConfig::default()
        };
        assert!(refused(&seed_alone, shape(3, true)).contains("not given"));
        let too_slow = ReplicaEventsConfig {
            kill_every_secs: Some(60),
            ..ReplicaEventsConfig::default()
        };
        assert!(refused(&too_slow, shape(3, true)).contains("no kill falls in the hold"));
        let ok = ReplicaEventsConfig {
            kill_every_secs: Some(59),
            kill_seed: Some(7),
            ..ReplicaEventsConfig::default()
        };
        ok.check(shape(3, true)).expect("one kill at 59 s");
    }

    #[test]
    fn a_replica_event_after_the_revocation_is_warned_about() {
        let cfg = ReplicaEventsConfig {
            kill_every_secs: Some(30),
            stop_at_secs: Some(75),
            ..ReplicaEventsConfig::default()
        };
        let w = cfg.after_revocation(Some(140), 180).expect("kill at 150");
        assert!(w.contains("at 150 s"), "{w}");
        assert_eq!(cfg.after_revocation(Some(160), 180), None);
        assert_eq!(cfg.after_revocation(None, 180), None);
        let w = cfg.after_revocation(Some(70), 180).expect("stop at 75");
        assert!(w.contains("at 75 s"), "{w}");
    }

    #[test]
    fn urls_and_extra_arguments_are_read() {
        assert!(is_postgres_url("postgres://u@h:5432/db"));
        assert!(is_postgres_url("postgresql://h/db"));
        assert!(!is_postgres_url("sqlite:///tmp/x.db"));
        let args: Vec<String> = [
            "--lease-ttl-secs=10",
            "--enroll-rate-per-sec",
            "50",
            "--lease-ttl-secs",
            "12",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(arg_value(&args, "--lease-ttl-secs").as_deref(), Some("12"));
        assert_eq!(
            arg_value(&args, "--enroll-rate-per-sec").as_deref(),
            Some("50")
        );
        assert_eq!(arg_value(&args, "--lease-ttl"), None);
    }
}
