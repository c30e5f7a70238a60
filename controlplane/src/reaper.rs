//! The reapers (one schedule for every table that grows) and the periodic
//! signing-key check.

use std::{sync::Arc, time::Duration};

use agentmesh_proto::unix_now;
use tokio::sync::watch;

use crate::{
    state::State,
    store::{Deleted, ReapPolicy, StoreError},
};

impl State {
    /// The retention policy from the config.
    pub fn reap_policy(&self) -> ReapPolicy {
        let c = &self.config;
        ReapPolicy {
            node_retention_secs: c.node_retention_secs as i64,
            ephemeral_retention_secs: c.ephemeral_retention_secs as i64,
            enrollment_retention_secs: c.enrollment_retention_secs as i64,
            used_token_retention_secs: c.used_token_retention_secs as i64,
        }
    }

    /// One reaper pass: deletes, counts deletions, then refreshes row counts.
    pub async fn reap_once(&self) -> Result<Deleted, StoreError> {
        let policy = self.reap_policy();
        let now = unix_now();
        let (deleted, counts) = self
            .db
            .run(move |s| Ok((s.reap(now, &policy)?, s.counts()?)))
            .await?;
        for (table, reason, n) in &deleted {
            if *n > 0 {
                self.metrics.deleted(table, reason, *n);
                tracing::info!(table, reason, rows = n, "reaped");
            }
        }
        for (table, rows) in counts {
            self.metrics.set_rows(&table, rows);
        }
        if deleted
            .iter()
            .any(|(t, _, n)| *t == "revocations" && *n > 0)
        {
            self.invalidate_directory();
        }
        Ok(deleted)
    }

    /// One key check: rotates when the stored deadline has passed.
    pub async fn check_keys_once(&self) -> Result<Option<String>, StoreError> {
        let rotated = self.keys.check(&self.db, unix_now()).await?;
        if let Some(next) = self.keys.next_rotation_at() {
            self.metrics.set_next_rotation(next);
        }
        Ok(rotated)
    }
}

/// Runs `f` every `every` until `stop` turns true; errors are logged.
async fn every<F, Fut, T>(
    name: &'static str,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    mut f: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    // spawn() already ran one pass; the first tick is one period away.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = tick.tick() => {
                if let Err(e) = f().await {
                    tracing::warn!(task = name, error = %e, "periodic task failed; will retry next tick");
                }
            }
        }
    }
}

/// The reaper loop.
pub async fn run_reaper(state: Arc<State>, stop: watch::Receiver<bool>) {
    let period = Duration::from_secs(state.config.reap_interval_secs);
    every("reaper", period, stop, || state.reap_once()).await;
}

/// The key-rotation check loop.
pub async fn run_key_check(state: Arc<State>, stop: watch::Receiver<bool>) {
    let period = Duration::from_secs(state.config.key_check_interval_secs);
    every("key_check", period, stop, || state.check_keys_once()).await;
}
