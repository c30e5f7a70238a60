//! Storage metrics: rows per table, the reapers' deletions and batches,
//! database waits that ran out, the PostgreSQL pool, the next key rotation.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    DELETE_REASONS, DutyLabel, KindLabel, StateLabel, TABLES, TableLabel, TableReason, Wait,
    WaitLabel,
};

#[derive(Clone)]
pub(super) struct StorageMetrics {
    pub(super) storage_rows: Family<TableLabel, Gauge>,
    pub(super) deleted: Family<TableReason, Counter>,
    pub(super) reap_batches: Counter,
    pub(super) db_wait_timeouts: Family<WaitLabel, Counter>,
    pub(super) db_pool_connections: Family<StateLabel, Gauge>,
    pub(super) next_rotation: Gauge,
    pub(super) duty_held: Family<DutyLabel, Gauge>,
    pub(super) live_replicas: Gauge,
    pub(super) change_notifications: Family<KindLabel, Counter>,
    pub(super) change_listener_up: Gauge,
}

impl StorageMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            storage_rows: Family::default(),
            deleted: Family::default(),
            reap_batches: Counter::default(),
            db_wait_timeouts: Family::default(),
            db_pool_connections: Family::default(),
            next_rotation: Gauge::default(),
            duty_held: Family::default(),
            live_replicas: Gauge::default(),
            change_notifications: Family::default(),
            change_listener_up: Gauge::default(),
        };
        r.register(
            "storage_rows",
            "Rows per table (COUNT per table at each reaper pass)",
            m.storage_rows.clone(),
        );
        r.register(
            "deleted",
            "Rows deleted by the reapers, by table and reason",
            m.deleted.clone(),
        );
        r.register(
            "reap_batches",
            "Reaper transactions, each deleting at most --reap-batch-rows rows",
            m.reap_batches.clone(),
        );
        r.register(
            "db_wait_timeouts",
            "Database operations refused because a wait passed --db-wait-timeout-secs: \
             for a slot (--db-max-inflight), the writer connection, a read connection \
             (--db-read-connections) or the file lock (another connection or process)",
            m.db_wait_timeouts.clone(),
        );
        r.register(
            "db_pool_connections",
            "PostgreSQL pool connections: open, idle, max (--db-pool-connections); 0 on SQLite",
            m.db_pool_connections.clone(),
        );
        r.register(
            "next_key_rotation_timestamp_seconds",
            "Unix time of the next signing-key rotation (stored in the database)",
            m.next_rotation.clone(),
        );
        r.register(
            "duty_held",
            "1 where this replica holds the lease on a duty that runs once per control \
             plane (reaper: deletions and the storage_rows counts), else 0",
            m.duty_held.clone(),
        );
        r.register(
            "live_replicas",
            "Control-plane replicas live on this database as this replica last counted them \
             (a presence renewed every 2 s, lapsing after 6 s); each serves 1/N of the \
             enroll, refresh, lease and unauthenticated budgets and of the failure guard",
            m.live_replicas.clone(),
        );
        r.register(
            "change_notifications",
            "Change notifications from the database (PostgreSQL), by kind: keys, policy, \
             revocations, directory; all: the listener (re)connected and re-read everything",
            m.change_notifications.clone(),
        );
        r.register(
            "change_listener_up",
            "1 while the change listener holds its LISTEN connection (PostgreSQL); 0 on \
             SQLite and while it reconnects (the polls carry changes meanwhile)",
            m.change_listener_up.clone(),
        );
        for kind in crate::store::CHANGE_KINDS {
            let _ = m.change_notifications.get_or_create(&KindLabel {
                kind: (*kind).into(),
            });
        }
        for duty in crate::store::DUTIES {
            let _ = m.duty_held.get_or_create(&DutyLabel {
                duty: (*duty).into(),
            });
        }
        for t in TABLES {
            let _ = m
                .storage_rows
                .get_or_create(&TableLabel { table: (*t).into() });
        }
        for (t, reason) in DELETE_REASONS {
            let _ = m.deleted.get_or_create(&TableReason {
                table: (*t).into(),
                reason: (*reason).into(),
            });
        }
        for w in Wait::ALL {
            let _ = m.db_wait_timeouts.get_or_create(&WaitLabel {
                wait: w.as_str().into(),
            });
        }
        for state in ["open", "idle", "max"] {
            let _ = m.db_pool_connections.get_or_create(&StateLabel {
                state: state.into(),
            });
        }
        m
    }
}
