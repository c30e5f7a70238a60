//! The reapers (one schedule for every table that grows) and the periodic
//! signing-key check.

use std::{sync::Arc, time::Duration};

use agentmesh_proto::unix_now;
use tokio::sync::watch;

use crate::{
    duty::Duty,
    state::State,
    store::{DELETE_REASONS, Deleted, REAPER_DUTY, ReapPolicy, StoreError},
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
            policy_retention_secs: c.policy_retention_secs as i64,
            admin_request_retention_secs: c.admin_request_retention_secs as i64,
        }
    }

    /// One reaper pass: deletes in batches, counts deletions, then
    /// refreshes row counts.
    pub async fn reap_once(&self) -> Result<Deleted, StoreError> {
        self.reap_pass(|_| std::future::ready(())).await
    }

    /// One reaper pass, awaiting `between(batches_done)` before each batch
    /// after the first (tests write there: the writer is free between
    /// batches).
    ///
    /// Every batch is its own [`Db::run`](crate::store::Db::run), so it
    /// takes a slot and the writer within its own deadline and gives both
    /// back before the next. Deletions are counted as each batch commits,
    /// so a pass that fails half-way still counts what it deleted. The pass
    /// ends: `now` is fixed, and rows only become stale as time passes, so
    /// each batch but the last deletes `--reap-batch-rows` of a set that
    /// does not grow.
    pub(crate) async fn reap_pass<F, Fut>(&self, mut between: F) -> Result<Deleted, StoreError>
    where
        F: FnMut(u64) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let policy = self.reap_policy();
        let max_rows = self.config.reap_batch_rows.max(1);
        let now = unix_now();
        let mut total: Deleted = DELETE_REASONS.iter().map(|(t, r)| (*t, *r, 0)).collect();
        let mut batches = 0;
        loop {
            if batches > 0 {
                between(batches).await;
            }
            let batch = self
                .db
                .run(self.db.store().reap_batch(now, &policy, max_rows))
                .await?;
            batches += 1;
            self.metrics.reap_batch();
            let mut rows = 0;
            for (table, reason, n) in batch {
                rows += n;
                if let Some(sum) = total
                    .iter_mut()
                    .find(|(t, r, _)| (*t, *r) == (table, reason))
                {
                    sum.2 += n;
                }
                if n > 0 {
                    self.metrics.deleted(table, reason, n);
                }
            }
            if rows < max_rows {
                break;
            }
        }
        for (table, reason, n) in &total {
            if *n > 0 {
                tracing::info!(table, reason, rows = n, batches, "reaped");
            }
        }
        let counts = self.db.run(self.db.store().counts()).await?;
        if let Some(pool) = self.db.store().pool_connections() {
            self.metrics.set_pool(pool);
        }
        for (table, rows) in counts {
            self.metrics.set_rows(&table, rows);
        }
        // Reaped revocations bumped the list's generation: routers take
        // the smaller list now (watch) rather than at the next poll.
        if total
            .iter()
            .any(|(t, _, n)| matches!(*t, "revocations" | "token_revocations") && *n > 0)
        {
            self.notify_directory_changed();
        }
        Ok(total)
    }

    /// One reaper pass if this replica holds the reaper's duty (claimed
    /// or renewed first); `None` where another replica holds it.
    pub async fn reap_if_duty(&self, duty: &Duty) -> Result<Option<Deleted>, StoreError> {
        if !duty.claim(&self.db).await {
            // The pool is this replica's own: its gauges are kept current
            // on every replica, holder or not.
            if let Some(pool) = self.db.store().pool_connections() {
                self.metrics.set_pool(pool);
            }
            return Ok(None);
        }
        self.reap_once().await.map(Some)
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

/// Spawns the reaper (`reaper`) and the key-rotation check (`key_check`)
/// as supervised tasks; their deletions and rotations are counted in
/// [`crate::metrics::Metrics`].
pub fn spawn(
    schedule: &crate::config::ScheduleConfig,
    state: &Arc<State>,
    tasks: &mut crate::supervisor::Tasks,
) {
    let (s, stop, period) = (state.clone(), tasks.stop_signal(), schedule.reap_interval);
    let duty = Duty::new(REAPER_DUTY, period * 3, state.metrics.clone());
    tasks.spawn("reaper", async move {
        every("reaper", period, stop, || s.reap_if_duty(&duty)).await;
        duty.release(&s.db).await;
        Ok(())
    });
    let (s, stop, period) = (
        state.clone(),
        tasks.stop_signal(),
        schedule.key_check_interval,
    );
    tasks.spawn("key_check", async move {
        every("key_check", period, stop, || s.check_keys_once()).await;
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::{
        clock::TokioClock,
        config::Config,
        keys::{Keys, RotationPolicy},
        metrics::Metrics,
        store::{Db, Kek, SqliteStore, TokenRow},
    };

    async fn state(dir: &std::path::Path, batch_rows: u64) -> Arc<State> {
        let path = dir.join("cp.db");
        let config = Config {
            reap_batch_rows: batch_rows,
            ..Config::ephemeral(&path)
        };
        let metrics = Metrics::new(&mut Registry::default());
        let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path, kek))
            .await
            .expect("join")
            .expect("open");
        let db = Db::new(Arc::new(store), 4, Duration::from_secs(1), metrics.clone());
        let policy = RotationPolicy {
            interval_secs: 86_400,
            publish_ahead_secs: 0,
            grace_secs: 7200,
        };
        let keys = Keys::open(&db, policy, unix_now()).await.expect("keys");
        let url = "http://127.0.0.1:1".to_string();
        State::new(config, url, db, keys, metrics, TokioClock::shared(), None)
    }

    #[tokio::test]
    async fn a_pass_deletes_the_whole_backlog_in_batches_and_frees_the_writer_between() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = state(dir.path(), 10).await;
        let file = dir.path().join("cp.db");
        tokio::task::spawn_blocking(move || {
            rusqlite::Connection::open(file)
                .expect("open")
                .execute_batch(
                    "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < 25)
                     INSERT INTO enrollment_requests (source, outcome, at)
                     SELECT 'test', 'enrolled', 1 FROM i;",
                )
                .expect("25 stale rows")
        })
        .await
        .expect("join");
        let mut writes_between = 0;
        let deleted = state
            .reap_pass(|batches_done| {
                let db = state.db.clone();
                writes_between += 1;
                async move {
                    // The writer is free here: a write gets it within its deadline.
                    let row = TokenRow {
                        token_id: format!("between-{batches_done}"),
                        kind: 1,
                        role: 1,
                        labels: BTreeMap::new(),
                        max_uses: 1,
                        uses: 0,
                        created_at: unix_now(),
                        expires_at: unix_now() + 3600,
                    };
                    let digest = [batches_done as u8; 32];
                    db.run(db.store().create_token(&digest, &row))
                        .await
                        .expect("a write between batches");
                }
            })
            .await
            .expect("pass");
        let got = deleted
            .iter()
            .find(|(t, r, _)| (*t, *r) == ("enrollment_requests", "expired"))
            .map(|x| x.2);
        assert_eq!(got, Some(25), "{deleted:?}");
        // ceil(25 / 10) = 3 transactions, so two gaps, each with a write.
        assert_eq!(writes_between, 2);
        let counts = state
            .db
            .run(state.db.store().counts())
            .await
            .expect("counts");
        assert!(counts.contains(&("enrollment_requests".to_string(), 0)));
        assert!(counts.contains(&("tokens".to_string(), 2)), "{counts:?}");
    }
}
