//! Storage behind one async trait, with two backends: SQLite (the embedded
//! default) and PostgreSQL (for a database shared by several processes).
//!
//! Callers go through [`Db`]: at most `--db-max-inflight` operations at once
//! and one deadline (`--db-wait-timeout-secs`) on everything an operation
//! waits for: a slot here, then a connection and a lock inside the backend
//! (SQLite: the connection pools and the file lock, on the blocking pool;
//! PostgreSQL: the connection pool, then `statement_timeout` and
//! `lock_timeout` set to what is left). Every wait that runs out is
//! [`StoreError::Timeout`], whichever backend.
//!
//! Every write two processes could race is safe under concurrent writers:
//! token uses are spent with a guarded update, the first signing key is
//! created under a lock, rotation is claimed by a conditional update, and a
//! router's lease is written in the transaction that checks its node.
//! A policy version is numbered inside the transaction that writes it,
//! under the writer lock (SQLite) or an advisory lock (PostgreSQL), so
//! two processes applying at once never number two policies alike.

#[cfg(test)]
mod admin_once_suite;
mod admin_requests;
#[cfg(test)]
mod admin_suite;
mod columns;
pub mod copy;
mod deadline;
#[cfg(test)]
mod duty_suite;
#[cfg(test)]
mod key_generation_suite;
mod listing;
mod migrations;
mod policies;
#[cfg(test)]
mod policy_suite;
mod pool;
mod postgres;
mod reap;
#[cfg(test)]
mod revocation_list_suite;
mod seal;
mod snapshot;
mod sqlite;
#[cfg(test)]
mod suite;
#[cfg(test)]
mod suite_kit;
pub mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod token_revocation_suite;

use std::{collections::BTreeMap, future::Future, path::Path, sync::Arc, time::Duration};

pub use admin_requests::{AdminRequest, MAX_REQUEST_ID_LEN, PriorRequest, RequestOnce};
pub use deadline::DEFAULT_WAIT;
pub use listing::{MAX_LIST_ROWS, NodeListing, TokenListing};
pub use policies::{AppliedPolicy, NewPolicy, PolicyHead, PolicyRow};
pub use postgres::{DEFAULT_POOL_CONNECTIONS, PgOptions, PostgresStore, Tls};
pub use seal::{KEK_ENV, Kek};
pub use snapshot::Snapshot;
pub use sqlite::{DEFAULT_READ_CONNECTIONS, SqliteStore, backup_file as backup_sqlite_file};

/// Which wait for the database ran out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A slot among `--db-max-inflight`.
    Slot,
    /// SQLite's one writer connection (held by another operation).
    Writer,
    /// A read-only SQLite connection (all `--db-read-connections` in use).
    Reader,
    /// A PostgreSQL connection (all `--db-pool-connections` in use or the
    /// server slow to accept a new one).
    Connection,
    /// A lock held by another connection or process (SQLite's file lock, a
    /// PostgreSQL row or advisory lock).
    Lock,
    /// The statement itself ran past what was left of the deadline.
    Statement,
}

impl Wait {
    /// Every wait, to pre-create metric labels.
    pub const ALL: [Wait; 6] = [
        Wait::Slot,
        Wait::Writer,
        Wait::Reader,
        Wait::Connection,
        Wait::Lock,
        Wait::Statement,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Wait::Slot => "slot",
            Wait::Writer => "writer",
            Wait::Reader => "reader",
            Wait::Connection => "connection",
            Wait::Lock => "lock",
            Wait::Statement => "statement",
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wait::Slot => "no free slot (--db-max-inflight operations in flight)",
            Wait::Writer => "the writer connection is held by another operation",
            Wait::Reader => "every read connection is in use",
            Wait::Connection => "no database connection free in time",
            Wait::Lock => "the database is locked by another connection",
            Wait::Statement => "the statement ran past the deadline",
        })
    }
}

/// Why storage failed, named by what failed rather than by the engine.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A wait for the database passed its deadline; the caller should retry.
    #[error("database busy within --db-wait-timeout-secs: {0}")]
    Timeout(Wait),
    /// The database server cannot be reached, refused the login, or the
    /// connection was lost (mid-transaction or during COMMIT: whether the
    /// work committed is unknown, so no retry is promised).
    #[error("database unreachable: {0}")]
    Unreachable(String),
    /// The database aborted the transaction to resolve a conflict with
    /// another (serialization failure, deadlock): nothing was written and
    /// the same request can be retried.
    #[error("database conflict, retry: {0}")]
    Conflict(String),
    /// The database refused or failed a statement.
    #[error("database: {0}")]
    Query(String),
    /// Opening or writing a file failed.
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
    /// The database was migrated by a newer binary this one cannot use.
    #[error(
        "database schema {found} needs a binary of schema {oldest_compatible} or newer; this one has {ours}"
    )]
    SchemaTooNew {
        /// The database's schema version.
        found: u32,
        /// The oldest schema a binary may have to use it.
        oldest_compatible: u32,
        /// This binary's.
        ours: u32,
    },
    /// A signing key could not be sealed or opened with the key-encryption key.
    #[error("signing key {key_id}: {what}")]
    Sealed {
        /// The signing key.
        key_id: String,
        /// What went wrong (usually: sealed with another key-encryption key).
        what: String,
    },
    /// A `--db` URL or option that cannot work.
    #[error("{0}")]
    Config(String),
    /// The operation does not exist on this backend.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The blocking task died.
    #[error("database task failed: {0}")]
    Task(String),
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

/// A control-plane signing key, its secret in the clear: the store seals it
/// with the key-encryption key before it is written and opens it on read.
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

/// Every signing key as stored, read in one snapshot with its generation:
/// what the control plane's key view (`crate::keys`) is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredKeys {
    /// The database's policy epoch (as [`StoredRevocations::epoch`]).
    pub epoch: u64,
    /// Bumped in the transaction of every row written to or deleted from
    /// `signing_keys` (a trigger), so it follows their commit order.
    pub generation: u64,
    /// When the epoch began (`policy_epoch.created_at`; 0: no epoch yet).
    pub epoch_created_at: i64,
    /// Every key, opened, in signing order.
    pub rows: Vec<SigningKeyRow>,
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

/// A revocation: of one PeerId, or (`peer_id` empty, `token_id` set) of
/// every credential whose claims carry a token id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationRow {
    /// PeerId bytes (empty for a token revocation).
    pub peer_id: Vec<u8>,
    /// Token id (empty for a PeerId revocation).
    pub token_id: String,
    /// Enforced until, Unix seconds.
    pub until: i64,
    /// Why.
    pub reason: String,
}

/// The whole revocation list as stored, read in one snapshot with its
/// generation: what the control plane signs and distributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredRevocations {
    /// The database's policy epoch (changes when the database is new or
    /// restored).
    pub epoch: u64,
    /// Bumped in the transaction of every row written to or deleted from
    /// the revocation tables (a trigger), so it follows their commit order.
    pub generation: u64,
    /// Every row, expired ones included until reaped: PeerId revocations
    /// (by PeerId), then token revocations (by token id).
    pub rows: Vec<RevocationRow>,
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
    /// The token was revoked (`RevokeToken`).
    TokenRevoked,
}

/// Why a refresh or lease was refused by what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRefusal {
    /// No such node (never enrolled, or reaped).
    UnknownNode,
    /// Revoked.
    Revoked,
    /// A lease from a node whose stored role is not router.
    NotARouter,
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
    /// Policy versions go this long after a newer one replaced them (the
    /// one in force is never reaped).
    pub policy_retention_secs: i64,
    /// Recorded admin requests go this long after they were made.
    pub admin_request_retention_secs: i64,
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
    "policies",
    "token_revocations",
    "admin_requests",
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
    ("policies", "replaced"),
    ("token_revocations", "expired"),
    ("admin_requests", "expired"),
];

/// The duties that run on one replica at a time, each under a lease in
/// `duty_leases` (see [`Store::claim_duty`]).
pub const DUTIES: &[&str] = &[REAPER_DUTY];

/// The reaper's duty: deletions and the row counts.
pub const REAPER_DUTY: &str = "reaper";

/// What another process changed, as its notification says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Signing keys or the rotation deadline.
    Keys,
    /// A policy version.
    Policy,
    /// Node or token revocations.
    Revocations,
    /// Router leases (the directory).
    Directory,
    /// Anything may have changed (the listener just (re)connected).
    All,
}

/// Label values of `change_notifications_total{kind}`: every
/// [`Change::kind`].
pub const CHANGE_KINDS: &[&str] = &["keys", "policy", "revocations", "directory", "all"];

impl Change {
    /// Its label value (and, but for `all`, its notification payload).
    pub fn kind(self) -> &'static str {
        match self {
            Change::Keys => "keys",
            Change::Policy => "policy",
            Change::Revocations => "revocations",
            Change::Directory => "directory",
            Change::All => "all",
        }
    }

    /// The notification payload's meaning; `None` for a payload this
    /// binary does not know (a newer one's), which callers treat as `All`.
    pub fn from_payload(payload: &str) -> Option<Self> {
        Some(match payload {
            "keys" => Change::Keys,
            "policy" => Change::Policy,
            "revocations" => Change::Revocations,
            "directory" => Change::Directory,
            _ => return None,
        })
    }
}

/// A replica's presence is a lease on its own name in `duty_leases`.
pub const REPLICA_DUTY_PREFIX: &str = "replica:";

/// The duty name of `holder`'s presence.
pub fn replica_duty(holder: &str) -> String {
    format!("{REPLICA_DUTY_PREFIX}{holder}")
}

/// The role value a lease's node must have (`Role::Router`).
pub(crate) const ROUTER_ROLE: i32 = agentmesh_proto::pb::credential::Role::Router as i32;

/// The storage interface, one implementation per backend.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    /// The connection pool's state, where the backend has one (PostgreSQL).
    fn pool_connections(&self) -> Option<PoolConnections> {
        None
    }
    /// Cheap liveness check (`SELECT 1`).
    async fn ping(&self) -> Result<(), StoreError>;
    /// Stores a token by its digest.
    async fn create_token(&self, digest: &[u8; 32], row: &TokenRow) -> Result<(), StoreError>;
    /// One transaction: records `request` and stores the token, unless
    /// its request id is recorded already: then nothing is written and
    /// the earlier request is returned.
    async fn create_token_once(
        &self,
        digest: &[u8; 32],
        row: &TokenRow,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError>;
    /// At most `limit` (capped at [`MAX_LIST_ROWS`]) tokens with an id
    /// after `after`, in id order, each with its revocation.
    async fn list_tokens(&self, after: &str, limit: u32) -> Result<Vec<TokenListing>, StoreError>;
    /// At most `limit` (capped at [`MAX_LIST_ROWS`]) nodes with an id
    /// after `after`, in id order, each with its PeerId's revocation.
    async fn list_nodes(&self, after: &str, limit: u32) -> Result<Vec<NodeListing>, StoreError>;
    /// The digests of at most `limit` tokens not expired at `now` (used up
    /// or not), for the failure guard's token index.
    async fn token_digests(&self, now: i64, limit: u64) -> Result<Vec<[u8; 32]>, StoreError>;
    /// One transaction: checks the token, re-enrolls a known key without
    /// spending a use or spends one for a new node (a guarded update, so
    /// concurrent enrollments never spend more than `max_uses`), records
    /// the request.
    #[allow(clippy::too_many_arguments)]
    async fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError>;
    /// Marks a node seen and records its new credential expiry.
    async fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError>;
    /// One transaction: checks the lease's node (enrolled, not revoked,
    /// stored role router), marks it seen and upserts its lease, so a
    /// revocation committing meanwhile can never leave a lease behind.
    async fn router_lease(
        &self,
        lease: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError>;
    /// Live leases at `now`.
    async fn directory(&self, now: i64) -> Result<Vec<LeaseRow>, StoreError>;
    /// The revocation list with its epoch and generation, in one snapshot.
    async fn revocations(&self) -> Result<StoredRevocations, StoreError>;
    /// Revokes a node until its last credential expires (or `default_until`,
    /// whichever is later), deletes its lease; returns the instant.
    async fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError>;
    /// One transaction: revokes the token `token_id` until `until` or the
    /// last expiry of a credential issued to one of its nodes, whichever
    /// is later (extending an earlier revocation, never shortening it);
    /// ends its enrollments (its expiry set to `now`, so a binary of an
    /// older schema refuses it too), marks its nodes revoked and deletes
    /// their leases. Returns the instant, or `None` when no token, node or
    /// revocation has that id.
    async fn revoke_token(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<i64>, StoreError>;
    /// [`Store::revoke`] in the transaction that records `request`, its
    /// answer made from the instant; unless its id is recorded already:
    /// then nothing is written and the earlier request is returned.
    async fn revoke_once(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
        request: &RequestOnce<i64>,
    ) -> Result<Result<i64, PriorRequest>, StoreError>;
    /// [`Store::revoke_token`] in the transaction that records `request`
    /// (as [`Store::revoke_once`]); an unknown id records nothing (its
    /// answer is `None`).
    async fn revoke_token_once(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
        request: &RequestOnce<Option<i64>>,
    ) -> Result<Result<Option<i64>, PriorRequest>, StoreError>;
    /// Every signing key, opened, with the epoch and the keys' generation,
    /// in one snapshot.
    async fn keys(&self) -> Result<StoredKeys, StoreError>;
    /// If there are no keys yet, stores `first` and the first rotation
    /// deadline, under a lock so two processes starting together store one.
    /// Returns whether it did.
    async fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError>;
    /// The stored rotation deadline.
    async fn next_rotation_at(&self) -> Result<Option<i64>, StoreError>;
    /// Claims a rotation with a conditional update of the deadline (from
    /// `expected` to `next`; `expected = None` forces it). When claimed, in
    /// the same transaction: every key without an end verifies until
    /// `retire_until`, and `new_key` is stored. Returns whether claimed.
    async fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError>;
    /// One transaction: records `request` and forces a rotation as
    /// [`Store::rotate`] with `expected = None` does, unless its request
    /// id is recorded already: then nothing is written and the earlier
    /// request is returned.
    async fn rotate_once(
        &self,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError>;
    /// One reaper batch, one transaction: deletes at most `max_rows` stale
    /// rows, reason after reason in [`DELETE_REASONS`] order; returns a count for
    /// every reason in that order. Fewer than `max_rows` deleted means
    /// nothing stale is left at `now`.
    async fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError>;
    /// Row counts per table.
    async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError>;
    /// Claims or renews the lease on `duty` for `holder` until `ttl_ms`
    /// from now by the database's clock: true when `holder` holds it
    /// afterwards (it was free, lapsed or already `holder`'s). One
    /// conditional upsert, so two replicas claiming at once get one winner.
    async fn claim_duty(&self, duty: &str, holder: &str, ttl_ms: i64) -> Result<bool, StoreError>;
    /// Gives `duty` up if `holder` holds it (a replica stopping), so the
    /// next claimant need not wait for the lease to lapse.
    async fn release_duty(&self, duty: &str, holder: &str) -> Result<(), StoreError>;
    /// Renews `holder`'s presence (a lease on its own name,
    /// [`replica_duty`]) for `ttl_ms` by the database's clock, forgets
    /// replicas whose presence lapsed, and returns how many are live,
    /// `holder` included. One transaction.
    async fn replica_heartbeat(&self, holder: &str, ttl_ms: i64) -> Result<u32, StoreError>;
    /// Listens for other processes' changes on a connection of its own and
    /// calls `on_change` for each (then [`Change::All`] once listening, so
    /// a caller that missed changes while reconnecting re-reads
    /// everything); returns only when that connection fails.
    /// [`StoreError::Unsupported`] where the backend has no notifications
    /// (SQLite: one process per file; the polls carry changes there).
    async fn listen_changes(
        &self,
        on_change: &(dyn Fn(Change) + Send + Sync),
    ) -> Result<(), StoreError> {
        let _ = on_change;
        Err(StoreError::Unsupported(
            "change notifications need PostgreSQL",
        ))
    }
    /// A consistent copy of the database in the new file `to` while serving
    /// (SQLite; PostgreSQL is backed up with `pg_dump`).
    async fn backup_to(&self, to: &Path) -> Result<(), StoreError>;
    /// Every row of every table, in one consistent read (signing keys opened).
    async fn snapshot(&self) -> Result<Snapshot, StoreError>;
    /// Writes `snap` into this store, which must hold no nodes, tokens,
    /// keys or policies yet, in one transaction (signing keys sealed with
    /// this store's key-encryption key); the policy history is a new epoch
    /// here.
    async fn restore(&self, snap: &Snapshot) -> Result<(), StoreError>;
    /// The policy epoch and the version in force (`None`: no policy
    /// applied yet): one cheap read, so replicas notice another's apply.
    async fn policy_head(&self) -> Result<PolicyHead, StoreError>;
    /// A kept policy version (`None`: never applied, or reaped).
    async fn policy(&self, version: u64) -> Result<Option<PolicyRow>, StoreError>;
    /// One transaction: unless `new.text` is the text in force, stores it
    /// as the next version and marks the one it replaces; the version is
    /// numbered under a lock, so concurrent writers never collide.
    async fn apply_policy(&self, new: &NewPolicy) -> Result<AppliedPolicy, StoreError>;
    /// [`Store::apply_policy`] in the transaction that records `request`
    /// (an unchanged text is recorded too: its retry answers the same);
    /// unless its id is recorded already: then nothing is written and the
    /// earlier request is returned.
    async fn apply_policy_once(
        &self,
        new: &NewPolicy,
        request: &RequestOnce<AppliedPolicy>,
    ) -> Result<Result<AppliedPolicy, PriorRequest>, StoreError>;
    /// Starts a new policy epoch (after a database was restored from a
    /// dump); returns it.
    async fn new_policy_epoch(&self) -> Result<u64, StoreError>;
}

/// Connections of a backend's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConnections {
    /// Open now.
    pub open: usize,
    /// Open and idle.
    pub idle: usize,
    /// The bound (`--db-pool-connections`).
    pub max: usize,
}

/// Told about every wait that ran out (the control plane's metrics).
pub trait WaitObserver: Send + Sync + 'static {
    /// `wait` passed its deadline.
    fn wait_timed_out(&self, wait: Wait);
}

/// Async access to a [`Store`]: at most `max_inflight` operations at once,
/// and one deadline, `wait` from the call, on everything the operation
/// waits for before it runs (a slot, a connection, a lock). A wait that runs
/// out is [`StoreError::Timeout`], reported to the observer.
#[derive(Clone)]
pub struct Db {
    store: Arc<dyn Store>,
    slots: Arc<tokio::sync::Semaphore>,
    wait: Duration,
    observer: Arc<dyn WaitObserver>,
}

impl Db {
    /// Wraps a store.
    pub fn new(
        store: Arc<dyn Store>,
        max_inflight: usize,
        wait: Duration,
        observer: impl WaitObserver,
    ) -> Self {
        Self {
            store,
            slots: Arc::new(tokio::sync::Semaphore::new(max_inflight.max(1))),
            wait,
            observer: Arc::new(observer),
        }
    }

    /// The store, to build an operation for [`Db::run`].
    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Runs `op` (a store call, not yet polled) once it has a slot, with
    /// what is left of the deadline for the backend's own waits.
    pub async fn run<R>(
        &self,
        op: impl Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        let r = self.run_inner(op).await;
        if let Err(StoreError::Timeout(wait)) = &r {
            self.observer.wait_timed_out(*wait);
        }
        r
    }

    async fn run_inner<R>(
        &self,
        op: impl Future<Output = Result<R, StoreError>>,
    ) -> Result<R, StoreError> {
        let started = tokio::time::Instant::now();
        let _permit = tokio::time::timeout(self.wait, self.slots.acquire())
            .await
            .map_err(|_| StoreError::Timeout(Wait::Slot))?
            .map_err(|_| StoreError::Task("database closed".into()))?;
        // The backend keeps what is left, on the clock its threads wait on.
        let left = self.wait.saturating_sub(started.elapsed());
        deadline::within(std::time::Instant::now() + left, op).await
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// `sqlite://PATH` or `postgres://…` (`postgresql://` too).
    pub url: String,
    /// SQLite read-only connections beside the writer.
    pub read_connections: usize,
    /// PostgreSQL pool size.
    pub pool_connections: usize,
    /// Seals signing keys at rest.
    pub kek: Kek,
}

/// Which backend a `--db` URL names, and its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbUrl {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL connection string (URL), completed from `PG*` variables.
    Postgres(String),
}

impl DbUrl {
    /// Parses a `--db` value.
    pub fn parse(db: &str) -> Result<Self, String> {
        if let Some(p) = db.strip_prefix("sqlite://") {
            if p.is_empty() {
                return Err(format!("--db {db:?}: sqlite:// needs a file path"));
            }
            return Ok(Self::Sqlite(p.into()));
        }
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            return Ok(Self::Postgres(db.to_string()));
        }
        Err(format!(
            "--db {db:?}: give sqlite://PATH or postgres://USER@HOST:PORT/DATABASE"
        ))
    }
}

/// Opens (creating and migrating) the store `opts.url` names.
pub async fn open(opts: &OpenOptions) -> Result<Arc<dyn Store>, StoreError> {
    match DbUrl::parse(&opts.url).map_err(StoreError::Config)? {
        DbUrl::Sqlite(path) => {
            let (readers, kek) = (opts.read_connections, opts.kek.clone());
            let store =
                tokio::task::spawn_blocking(move || SqliteStore::open_with(&path, readers, kek))
                    .await
                    .map_err(|e| StoreError::Task(e.to_string()))??;
            Ok(Arc::new(store))
        }
        DbUrl::Postgres(url) => {
            let pg = PgOptions::from_url_and_env(&url, &postgres::process_env())?;
            Ok(Arc::new(
                PostgresStore::open(pg, opts.pool_connections, opts.kek.clone()).await?,
            ))
        }
    }
}

/// The key-encryption key for the database `url`: from `file` if given,
/// else from `env` (the value of [`KEK_ENV`]), else, for SQLite only,
/// from `<db>.kek` beside the database (created, 0600, on first use). A
/// PostgreSQL database has no such default: its dumps and its host are
/// apart from the control plane's, so the key must come from the operator.
/// `previous`, during a KEK rotation, still opens rows sealed with it.
pub fn resolve_kek(
    url: &str,
    file: Option<&Path>,
    env: Option<&str>,
    previous: Option<&Path>,
) -> Result<Kek, StoreError> {
    let kek = match (file, env.filter(|v| !v.trim().is_empty())) {
        (Some(path), _) => Kek::from_file(path)?,
        (None, Some(value)) => {
            Kek::from_hex(value).map_err(|e| StoreError::Config(format!("{KEK_ENV}: {e}")))?
        }
        (None, None) => match DbUrl::parse(url).map_err(StoreError::Config)? {
            DbUrl::Sqlite(path) => {
                let mut kek_path = path.into_os_string();
                kek_path.push(".kek");
                Kek::load_or_create(Path::new(&kek_path))?
            }
            DbUrl::Postgres(_) => {
                return Err(StoreError::Config(format!(
                    "--db postgres://… needs --key-encryption-key-file or {KEK_ENV} (64 hex digits) to seal signing keys"
                )));
            }
        },
    };
    Ok(match previous {
        Some(p) => kek.with_previous(Kek::from_file(p)?),
        None => kek,
    })
}
