//! The policy rules at start.
//!
//! - `--policy FILE` is read and checked before the database is opened: a
//!   file that does not pass stops the start with every problem listed and
//!   nothing applied. Once the database is open the file is applied when
//!   its text is new to the database: not the version in force, and not a
//!   version that was in force and has been replaced since (that file is
//!   older than the database's policy: a replica restarted with it, or an
//!   old pod during a rolling update, must not undo a later `policy apply`
//!   or a newer ConfigMap; logged and counted as `superseded`). A file kept
//!   in git or a ConfigMap is the source of truth whenever it changes; to
//!   go back to an earlier text on purpose, `policy apply` it.
//! - `--policy-allow-all` applies the built-in allow-all policy when the
//!   database holds no policy yet; a policy applied before stays (so a unit
//!   file keeping the flag never undoes a policy applied since).
//! - Without either: a database with no policy and no enrolled node (a
//!   fresh one) enforces deny-all and says so; a database with enrolled
//!   nodes and no policy (a mesh from before policies) refuses to start
//!   until the operator chooses, because deny-all would cut every call of
//!   a running mesh.

use std::path::PathBuf;

use agentmesh_policy::{ALLOW_ALL, Policy, PolicyError};

use super::{Origin, epoch_hex, problems_at};
use crate::{config::Config, signed_policy::PolicyInForce, state::State, store::StoreError};

/// What the start-up flags ask for.
#[derive(Debug, Clone)]
pub enum StartPolicy {
    /// No flag: keep what the database holds (deny-all when fresh).
    Keep,
    /// `--policy-allow-all`: allow-all when the database holds no policy.
    AllowAllIfNone,
    /// `--policy FILE`, read and checked.
    File {
        /// The file.
        path: PathBuf,
        /// Its text.
        text: String,
    },
}

/// Why the policy stopped the start.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStartError {
    /// `--policy FILE` could not be read.
    #[error("--policy {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// `--policy FILE` did not pass its checks; nothing was applied.
    #[error(
        "--policy {path}: the policy is refused ({n} problem{s}); nothing was applied:\n{problems}",
        n = errors.problems.len(),
        s = if errors.problems.len() == 1 { "" } else { "s" }
    )]
    Refused {
        /// The file.
        path: String,
        /// The problems, `FILE:LINE:COLUMN: message` a line.
        problems: String,
        /// The problems.
        errors: PolicyError,
    },
    /// The database has enrolled nodes and no policy, and no flag chose one.
    #[error(
        "this database has {nodes} enrolled node(s) and no policy: with none, every call would be \
         denied and the running mesh would stop working. Choose one and start again: \
         --policy FILE (the policy to enforce; `agentmesh-control-plane policy check FILE` \
         checks it first), or --policy-allow-all (every member may provide and call every \
         service, as before policies existed; apply a real policy later with \
         `agentmesh-control-plane policy apply FILE`)"
    )]
    Undecided {
        /// Enrolled nodes.
        nodes: i64,
    },
    /// The version in force in the database does not pass this binary's checks.
    #[error(
        "policy version {version} in the database does not pass this binary's checks \
         (applied by a newer binary?): {errors}"
    )]
    Unreadable {
        /// The version.
        version: u64,
        /// Why.
        errors: PolicyError,
    },
    /// Storage failed.
    #[error("database: {0}")]
    Store(#[from] StoreError),
}

impl StartPolicy {
    /// Reads and checks what the flags name (before the database is opened,
    /// so a bad file changes nothing).
    pub async fn read(config: &Config) -> Result<Self, PolicyStartError> {
        if let Some(path) = &config.policy {
            let shown = path.display().to_string();
            let text =
                tokio::fs::read_to_string(path)
                    .await
                    .map_err(|source| PolicyStartError::Read {
                        path: shown.clone(),
                        source,
                    })?;
            if let Err(errors) = Policy::parse(&text) {
                return Err(PolicyStartError::Refused {
                    problems: problems_at(&shown, &errors),
                    path: shown,
                    errors,
                });
            }
            return Ok(Self::File {
                path: path.clone(),
                text,
            });
        }
        Ok(if config.policy_allow_all {
            Self::AllowAllIfNone
        } else {
            Self::Keep
        })
    }
}

impl State {
    /// Loads the policy in force from the database and applies what the
    /// start-up flags ask for; logs which policy is in force.
    pub async fn start_policy(&self, start: StartPolicy) -> Result<(), PolicyStartError> {
        let head = self.db.run(self.db.store().policy_head()).await?;
        let held = match head.version {
            None => PolicyInForce::none(head.epoch),
            Some(v) => {
                let row = self
                    .db
                    .run(self.db.store().policy(v))
                    .await?
                    .ok_or_else(|| {
                        StoreError::Query(format!("policy version {v} vanished while starting"))
                    })?;
                PolicyInForce::from_row(head.epoch, &row)
                    .map_err(|errors| PolicyStartError::Unreadable { version: v, errors })?
            }
        };
        self.install_policy(held);
        let apply = |text: &str, by: &str, from: String| {
            let origin = Origin {
                by: by.to_string(),
                from,
            };
            let text = text.to_string();
            async move {
                self.apply_policy_unless_replaced(&text, origin)
                    .await
                    .map_err(|e| match e {
                        super::ApplyError::Store(s) => PolicyStartError::Store(s),
                        // Checked by `StartPolicy::read`; this binary's checks do not change.
                        super::ApplyError::Refused(errors) => PolicyStartError::Refused {
                            path: String::new(),
                            problems: errors.to_string(),
                            errors,
                        },
                    })
            }
        };
        match start {
            StartPolicy::File { path, text } => {
                apply(&text, "start-up (--policy)", path.display().to_string()).await?;
            }
            StartPolicy::AllowAllIfNone if head.version.is_none() => {
                apply(
                    ALLOW_ALL,
                    "start-up (--policy-allow-all)",
                    "built-in".into(),
                )
                .await?;
                tracing::warn!(
                    "applied the built-in allow-all policy (--policy-allow-all): every member may \
                     provide and call every service; apply a real policy with \
                     `agentmesh-control-plane policy apply FILE`"
                );
            }
            StartPolicy::AllowAllIfNone => {
                tracing::info!(
                    "--policy-allow-all changes nothing: this database holds a policy already"
                );
            }
            StartPolicy::Keep if head.version.is_none() => {
                let nodes = self
                    .db
                    .run(self.db.store().counts())
                    .await?
                    .into_iter()
                    .find(|(t, _)| t == "nodes")
                    .map_or(0, |(_, n)| n);
                if nodes > 0 {
                    return Err(PolicyStartError::Undecided { nodes });
                }
            }
            StartPolicy::Keep => {}
        }
        let p = self.policy_in_force();
        self.metrics.set_policy_version(p.version);
        if p.is_none() {
            tracing::warn!(
                epoch = %epoch_hex(p.epoch),
                "no policy applied: every call between members is DENIED until one is \
                 (`agentmesh-control-plane policy apply FILE`, or start with --policy FILE or \
                 --policy-allow-all)"
            );
        } else {
            let s = p.summary();
            tracing::info!(
                version = p.version,
                epoch = %epoch_hex(p.epoch),
                allow_all = p.is_allow_all(),
                groups = s.groups,
                owners = s.owners,
                grants = s.grants,
                tests = s.tests,
                applied_at = p.applied_at,
                applied_by = %p.applied_by,
                "policy in force"
            );
        }
        Ok(())
    }
}
