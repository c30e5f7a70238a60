//! Admin requests recorded with their effect: what `CreateToken`,
//! `RotateKeyNow`, `ApplyPolicy`, `RevokeNode` and `RevokeToken` write
//! beside the work they do, in the same transaction, so a retry carrying
//! the same request id finds the first answer instead of doing the work
//! twice (or, for a revocation or an apply, answering differently: a
//! second apply of a text another admin replaced since would apply it
//! again).
//!
//! The record goes first in the transaction (`INSERT … ON CONFLICT DO
//! NOTHING`): an id recorded already writes nothing and returns the
//! earlier request. Where the answer is known before the work (a token, a
//! key) it is written with the record; where the work gives it (the
//! revocation's end, the policy's version) the record is written with an
//! empty answer and completed after the work, before the commit, so no
//! other transaction ever sees it incomplete.
//!
//! The answer is sealed at rest with the key-encryption key (a
//! `CreateToken` answer holds the token's secret, which the database never
//! holds in the clear), its associated data naming the request id, so an
//! answer moved to another request's row does not open. Rows are deleted
//! by the reaper `--admin-request-retention-secs` after they were written
//! and are not moved by `store copy` (a retry after a move is a new
//! request).

/// Longest request id, bytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// A request to record with its effect.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminRequest {
    /// The client's id for the request (checked by the caller: see
    /// [`MAX_REQUEST_ID_LEN`]).
    pub request_id: String,
    /// The gRPC method, so an id reused across methods is told apart.
    pub method: &'static str,
    /// SHA-256 of the request as the method reads it.
    pub digest: [u8; 32],
    /// Unix seconds.
    pub at: i64,
    /// The encoded answer, in the clear: the store seals it.
    pub response: Vec<u8>,
}

impl std::fmt::Debug for AdminRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRequest")
            .field("request_id", &self.request_id)
            .field("method", &self.method)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// How a request's encoded answer is made from its work's result.
pub(crate) type AnswerOf<T> = std::sync::Arc<dyn Fn(&T) -> Option<Vec<u8>> + Send + Sync>;

/// A request whose answer comes out of its work: the id, method and
/// digest recorded before the work, and how to encode the answer from the
/// work's result (`T`: a revocation's end, an applied policy).
pub struct RequestOnce<T> {
    /// The client's id for the request (checked by the caller: see
    /// [`MAX_REQUEST_ID_LEN`]).
    pub request_id: String,
    /// The gRPC method.
    pub method: &'static str,
    /// SHA-256 of the request as the method reads it.
    pub digest: [u8; 32],
    /// Unix seconds.
    pub at: i64,
    /// The encoded answer for the work's result, in the clear (the store
    /// seals it); `None` when the result says nothing was done (an unknown
    /// token): then nothing is recorded either, and a retry is judged
    /// afresh.
    pub answer: AnswerOf<T>,
}

impl<T> Clone for RequestOnce<T> {
    fn clone(&self) -> Self {
        Self {
            request_id: self.request_id.clone(),
            method: self.method,
            digest: self.digest,
            at: self.at,
            answer: self.answer.clone(),
        }
    }
}

impl<T> std::fmt::Debug for RequestOnce<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestOnce")
            .field("request_id", &self.request_id)
            .field("method", &self.method)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

impl<T> RequestOnce<T> {
    /// The record to claim before the work: this request with an empty
    /// answer, completed once the work is done.
    pub(super) fn claim(&self) -> AdminRequest {
        AdminRequest {
            request_id: self.request_id.clone(),
            method: self.method,
            digest: self.digest,
            at: self.at,
            response: Vec::new(),
        }
    }
}

/// A request recorded earlier under the same id: nothing was done this
/// time.
#[derive(Clone, PartialEq, Eq)]
pub struct PriorRequest {
    /// Its method.
    pub method: String,
    /// Its digest.
    pub digest: [u8; 32],
    /// When it was done, Unix seconds.
    pub at: i64,
    /// Its answer, opened.
    pub response: Vec<u8>,
}

impl std::fmt::Debug for PriorRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PriorRequest")
            .field("method", &self.method)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// The associated data a request's sealed answer is bound to.
pub(super) fn seal_id(request_id: &str) -> String {
    format!("admin_request {request_id}")
}

/// A stored digest as 32 bytes.
pub(super) fn digest_from(stored: &[u8]) -> Result<[u8; 32], super::StoreError> {
    stored.try_into().map_err(|_| super::StoreError::Corrupt {
        table: "admin_requests",
        what: format!("digest of {} bytes", stored.len()),
    })
}
