//! The one writer of the current watch event.

use std::{sync::Arc, time::Duration};

use agentmesh_proto::{pb::controlplane::WatchEvent, unix_now};
use tokio::sync::watch;

use crate::{state::State, status::ServiceError};

impl State {
    /// Builds the event from what is in force now and publishes it if it
    /// differs from the current one. Returns whether it did.
    pub async fn publish_watch_once(&self) -> Result<bool, ServiceError> {
        let now = unix_now();
        let policy = self.signed_policy(now)?;
        // The same copy while the generation and the key stay, so an
        // unchanged list compares equal.
        let revocations = self.signed_revocations(now).await?;
        Ok(self.watch.publish(WatchEvent {
            policy: Some(policy),
            revocations: Some(revocations),
            keys: Some(self.keys.key_set(now)),
            generated_at_unix_secs: now,
        }))
    }
}

/// Spawns [`run_watch_publisher`] as the supervised task `watch_publisher`.
pub fn spawn(state: &Arc<State>, tasks: &mut crate::supervisor::Tasks) {
    let (s, stop) = (state.clone(), tasks.stop_signal());
    tasks.spawn("watch_publisher", async move {
        run_watch_publisher(s, stop).await;
        Ok(())
    });
}

/// Rebuilds the watch event at start, on every [`super::WatchHub::changed`]
/// and every `--policy-check-interval-ms` while a router watches; on `stop`
/// ends every stream. Errors are logged and the next change or tick
/// retries.
pub async fn run_watch_publisher(state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(state.config.policy_check_interval_ms.max(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rebuild = true;
    loop {
        if rebuild && let Err(e) = state.publish_watch_once().await {
            tracing::warn!(error = %e, "watch event not rebuilt; retrying at the next change or tick");
        }
        tokio::select! {
            biased;
            _ = stop.changed() => {
                state.watch.stop();
                return;
            }
            _ = state.watch.dirty.notified() => rebuild = true,
            _ = tick.tick() => rebuild = state.watch.watchers() > 0,
        }
    }
}
