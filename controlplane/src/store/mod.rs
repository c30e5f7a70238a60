//! Storage behind a trait, so PostgreSQL can follow SQLite.
//!
//! Every method is synchronous and may block: callers on the async runtime go
//! through [`Db`], which runs them on the blocking pool with a bounded number
//! in flight and one deadline (`--db-wait-timeout-secs`) on the whole wait:
//! for a slot, for a connection, and for SQLite's lock on the file.

mod migrations;
mod pool;
mod reap;
mod sqlite;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

pub use sqlite::{DEFAULT_READ_CONNECTIONS, SqliteStore};

use crate::metrics::Metrics;

/// Which wait for the database ran out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A slot among `--db-max-inflight`.
    Slot,
    /// The one writer connection (held by another operation).
    Writer,
    /// A read-only connection (all `--db-read-connections` in use).
    Reader,
    /// SQLite's lock on the file, held by another connection or process.
    FileLock,
}

impl Wait {
    /// Every wait, to pre-create metric labels.
    pub const ALL: [Wait; 4] = [Wait::Slot, Wait::Writer, Wait::Reader, Wait::FileLock];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Wait::Slot => "slot",
            Wait::Writer => "writer",
            Wait::Reader => "reader",
            Wait::FileLock => "file_lock",
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wait::Slot => "no free slot (--db-max-inflight operations in flight)",
            Wait::Writer => "the writer connection is held by another operation",
            Wait::Reader => "every read connection is in use",
            Wait::FileLock => "the database file is locked by another connection",
        })
    }
}

/// Why storage failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database said no.
    #[error("database: {0}")]
    Sqlite(rusqlite::Error),
    /// Opening or preparing the file failed.
    #[error("database file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A stored value does not parse (labels JSON, key bytes).
    #[error("corrupt row in {table}: {what}")]
    Corrupt {
        /// Table.
        table: &'static str,
        /// What did not parse.
        what: String,
    },
    /// The wait for the database passed its deadline; the caller should retry.
    #[error("database busy within --db-wait-timeout-secs: {0}")]
    Busy(Wait),
    /// The blocking task died.
    #[error("database task failed: {0}")]
    Task(String),
}

impl From<rusqlite::Error> for StoreError {
    /// `SQLITE_BUSY` means the busy handler gave up, and it is given only
    /// what is left of the deadline: that is a timeout like the others.
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            Self::Busy(Wait::FileLock)
        } else {
            Self::Sqlite(e)
        }
    }
}

/// A token as stored (its secret is not: only its SHA-256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Public id of the token.
    pub token_id: String,
    /// `TokenKind` as i32.
    pub kind: i32,
    /// `Role` as i32.
    pub role: i32,
    /// Labels members of this token get.
    pub labels: BTreeMap<String, String>,
    /// Enrollments it allows.
    pub max_uses: u32,
    /// Enrollments made.
    pub uses: u32,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds.
    pub expires_at: i64,
}

/// An enrolled node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Node id (stable across re-enrollment and refresh).
    pub node_id: String,
    /// PeerId bytes.
    pub peer_id: Vec<u8>,
    /// `Role` as i32, from the token.
    pub role: i32,
    /// `TokenKind` as i32, from the token.
    pub token_kind: i32,
    /// Token it enrolled with.
    pub token_id: String,
    /// Labels from the token.
    pub labels: BTreeMap<String, String>,
    /// Unix seconds.
    pub enrolled_at: i64,
    /// Unix seconds (never zero: enrollment counts as seen).
    pub last_seen: i64,
    /// Expiry of the last credential issued, Unix seconds.
    pub cred_expires_at: i64,
    /// Revoked by an admin.
    pub revoked: bool,
}

/// A control-plane signing key (secret included: keys at rest live in the DB file, 0600).
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeyRow {
    /// Key id.
    pub key_id: String,
    /// libp2p ed25519 keypair bytes (64).
    pub secret: Vec<u8>,
    /// Raw 32-byte public key.
    pub public: Vec<u8>,
    /// Signs from this instant, Unix seconds.
    pub active_from: i64,
    /// Verifies until this instant, Unix seconds (0 = no end yet).
    pub verify_until: i64,
}

impl std::fmt::Debug for SigningKeyRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyRow")
            .field("key_id", &self.key_id)
            .field("active_from", &self.active_from)
            .field("verify_until", &self.verify_until)
            .finish_non_exhaustive()
    }
}

/// A router's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// PeerId bytes.
    pub peer_id: Vec<u8>,
    /// The router's node id.
    pub node_id: String,
    /// Multiaddrs.
    pub addrs: Vec<String>,
    /// Labels (a subset of its credential's).
    pub labels: BTreeMap<String, String>,
    /// Attached members.
    pub attached: u32,
    /// Transit connections.
    pub transit: u32,
    /// High watermark.
    pub high: u32,
    /// Low watermark.
    pub low: u32,
    /// Draining.
    pub draining: bool,
    /// Unix seconds.
    pub expires_at: i64,
}

/// A revocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationRow {
    /// PeerId bytes.
    pub peer_id: Vec<u8>,
    /// Enforced until, Unix seconds.
    pub until: i64,
    /// Why.
    pub reason: String,
}

/// Why an enrollment was refused by what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnrollRefusal {
    /// No token with that digest.
    UnknownToken,
    /// Token past its expiry.
    TokenExpired,
    /// Every use spent.
    TokenUsedUp,
    /// The key belongs to a revoked node.
    Revoked,
}

/// Why a refresh or lease was refused by what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRefusal {
    /// No such node (never enrolled, or reaped).
    UnknownNode,
    /// Revoked.
    Revoked,
}

/// What a successful enrollment did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrolled {
    /// The node, as stored now.
    pub node: NodeRow,
    /// True when the key was already enrolled: no token use was spent.
    pub re_enrolled: bool,
}

/// Retention settings for one reaper pass, all in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapPolicy {
    /// Nodes not seen for this long go.
    pub node_retention_secs: i64,
    /// Ephemeral members not seen for this long go.
    pub ephemeral_retention_secs: i64,
    /// Enrollment request records older than this go.
    pub enrollment_retention_secs: i64,
    /// Used-up tokens go this long after their last use.
    pub used_token_retention_secs: i64,
}

/// Rows deleted in one pass: (table, reason, count).
pub type Deleted = Vec<(&'static str, &'static str, u64)>;

/// Tables counted in `agentmesh_control_plane_storage_rows`.
pub const TABLES: &[&str] = &[
    "nodes",
    "enrollment_requests",
    "tokens",
    "router_leases",
    "signing_keys",
    "rotation_state",
    "revocations",
];

/// Every (table, reason) pair a reaper can report, in the order a reap
/// batch deletes them (ephemeral members before the lapsed-node rule, so they
/// are counted as `ephemeral_lapsed`). Also pre-creates the metric labels.
pub const DELETE_REASONS: &[(&str, &str)] = &[
    ("nodes", "ephemeral_lapsed"),
    ("nodes", "lapsed"),
    ("enrollment_requests", "expired"),
    ("tokens", "expired"),
    ("tokens", "used_up"),
    ("router_leases", "expired"),
    ("revocations", "expired"),
    ("signing_keys", "grace_ended"),
];

/// The storage interface.
pub trait Store: Send + Sync + 'static {
    /// Cheap liveness check (`SELECT 1`).
    fn ping(&self) -> Result<(), StoreError>;
    /// Stores a token by its digest.
    fn create_token(&self, digest: &[u8; 32], row: &TokenRow) -> Result<(), StoreError>;
    /// One transaction: checks the token, re-enrolls a known key without
    /// spending a use or spends one for a new node, records the request.
    #[allow(clippy::too_many_arguments)]
    fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError>;
    /// Marks a node seen and records its new credential expiry.
    fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError>;
    /// Upserts a router lease.
    fn upsert_lease(&self, lease: &LeaseRow) -> Result<(), StoreError>;
    /// Live leases and active revocations at `now`.
    fn directory(&self, now: i64) -> Result<(Vec<LeaseRow>, Vec<RevocationRow>), StoreError>;
    /// Revokes a node until its last credential expires (or `default_until`,
    /// whichever is later); returns the instant.
    fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError>;
    /// Every signing key.
    fn keys(&self) -> Result<Vec<SigningKeyRow>, StoreError>;
    /// If there are no keys yet, stores `first` and the first rotation
    /// deadline. Returns whether it did.
    fn init_keys(&self, first: &SigningKeyRow, next_rotation_at: i64) -> Result<bool, StoreError>;
    /// The stored rotation deadline.
    fn next_rotation_at(&self) -> Result<Option<i64>, StoreError>;
    /// Claims a rotation with a conditional update of the deadline (from
    /// `expected` to `next`; `expected = None` forces it). When claimed, in
    /// the same transaction: every key without an end verifies until
    /// `retire_until`, and `new_key` is stored. Returns whether claimed.
    fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError>;
    /// One reaper batch, one transaction: deletes at most `max_rows` stale
    /// rows, reason after reason in [`DELETE_REASONS`] order; returns a count for
    /// every reason in that order. Fewer than `max_rows` deleted means
    /// nothing stale is left at `now`.
    fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError>;
    /// Row counts per table.
    fn counts(&self) -> Result<Vec<(String, i64)>, StoreError>;
    /// A consistent copy of the database at `to` while serving.
    fn backup_to(&self, to: &Path) -> Result<(), StoreError>;
}

/// Async access to a [`Store`]: blocking work on the blocking pool, at most
/// `max_inflight` operations at once, and one deadline, `wait` from the
/// call, on everything the operation waits for before it runs (a slot, a
/// connection, the file lock). A wait that runs out is [`StoreError::Busy`],
/// counted in `db_wait_timeouts_total{wait}`.
#[derive(Clone)]
pub struct Db {
    store: Arc<dyn Store>,
    slots: Arc<tokio::sync::Semaphore>,
    wait: Duration,
    metrics: Metrics,
}

impl Db {
    /// Wraps a store.
    pub fn new(
        store: Arc<dyn Store>,
        max_inflight: usize,
        wait: Duration,
        metrics: Metrics,
    ) -> Self {
        Self {
            store,
            slots: Arc::new(tokio::sync::Semaphore::new(max_inflight.max(1))),
            wait,
            metrics,
        }
    }

    /// Runs `f` on the blocking pool.
    pub async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<R, StoreError> + Send + 'static,
    {
        let r = self.run_inner(f).await;
        if let Err(StoreError::Busy(wait)) = &r {
            self.metrics.db_wait_timeout(*wait);
        }
        r
    }

    async fn run_inner<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<R, StoreError> + Send + 'static,
    {
        let started = tokio::time::Instant::now();
        let permit = tokio::time::timeout(self.wait, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| StoreError::Busy(Wait::Slot))?
            .map_err(|_| StoreError::Task("database closed".into()))?;
        // The blocking side keeps what is left, on the clock it can wait on.
        let left = self.wait.saturating_sub(started.elapsed());
        let deadline = std::time::Instant::now() + left;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            pool::with_deadline(deadline, || f(&*store))
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

/// Opens the SQLite store at `path` (creating it 0600, WAL, migrated) with
/// `read_connections` read-only connections beside the writer.
pub fn open_sqlite(path: &Path, read_connections: usize) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(SqliteStore::open_with(path, read_connections)?))
}
