//! The propagation events' flags: the coordinator's (`PropagationConfig`,
//! flattened into the fleet's) and what a worker is told
//! (`PropagationWorkerConfig`, flattened into the worker's).

use std::path::PathBuf;

/// Default calls held open on the grant the policy change removes.
pub const DEFAULT_LIVE_CALLS: u64 = 200;
/// Default: one step member in this many enrolls with the token `--revoke-token-at` revokes.
pub const DEFAULT_REVOKE_EVERY: u64 = 20;

/// The propagation events of the hold (local mode).
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Policy propagation (local mode, during the hold)")]
pub struct PropagationConfig {
    /// Apply a policy without one grant this many seconds into the hold, seconds
    /// (the control plane then starts with that grant instead of allow-all). Default: none.
    #[arg(long = "policy-change-at")]
    pub policy_change_at_secs: Option<u64>,
    /// Calls held open, across the fleet, on the service whose grant the change
    /// removes (each must be closed), calls. Default 200.
    #[arg(long = "policy-live-calls", default_value_t = DEFAULT_LIVE_CALLS)]
    pub live_calls: u64,
    /// Revoke the token a subset of the members enrolled with this many seconds
    /// into the hold, seconds. Default: none.
    #[arg(long = "revoke-token-at")]
    pub revoke_token_at_secs: Option<u64>,
    /// With `--revoke-token-at`: one step member in this many enrolls with the
    /// token that is revoked, members (at least 1). Default 20.
    #[arg(long = "revoke-token-every", default_value_t = DEFAULT_REVOKE_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub revoke_every: u64,
}

impl Default for PropagationConfig {
    fn default() -> Self {
        Self {
            policy_change_at_secs: None,
            live_calls: DEFAULT_LIVE_CALLS,
            revoke_token_at_secs: None,
            revoke_every: DEFAULT_REVOKE_EVERY,
        }
    }
}

impl PropagationConfig {
    /// The flags that need a mesh the ladder started.
    pub fn local_only(&self) -> [(&'static str, Option<u64>); 2] {
        [
            ("--policy-change-at", self.policy_change_at_secs),
            ("--revoke-token-at", self.revoke_token_at_secs),
        ]
    }
}

/// What a worker needs for the propagation events.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct PropagationWorkerConfig {
    /// A second service name providers expose on the echo backend (the
    /// policy change's held calls use it).
    #[arg(long = "expose-also")]
    pub expose_also: Option<String>,
    /// The token of the members `--revoke-token-at` revokes.
    #[arg(long = "revocable-token-file")]
    pub revocable_token_file: Option<PathBuf>,
    /// One step member in this many enrolls with `--revocable-token-file` (0: none).
    #[arg(long = "revocable-every", default_value_t = 0)]
    pub revocable_every: u64,
}

impl PropagationWorkerConfig {
    /// The worker's command-line arguments for this configuration.
    pub fn args(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(s) = &self.expose_also {
            out.extend(["--expose-also".to_string(), s.clone()]);
        }
        if let Some(f) = &self.revocable_token_file {
            out.extend([
                "--revocable-token-file".to_string(),
                f.display().to_string(),
                "--revocable-every".to_string(),
                self.revocable_every.to_string(),
            ]);
        }
        out
    }

    /// Whether member `index` (a step member unless `provider`) enrolls
    /// with the revocable token.
    pub fn revocable(&self, index: u64, provider: bool) -> bool {
        !provider
            && self.revocable_token_file.is_some()
            && self.revocable_every > 0
            && index.is_multiple_of(self.revocable_every)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        w: PropagationWorkerConfig,
    }

    #[test]
    fn worker_args_round_trip_and_pick_step_members_only() {
        let c = PropagationWorkerConfig {
            expose_also: Some("echo-held".into()),
            revocable_token_file: Some("/tmp/r.token".into()),
            revocable_every: 4,
        };
        let mut argv = vec!["w".to_string()];
        argv.extend(c.args());
        assert_eq!(W::parse_from(argv).w, c);
        assert!(c.revocable(8, false));
        assert!(!c.revocable(8, true), "providers never");
        assert!(!c.revocable(9, false));
        assert!(!PropagationWorkerConfig::default().revocable(0, false));
        assert_eq!(W::parse_from(["w"]).w, PropagationWorkerConfig::default());
    }
}
