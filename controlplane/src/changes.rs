//! Other replicas' changes, taken up as they commit instead of at the next
//! poll: on PostgreSQL every write to the keys, policies, revocations and
//! router leases notifies `agentmesh_changes` (triggers, so whichever
//! replica or binary wrote it), and this task turns each notification into
//! the same re-read the polls do (keys reloaded, the policy refreshed, the
//! watch event and the directory rebuilt).
//!
//! Notifications are a fast path, never the only one: they are lost while
//! the listener reconnects, so every (re)connection starts with a full
//! re-read, and the polls (`--policy-check-interval-ms`,
//! `--key-check-interval-secs`) stay as the backstop. Reconnects back off
//! with jitter from 1 s to 30 s. On SQLite (one process per file) the task
//! idles until stop.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

use crate::{
    state::State,
    store::{Change, StoreError},
    supervisor::Tasks,
};

const KEYS: u8 = 1;
const POLICY: u8 = 2;
const DIRECTORY: u8 = 4;
const ALL: u8 = KEYS | POLICY | DIRECTORY;

fn bits(c: Change) -> u8 {
    match c {
        Change::Keys => KEYS,
        Change::Policy => POLICY,
        Change::Revocations | Change::Directory => DIRECTORY,
        Change::All => ALL,
    }
}

/// Takes up what `pending` names.
async fn apply(s: &State, pending: u8) {
    if pending & KEYS != 0 {
        match s.keys.reload(&s.db).await {
            Ok(()) => {
                if let Some(next) = s.keys.next_rotation_at() {
                    s.metrics.set_next_rotation(next);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "keys not reloaded after a change; the key check retries")
            }
        }
    }
    if pending & POLICY != 0
        && let Err(e) = s.refresh_policy().await
    {
        tracing::warn!(error = %e, "policy not refreshed after a change; the policy check retries");
    }
    if pending & (KEYS | DIRECTORY) != 0 {
        s.notify_directory_changed();
    }
}

/// Spawns the listener as the supervised task `change_feed`.
pub fn spawn(state: &Arc<State>, tasks: &mut Tasks) {
    let (s, mut stop) = (state.clone(), tasks.stop_signal());
    tasks.spawn("change_feed", async move {
        let pending = Arc::new(AtomicU8::new(0));
        let wake = Arc::new(Notify::new());
        let mut backoff = Duration::from_secs(1);
        loop {
            let (p, w, m) = (pending.clone(), wake.clone(), s.metrics.clone());
            let on_change = move |c: Change| {
                m.change_notification(c.kind());
                p.fetch_or(bits(c), Ordering::AcqRel);
                w.notify_one();
            };
            let listen = s.db.store().listen_changes(&on_change);
            tokio::pin!(listen);
            let started = tokio::time::Instant::now();
            let ended = loop {
                tokio::select! {
                    biased;
                    _ = stop.changed() => return Ok(()),
                    r = &mut listen => break r,
                    _ = wake.notified() => {
                        s.metrics.set_change_listener_up(true);
                        apply(&s, pending.swap(0, Ordering::AcqRel)).await;
                    }
                }
            };
            s.metrics.set_change_listener_up(false);
            match ended {
                Err(StoreError::Unsupported(_)) => {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                    return Ok(());
                }
                Err(e) => tracing::warn!(error = %e, retry_in = ?backoff, "change listener lost; the polls carry changes until it is back"),
                Ok(()) => {}
            }
            if started.elapsed() > Duration::from_secs(60) {
                backoff = Duration::from_secs(1);
            }
            let wait = backoff.mul_f64(0.5 + rand::random::<f64>() * 0.5);
            tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    });
}
