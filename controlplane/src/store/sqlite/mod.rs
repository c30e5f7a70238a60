//! The SQLite store, the file created with mode 0600, in WAL mode: one
//! writer connection and a few read-only ones, so reads (the directory,
//! keys, row counts, `/readyz`, backups) never queue behind a write; WAL
//! lets readers run beside the one writer. Every operation runs on the
//! blocking pool and waits for a connection no longer than its deadline
//! (see [`super::pool`]); `BEGIN IMMEDIATE` serialises writers, also across
//! processes sharing the file.
//!
//! The operations are grouped by table: [`nodes`] (tokens and nodes),
//! [`leases`] (leases and the directory), [`revocations`], [`keys`]
//! (signing keys and the rotation deadline), [`admin`] (admin requests
//! recorded with their effect, and the admin listings), [`reap`] (reaper
//! batches and row counts), [`policies`] (policy versions and the epoch) and
//! [`snapshot`] (`store copy`); [`open`] creates the file
//! and [`backup`] copies it. Each is a method of [`Inner`], run by the
//! [`Store`] impl below on the blocking pool.

use std::{path::Path, sync::Arc};

use super::{
    AdminRequest, AppliedPolicy, Deleted, EnrollRefusal, Enrolled, Kek, LeaseRow, NewPolicy,
    NodeListing, NodeRefusal, NodeRow, PolicyHead, PolicyRow, PriorRequest, ReapPolicy,
    RequestOnce, SigningKeyRow, Snapshot, Store, StoreError, StoredKeys, StoredRevocations,
    TokenListing, TokenRow, Wait, deadline, pool::Pool,
};

mod admin;
mod backup;
mod duties;
mod keys;
mod leases;
mod nodes;
mod open;
mod policies;
mod reap;
mod revocations;
mod rows;
mod snapshot;

pub use backup::backup_file;

/// Default `--db-read-connections`: reads are short and few (the directory is
/// cached, keys and counts are read every half minute), so four let
/// `/readyz`, a directory read, a key reload and a backup run at once.
pub const DEFAULT_READ_CONNECTIONS: usize = 4;

impl From<rusqlite::Error> for StoreError {
    /// `SQLITE_BUSY` means the busy handler gave up, and it is given only
    /// what is left of the deadline: that is a timeout like the others.
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            Self::Timeout(Wait::Lock)
        } else {
            Self::Query(e.to_string())
        }
    }
}

/// SQLite storage.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// The connections, used on blocking threads.
pub(super) struct Inner {
    writer: Pool,
    readers: Pool,
    kek: Kek,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl SqliteStore {
    /// The writer connection, within the deadline (blocking; tests).
    #[cfg(test)]
    pub(super) fn writer(&self) -> Result<super::pool::Pooled<'_>, StoreError> {
        self.inner.writer.get()
    }

    /// Runs `f` on the blocking pool under the operation's deadline.
    async fn blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Inner) -> Result<R, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        let deadline = deadline::current();
        tokio::task::spawn_blocking(move || super::pool::with_deadline(deadline, || f(&inner)))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(|s| {
            s.readers.get()?.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
        .await
    }

    async fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        let (digest, t) = (*digest, t.clone());
        self.blocking(move |s| s.create_token(&digest, &t)).await
    }

    async fn create_token_once(
        &self,
        digest: &[u8; 32],
        t: &TokenRow,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        let (digest, t, request) = (*digest, t.clone(), request.clone());
        self.blocking(move |s| s.create_token_once(&digest, &t, &request))
            .await
    }

    async fn list_tokens(&self, after: &str, limit: u32) -> Result<Vec<TokenListing>, StoreError> {
        let after = after.to_string();
        self.blocking(move |s| s.list_tokens(&after, limit)).await
    }

    async fn list_nodes(&self, after: &str, limit: u32) -> Result<Vec<NodeListing>, StoreError> {
        let after = after.to_string();
        self.blocking(move |s| s.list_nodes(&after, limit)).await
    }

    async fn token_digests(&self, now: i64, limit: u64) -> Result<Vec<[u8; 32]>, StoreError> {
        self.blocking(move |s| s.token_digests(now, limit)).await
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
        let (digest, peer, id, src) = (
            *digest,
            peer_id.to_vec(),
            new_node_id.to_string(),
            source.to_string(),
        );
        self.blocking(move |s| s.enroll(&digest, &peer, &id, &src, now, cred_expires_at))
            .await
    }

    async fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let peer = peer_id.to_vec();
        self.blocking(move |s| s.touch_node(&peer, now, cred_expires_at))
            .await
    }

    async fn router_lease(
        &self,
        lease: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let lease = lease.clone();
        self.blocking(move |s| s.router_lease(&lease, now)).await
    }

    async fn directory(&self, now: i64) -> Result<Vec<LeaseRow>, StoreError> {
        self.blocking(move |s| s.directory(now)).await
    }

    async fn revocations(&self) -> Result<StoredRevocations, StoreError> {
        self.blocking(|s| s.revocations()).await
    }

    async fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let (peer, reason) = (peer_id.to_vec(), reason.to_string());
        self.blocking(move |s| s.revoke(&peer, &reason, now, default_until))
            .await
    }

    async fn revoke_token(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<i64>, StoreError> {
        let (id, reason) = (token_id.to_string(), reason.to_string());
        self.blocking(move |s| s.revoke_token(&id, &reason, now, until))
            .await
    }

    async fn revoke_once(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
        request: &RequestOnce<i64>,
    ) -> Result<Result<i64, PriorRequest>, StoreError> {
        let (peer, reason, request) = (peer_id.to_vec(), reason.to_string(), request.clone());
        self.blocking(move |s| {
            s.once(&request, |tx| {
                revocations::revoke_in(tx, &peer, &reason, now, default_until)
            })
        })
        .await
    }

    async fn revoke_token_once(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
        request: &RequestOnce<Option<i64>>,
    ) -> Result<Result<Option<i64>, PriorRequest>, StoreError> {
        let (id, reason, request) = (token_id.to_string(), reason.to_string(), request.clone());
        self.blocking(move |s| {
            s.once(&request, |tx| {
                revocations::revoke_token_in(tx, &id, &reason, now, until)
            })
        })
        .await
    }

    async fn keys(&self) -> Result<StoredKeys, StoreError> {
        self.blocking(|s| s.keys()).await
    }

    async fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError> {
        let first = first.clone();
        self.blocking(move |s| s.init_keys(&first, next_rotation_at))
            .await
    }

    async fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        self.blocking(|s| s.next_rotation_at()).await
    }

    async fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        let key = new_key.clone();
        self.blocking(move |s| s.rotate(expected, next, &key, retire_until))
            .await
    }

    async fn rotate_once(
        &self,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        let (key, request) = (new_key.clone(), request.clone());
        self.blocking(move |s| s.rotate_once(next, &key, retire_until, &request))
            .await
    }

    async fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let policy = *policy;
        self.blocking(move |s| s.reap_batch(now, &policy, max_rows))
            .await
    }

    async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.blocking(|s| s.counts()).await
    }

    async fn claim_duty(&self, duty: &str, holder: &str, ttl_ms: i64) -> Result<bool, StoreError> {
        let (duty, holder) = (duty.to_string(), holder.to_string());
        self.blocking(move |s| s.claim_duty(&duty, &holder, ttl_ms))
            .await
    }

    async fn replica_heartbeat(&self, holder: &str, ttl_ms: i64) -> Result<u32, StoreError> {
        let holder = holder.to_string();
        self.blocking(move |s| s.replica_heartbeat(&holder, ttl_ms))
            .await
    }

    async fn release_duty(&self, duty: &str, holder: &str) -> Result<(), StoreError> {
        let (duty, holder) = (duty.to_string(), holder.to_string());
        self.blocking(move |s| s.release_duty(&duty, &holder)).await
    }

    async fn backup_to(&self, to: &Path) -> Result<(), StoreError> {
        let to = to.to_path_buf();
        self.blocking(move |s| backup::vacuum_into(&*s.readers.get()?, &to))
            .await
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.blocking(|s| s.snapshot()).await
    }

    async fn restore(&self, snap: &Snapshot) -> Result<(), StoreError> {
        let snap = snap.clone();
        self.blocking(move |s| s.restore(&snap)).await
    }

    async fn policy_head(&self) -> Result<PolicyHead, StoreError> {
        self.blocking(|s| s.policy_head()).await
    }

    async fn policy(&self, version: u64) -> Result<Option<PolicyRow>, StoreError> {
        self.blocking(move |s| s.policy(version)).await
    }

    async fn apply_policy(&self, new: &NewPolicy) -> Result<AppliedPolicy, StoreError> {
        let new = new.clone();
        self.blocking(move |s| s.apply_policy(&new)).await
    }

    async fn apply_policy_once(
        &self,
        new: &NewPolicy,
        request: &RequestOnce<AppliedPolicy>,
    ) -> Result<Result<AppliedPolicy, PriorRequest>, StoreError> {
        let (new, request) = (new.clone(), request.clone());
        self.blocking(move |s| s.once(&request, |tx| policies::apply_in(tx, &new)))
            .await
    }

    async fn new_policy_epoch(&self) -> Result<u64, StoreError> {
        self.blocking(|s| s.new_policy_epoch()).await
    }
}
