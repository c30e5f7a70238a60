//! The PostgreSQL store: a bounded pool of connections (deadpool), every
//! operation one transaction whose `statement_timeout` and `lock_timeout`
//! are what is left of the operation's deadline (`SET LOCAL`), so a call
//! never waits on the server past `--db-wait-timeout-secs` either.
//!
//! PostgreSQL's READ COMMITTED does not serialise writers the way SQLite's
//! `BEGIN IMMEDIATE` does, so every read-check-write here is safe on its
//! own: token uses are spent by `UPDATE … WHERE uses < max_uses`, a node
//! is touched by one conditional `UPDATE`, a lease is written after locking
//! its node's row (`FOR UPDATE`, the row a revocation updates first), the
//! first signing key and migrations run under transaction-level advisory
//! locks, rotation is claimed by a conditional update, and a policy
//! version is numbered under an advisory lock.
//!
//! The operations are grouped by table: [`nodes`] (tokens and nodes),
//! [`leases`] (leases and the directory), [`revocations`], [`keys`]
//! (signing keys and the rotation deadline), [`admin`] (admin requests
//! recorded with their effect, and the admin listings), [`reap`] (reaper batches and
//! row counts), [`policies`] (policy versions and the epoch) and
//! [`snapshot`] (`store copy`), each a function the
//! [`Store`] impl below calls; [`open`] builds the pool and migrates,
//! [`rows`] maps rows to the store's types, [`options`] reads the URL and
//! the `PG*` variables.

mod admin;
mod changes;
mod duties;
mod errors;
mod keys;
mod leases;
mod nodes;
mod open;
mod options;
mod policies;
mod reap;
mod revocations;
mod rows;
mod snapshot;

use std::{path::Path, time::Instant};

use deadpool_postgres::{Pool, Timeouts};

use errors::pool_err;

pub(crate) use options::process_env;
pub use options::{PgOptions, Tls};

use super::{
    AdminRequest, AppliedPolicy, Change, Deleted, EnrollRefusal, Enrolled, Kek, LeaseRow,
    NewPolicy, NodeListing, NodeRefusal, NodeRow, PolicyHead, PolicyRow, PriorRequest, ReapPolicy,
    RequestOnce, SigningKeyRow, Snapshot, Store, StoreError, StoredKeys, StoredRevocations,
    TokenListing, TokenRow, Wait, deadline,
};

/// Default `--db-pool-connections`: PostgreSQL's default `max_connections`
/// is 100; 16 per control plane leaves room for several replicas and
/// operators, and is more than the control plane's few concurrent
/// transactions (enrollment is rate-limited) need.
pub const DEFAULT_POOL_CONNECTIONS: usize = 16;

/// Advisory lock keys (transaction level; per database).
const LOCK_MIGRATE: i64 = 0x616d_0001;
const LOCK_KEYS: i64 = 0x616d_0002;
const LOCK_POLICY: i64 = 0x616d_0003;

/// PostgreSQL storage.
pub struct PostgresStore {
    pool: Pool,
    kek: Kek,
    /// For the change listener's own connection (never a pooled one).
    opts: PgOptions,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl PostgresStore {
    /// A connection within the deadline, and the milliseconds left.
    async fn conn(&self) -> Result<(deadpool_postgres::Object, u64), StoreError> {
        let deadline = deadline::current();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StoreError::Timeout(Wait::Slot));
        }
        let timeouts = Timeouts {
            wait: Some(left),
            create: Some(left),
            recycle: Some(left),
        };
        let conn = self.pool.timeout_get(&timeouts).await.map_err(pool_err)?;
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis();
        if ms == 0 {
            return Err(StoreError::Timeout(Wait::Connection));
        }
        Ok((conn, u64::try_from(ms).unwrap_or(u64::MAX)))
    }

    /// A read-only REPEATABLE READ transaction on `conn`, bounded as
    /// [`Self::bound`] does: every statement in it reads one snapshot.
    pub(super) async fn read_snapshot(
        conn: &mut deadpool_postgres::Object,
        ms: u64,
    ) -> Result<Tx<'_>, StoreError> {
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        Self::bound(&tx, ms).await?;
        Ok(tx)
    }

    /// Bounds the transaction's statements and lock waits by `ms`, and
    /// the time it may sit idle holding its locks: a replica stopped
    /// mid-transaction (SIGSTOP, a frozen VM, a lost network) has its
    /// session ended by the server after `ms`, never holding locks the
    /// other replicas wait on for longer than one operation's deadline.
    pub(super) async fn bound(tx: &Tx<'_>, ms: u64) -> Result<(), StoreError> {
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; \
             SET LOCAL idle_in_transaction_session_timeout = {ms}"
        ))
        .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn pool_connections(&self) -> Option<super::PoolConnections> {
        let s = self.pool.status();
        Some(super::PoolConnections {
            open: s.size,
            idle: s.available,
            max: s.max_size,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.query_one("SELECT 1", &[]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        nodes::create_token(self, digest, t).await
    }

    async fn create_token_once(
        &self,
        digest: &[u8; 32],
        t: &TokenRow,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        admin::create_token_once(self, digest, t, request).await
    }

    async fn list_tokens(&self, after: &str, limit: u32) -> Result<Vec<TokenListing>, StoreError> {
        admin::list_tokens(self, after, limit).await
    }

    async fn list_nodes(&self, after: &str, limit: u32) -> Result<Vec<NodeListing>, StoreError> {
        admin::list_nodes(self, after, limit).await
    }

    async fn token_digests(&self, now: i64, limit: u64) -> Result<Vec<[u8; 32]>, StoreError> {
        nodes::token_digests(self, now, limit).await
    }

    async fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError> {
        nodes::enroll(
            self,
            digest,
            peer_id,
            new_node_id,
            source,
            now,
            cred_expires_at,
        )
        .await
    }

    async fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        nodes::touch_node(self, peer_id, now, cred_expires_at).await
    }

    async fn router_lease(
        &self,
        lease: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        leases::router_lease(self, lease, now).await
    }

    async fn directory(&self, now: i64) -> Result<Vec<LeaseRow>, StoreError> {
        leases::directory(self, now).await
    }

    async fn revocations(&self) -> Result<StoredRevocations, StoreError> {
        revocations::list(self).await
    }

    async fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        revocations::revoke(self, peer_id, reason, now, default_until).await
    }

    async fn revoke_token(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<i64>, StoreError> {
        revocations::revoke_token(self, token_id, reason, now, until).await
    }

    async fn revoke_once(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
        request: &RequestOnce<i64>,
    ) -> Result<Result<i64, PriorRequest>, StoreError> {
        admin::revoke_once(self, peer_id, reason, now, default_until, request).await
    }

    async fn revoke_token_once(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
        request: &RequestOnce<Option<i64>>,
    ) -> Result<Result<Option<i64>, PriorRequest>, StoreError> {
        admin::revoke_token_once(self, token_id, reason, now, until, request).await
    }

    async fn keys(&self) -> Result<StoredKeys, StoreError> {
        keys::keys(self).await
    }

    async fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError> {
        keys::init_keys(self, first, next_rotation_at).await
    }

    async fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        keys::next_rotation_at(self).await
    }

    async fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        keys::rotate(self, expected, next, new_key, retire_until).await
    }

    async fn rotate_once(
        &self,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        admin::rotate_once(self, next, new_key, retire_until, request).await
    }

    async fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        reap::reap_batch(self, now, policy, max_rows).await
    }

    async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        reap::counts(self).await
    }

    async fn claim_duty(&self, duty: &str, holder: &str, ttl_ms: i64) -> Result<bool, StoreError> {
        duties::claim(self, duty, holder, ttl_ms).await
    }

    async fn listen_changes(
        &self,
        on_change: &(dyn Fn(Change) + Send + Sync),
    ) -> Result<(), StoreError> {
        changes::listen(&self.opts, on_change).await
    }

    async fn replica_heartbeat(&self, holder: &str, ttl_ms: i64) -> Result<u32, StoreError> {
        duties::heartbeat(self, holder, ttl_ms).await
    }

    async fn release_duty(&self, duty: &str, holder: &str) -> Result<(), StoreError> {
        duties::release(self, duty, holder).await
    }

    async fn backup_to(&self, _to: &Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "a PostgreSQL database is backed up with pg_dump (see docs/storage.md)",
        ))
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.snapshot_rows().await
    }

    async fn restore(&self, s: &Snapshot) -> Result<(), StoreError> {
        self.restore_rows(s).await
    }

    async fn policy_head(&self) -> Result<PolicyHead, StoreError> {
        policies::head(self).await
    }

    async fn policy(&self, version: u64) -> Result<Option<PolicyRow>, StoreError> {
        policies::get(self, version).await
    }

    async fn apply_policy(&self, new: &NewPolicy) -> Result<AppliedPolicy, StoreError> {
        policies::apply(self, new).await
    }

    async fn apply_policy_once(
        &self,
        new: &NewPolicy,
        request: &RequestOnce<AppliedPolicy>,
    ) -> Result<Result<AppliedPolicy, PriorRequest>, StoreError> {
        admin::apply_policy_once(self, new, request).await
    }

    async fn new_policy_epoch(&self) -> Result<u64, StoreError> {
        policies::renew_epoch(self).await
    }
}
