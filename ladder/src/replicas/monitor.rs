//! What the ladder watches beside the fleet while the mesh runs: the
//! routers' leases ([`super::leases`]), the PostgreSQL connections in use
//! against `max_connections`, and the signing keys in the database at the
//! start and the end. A task of its own polls the routers and the database
//! (each read with a deadline; it never blocks the runtime), from the
//! mesh's start until [`Monitor::finish`]; dropping the monitor stops it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::choice::scheduled_rotations;
use super::leases::{LeaseRecord, LeaseTracker, lease_counters};
use crate::postgres::psql::Psql;
use crate::prom::Metrics;

/// Period of the routers' lease polls.
pub const LEASE_POLL: Duration = Duration::from_secs(2);
/// Period of the PostgreSQL connection samples.
pub const PG_POLL: Duration = Duration::from_secs(5);
/// Deadline of one router's `/metrics` read.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Client connections in use (the sampler's own left out), the limit,
/// and the stored signing-key rotation deadline.
const CONNECTIONS_SQL: &str = "SELECT (SELECT count(*) FROM pg_stat_activity \
     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()), \
     current_setting('max_connections')::bigint, \
     (SELECT max(next_rotation_at) FROM rotation_state)";

/// What to watch.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Every router's name and `/metrics` address.
    pub routers: Vec<(String, SocketAddr)>,
    /// The control plane's lease TTL.
    pub lease_ttl: Duration,
    /// The control plane's PostgreSQL database, if it has one.
    pub psql: Option<Psql>,
}

/// PostgreSQL connections in use over the run.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PgConnectionsRecord {
    /// The server's `max_connections`.
    pub max_connections: Option<u64>,
    /// Most client connections in use at one sample.
    pub peak: Option<u64>,
    /// Client connections in use at the last sample.
    pub last: Option<u64>,
    /// Samples taken (every [`PG_POLL`]).
    pub samples: u64,
    /// Samples that failed.
    pub errors: u64,
    /// The last failure's message.
    pub last_error: Option<String>,
}

impl PgConnectionsRecord {
    fn add(&mut self, reading: &crate::Result<Vec<Option<i64>>>) {
        match reading {
            Ok(v) => {
                let n = v.first().copied().flatten().map(|n| n.max(0) as u64);
                self.samples += 1;
                self.last = n;
                self.peak = self.peak.max(n);
                if let Some(max) = v.get(1).copied().flatten() {
                    self.max_connections = Some(max.max(0) as u64);
                }
            }
            Err(e) => {
                self.errors += 1;
                self.last_error = Some(e.to_string());
            }
        }
    }
}

/// Signing keys in the database over the run, against the rotations due.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct SigningKeysRecord {
    /// Rows of `signing_keys` when the mesh was up.
    pub at_start: Option<u64>,
    /// Rows at the end.
    pub at_end: Option<u64>,
    /// Keys created during the run (`created_at` at or after the start).
    pub created: Option<u64>,
    /// Admin rotations the ladder asked for (`--rotate-key-at`).
    pub admin_rotations: u64,
    /// Scheduled rotation deadlines that came and were replaced by the
    /// next during the run (from the stored deadline, read at every
    /// connection sample).
    pub scheduled_rotations: u64,
    /// Rotations due: the admin ones and the scheduled ones.
    pub rotations_due: u64,
    /// Whether exactly one key was created per rotation due.
    pub one_per_rotation: Option<bool>,
    /// The stored rotation deadline at the start and the end, Unix seconds.
    pub next_rotation_at_start: Option<i64>,
    /// See `next_rotation_at_start`.
    pub next_rotation_at_end: Option<i64>,
    /// Why a reading failed, if one did.
    pub error: Option<String>,
}

/// What the monitor hands to the report.
#[derive(Debug, Clone, Default)]
pub struct Watched {
    /// The routers' leases.
    pub leases: LeaseRecord,
    /// PostgreSQL's connections (a PostgreSQL store only).
    pub postgres_connections: Option<PgConnectionsRecord>,
    /// The signing keys (a PostgreSQL store only).
    pub signing_keys: Option<SigningKeysRecord>,
}

/// The polls' state, shared with the task.
struct State {
    leases: LeaseTracker,
    pg: PgConnectionsRecord,
    /// The stored rotation deadline at each reading: (Unix secs, deadline).
    deadlines: Vec<(i64, Option<i64>)>,
}

impl State {
    /// Keeps a reading's rotation deadline (column `col`).
    fn deadline(&mut self, at: i64, reading: &crate::Result<Vec<Option<i64>>>, col: usize) {
        if let Ok(v) = reading {
            self.deadlines.push((at, v.get(col).copied().flatten()));
        }
    }
}

/// A running monitor; see the module docs.
pub struct Monitor {
    cancel: CancellationToken,
    state: Arc<Mutex<State>>,
    psql: Option<Psql>,
    started_unix: i64,
    keys_at_start: Option<crate::Result<Vec<Option<i64>>>>,
}

impl Monitor {
    /// Reads the signing keys and starts polling.
    pub async fn start(cfg: MonitorConfig) -> Self {
        let started_unix = agentmesh_proto::unix_now();
        let keys_at_start = match &cfg.psql {
            Some(p) => Some(p.numbers(&keys_sql(started_unix)).await),
            None => None,
        };
        let mut state = State {
            leases: LeaseTracker::new(cfg.lease_ttl, LEASE_POLL),
            pg: PgConnectionsRecord::default(),
            deadlines: Vec::new(),
        };
        if let Some(r) = &keys_at_start {
            state.deadline(started_unix, r, 2);
        }
        let state = Arc::new(Mutex::new(state));
        let cancel = CancellationToken::new();
        tokio::spawn(poll_leases(cfg.routers, state.clone(), cancel.clone()));
        if let Some(p) = &cfg.psql {
            tokio::spawn(poll_connections(p.clone(), state.clone(), cancel.clone()));
        }
        Self {
            cancel,
            state,
            psql: cfg.psql,
            started_unix,
            keys_at_start,
        }
    }

    /// Stops polling and reads the keys again; `admin_rotations` are the
    /// Unix times of the ladder's RotateKeyNow calls.
    pub async fn finish(self, admin_rotations: &[i64]) -> Watched {
        self.cancel.cancel();
        let lock = || {
            self.state
                .lock()
                .expect("monitor state lock is never poisoned")
        };
        let (Some(psql), Some(start)) = (&self.psql, &self.keys_at_start) else {
            return Watched {
                leases: lock().leases.record(),
                ..Watched::default()
            };
        };
        let end_unix = agentmesh_proto::unix_now();
        let end = psql.numbers(&keys_sql(self.started_unix)).await;
        let (leases, pg, scheduled) = {
            let mut s = lock();
            s.deadline(end_unix, &end, 2);
            let scheduled = scheduled_rotations(&s.deadlines, admin_rotations);
            (s.leases.record(), s.pg.clone(), scheduled)
        };
        let mut watched = Watched {
            leases,
            postgres_connections: Some(pg),
            ..Watched::default()
        };
        let mut keys = SigningKeysRecord {
            admin_rotations: admin_rotations.len() as u64,
            ..SigningKeysRecord::default()
        };
        for r in [start, &end] {
            if let Err(e) = r {
                keys.error = Some(e.to_string());
            }
        }
        let col = |r: &crate::Result<Vec<Option<i64>>>, i: usize| {
            r.as_ref().ok().and_then(|v| v.get(i).copied().flatten())
        };
        keys.at_start = col(start, 0).map(|n| n as u64);
        keys.at_end = col(&end, 0).map(|n| n as u64);
        keys.created = col(&end, 1).map(|n| n as u64);
        keys.next_rotation_at_start = col(start, 2);
        keys.next_rotation_at_end = col(&end, 2);
        keys.scheduled_rotations = scheduled;
        keys.rotations_due = keys.admin_rotations + scheduled;
        keys.one_per_rotation = keys.created.map(|c| c == keys.rotations_due);
        watched.signing_keys = Some(keys);
        watched
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Rows of `signing_keys`, those created at or after `since`, and the
/// stored rotation deadline.
fn keys_sql(since: i64) -> String {
    format!(
        "SELECT count(*), count(*) FILTER (WHERE created_at >= {since}), \
         (SELECT max(next_rotation_at) FROM rotation_state) FROM signing_keys"
    )
}

/// Polls the routers every [`LEASE_POLL`] until `cancel`.
async fn poll_leases(
    routers: Vec<(String, SocketAddr)>,
    state: Arc<Mutex<State>>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(LEASE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let reads = routers
            .iter()
            .map(|(name, addr)| async move { (name, read_leases(*addr).await) });
        let reads = futures::future::join_all(reads).await;
        let now = std::time::Instant::now();
        let mut s = state.lock().expect("monitor state lock is never poisoned");
        for (name, counters) in reads {
            s.leases.observe(name, now, counters);
        }
    }
}

/// Samples the database's connections every [`PG_POLL`] until `cancel`
/// (a task of its own: a slow database never delays the lease polls).
async fn poll_connections(psql: Psql, state: Arc<Mutex<State>>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(PG_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let reading = tokio::select! {
            () = cancel.cancelled() => return,
            r = psql.numbers(CONNECTIONS_SQL) => r,
        };
        let mut s = state.lock().expect("monitor state lock is never poisoned");
        s.pg.add(&reading);
        s.deadline(agentmesh_proto::unix_now(), &reading, 2);
    }
}

/// A router's lease counters, None when it did not answer.
async fn read_leases(addr: SocketAddr) -> Option<(f64, f64)> {
    let page = crate::http::get(addr, "/metrics", SCRAPE_TIMEOUT)
        .await
        .ok()?;
    (page.status == 200)
        .then(|| lease_counters(&Metrics::parse(&page.body)))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_samples_keep_the_peak_the_last_and_the_limit() {
        let mut r = PgConnectionsRecord::default();
        r.add(&Ok(vec![Some(12), Some(100)]));
        r.add(&Ok(vec![Some(30), Some(100)]));
        r.add(&Err(crate::LadderError::Process("psql failed".into())));
        r.add(&Ok(vec![Some(9), Some(100)]));
        assert_eq!(
            (r.peak, r.last, r.max_connections, r.samples, r.errors),
            (Some(30), Some(9), Some(100), 3, 1)
        );
        assert_eq!(r.last_error.as_deref(), Some("psql failed"));
    }
}
