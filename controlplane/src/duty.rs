//! Work that must run once per control plane, not once per replica: the
//! reaper's deletions and row counts. Each replica claims the duty's lease
//! (a row in `duty_leases`, timed by the database's clock) before each
//! pass and does the work only while it holds it; a replica that stops
//! releases it, one that dies lets it lapse.
//!
//! The lease is an optimisation, not the safety: every deletion is a
//! conditional statement that two replicas may run at once (a paused
//! holder that resumes after its lease lapsed deletes nothing twice). What
//! it buys is that deletions and `storage_rows` come from one replica, so
//! the cluster's counters add up and the storage alert reads one series.

use std::time::Duration;

use crate::{metrics::Metrics, store::Db};

/// One replica's lease on one duty.
pub struct Duty {
    name: &'static str,
    holder: String,
    ttl_ms: i64,
    metrics: Metrics,
}

impl Duty {
    /// The lease on `name` for this process, lasting `ttl` past each
    /// claim (three periods of the work: a holder that misses two passes
    /// loses it).
    pub fn new(name: &'static str, ttl: Duration, metrics: Metrics) -> Self {
        Self {
            name,
            holder: replica_id().to_string(),
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            metrics,
        }
    }

    /// Claims or renews the lease; false (logged) when another replica
    /// holds it or the database could not be asked: skipping one pass is
    /// always safe, doing it without the lease only wasteful.
    pub async fn claim(&self, db: &Db) -> bool {
        let held = match db
            .run(db.store().claim_duty(self.name, &self.holder, self.ttl_ms))
            .await
        {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(duty = self.name, error = %e, "could not claim the duty's lease; skipping this pass");
                false
            }
        };
        self.metrics.set_duty_held(self.name, held);
        held
    }

    /// Gives the lease up (on stop), so another replica takes the duty at
    /// its next pass instead of after the lease lapses.
    pub async fn release(&self, db: &Db) {
        if let Err(e) = db
            .run(db.store().release_duty(self.name, &self.holder))
            .await
        {
            tracing::warn!(duty = self.name, error = %e, "could not release the duty's lease; it lapses on its own");
        }
        self.metrics.set_duty_held(self.name, false);
    }

    /// This replica's holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}

/// This process's name among replicas: the host name (a pod's name on
/// Kubernetes), the process id and a random part, so a restarted replica
/// on the same pod is a new holder and never inherits a lease it did not
/// claim.
pub fn replica_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "control-plane".into());
        format!(
            "{host}/{}/{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )
    })
}
