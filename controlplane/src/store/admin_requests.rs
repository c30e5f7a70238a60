//! Admin requests recorded with their effect: what `CreateToken` and
//! `RotateKeyNow` write beside the token or key they make, in the same
//! transaction, so a retry carrying the same request id finds the first
//! answer instead of doing the work twice.
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
