//! The loop that keeps the policy held current: every
//! `--policy-check-interval-ms` it reads the version in force from the
//! database (another process on the same database may have applied one)
//! and checks that the signed copies (the policy's and the revocation
//! list's) were made with the key that signs now (after a rotation they
//! are signed again and announced, so routers holding only the new key
//! verify them). Errors are logged and the loop goes on.

use std::{sync::Arc, time::Duration};

use agentmesh_proto::unix_now;
use tokio::sync::watch;

use crate::state::State;

impl State {
    /// One check: takes up another process's version; re-signs after a key
    /// change. Returns whether anything changed.
    pub async fn check_policy_once(&self) -> Result<bool, crate::store::StoreError> {
        let mut changed = self.refresh_policy().await?;
        let now = unix_now();
        if let Some(signer) = self.keys.signer(now) {
            let held = self.policy_in_force();
            let made_with = held.signed_with();
            if made_with.is_some_and(|k| k != signer.key_id) {
                let _ = held.signed(&signer, now);
                tracing::info!(
                    version = held.version,
                    key_id = %signer.key_id,
                    "policy signed again with the new signing key"
                );
                self.notify_directory_changed();
                changed = true;
            }
            // The list is signed again by whoever reads it next (the watch
            // publisher, woken here, or a directory read).
            if self
                .revocations
                .signed_with()
                .is_some_and(|k| k != signer.key_id)
            {
                tracing::info!(key_id = %signer.key_id, "revocation list to be signed again with the new signing key");
                self.notify_directory_changed();
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// Spawns [`run_policy_check`] as the supervised task `policy_check`.
pub fn spawn(state: &Arc<State>, tasks: &mut crate::supervisor::Tasks) {
    let (s, stop) = (state.clone(), tasks.stop_signal());
    tasks.spawn("policy_check", async move {
        run_policy_check(s, stop).await;
        Ok(())
    });
}

/// Runs [`State::check_policy_once`] every `--policy-check-interval-ms`
/// until `stop` turns true.
pub async fn run_policy_check(state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(state.config.policy_check_interval_ms.max(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = state.check_policy_once().await {
            tracing::warn!(error = %e, "policy check failed; retrying next interval");
        }
    }
}
