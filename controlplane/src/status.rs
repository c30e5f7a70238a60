//! Service errors and their one mapping onto gRPC statuses.

use std::time::Duration;

use tonic::{Code, Status, metadata::MetadataValue};

use crate::{
    client::RETRY_AFTER_METADATA, limiter::retry_after_secs, metrics::Metrics, store::StoreError,
};

/// `Unauthenticated` reasons that come only after the caller's proof and
/// our signature on its credential verified: not failures for the guard
/// ([`ServiceError::is_failure`]).
pub const PROVEN_REASONS: &[&str] = &["credential_expired", "credential_not_yet_valid"];

/// Why a call was refused.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A limiter refused; retry after `wait`.
    #[error("{limiter} limit reached; retry in {wait:?}")]
    Limited {
        /// The limit, as in `limiter_refusals_total{limiter}`.
        limiter: &'static str,
        /// Time until a slot frees.
        wait: Duration,
    },
    /// The failure guard refused a request that did not prove who sent it,
    /// from a source over `--auth-failures-per-source-per-min`; retry after
    /// `wait` (the rest of the source's window). Counted as limiter
    /// `failure_guard`; `cause` says what this request lacked.
    #[error(
        "failure_guard limit reached (too many failed authentications from this source); \
         retry in {wait:?}; this request: {cause}"
    )]
    Blocked {
        /// Until the source's window ends.
        wait: Duration,
        /// Why this request failed (it is not counted again).
        cause: Box<ServiceError>,
    },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The caller did not prove who it is (token, proof, credential).
    #[error("{msg}")]
    Unauthenticated {
        /// Metric label.
        reason: &'static str,
        /// Human message.
        msg: String,
    },
    /// The caller is known but not allowed (role, labels, revoked, admin off).
    #[error("{msg}")]
    Denied {
        /// Metric label.
        reason: &'static str,
        /// Human message.
        msg: String,
    },
    /// What the request names does not exist (or no longer: reaped).
    #[error("not found: {0}")]
    NotFound(String),
    /// No signing key is active (should not happen after startup).
    #[error("no active signing key")]
    NoSigningKey,
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    /// An `Unauthenticated` error.
    pub fn unauth(reason: &'static str, msg: impl Into<String>) -> Self {
        Self::Unauthenticated {
            reason,
            msg: msg.into(),
        }
    }

    /// A `Denied` error.
    pub fn denied(reason: &'static str, msg: impl Into<String>) -> Self {
        Self::Denied {
            reason,
            msg: msg.into(),
        }
    }

    /// Whether the caller failed to prove who it is or sent a malformed
    /// request: what the failure guard counts against its source.
    ///
    /// Not a failure: a caller that did prove its key and our signature
    /// and is refused all the same ([`Self::Denied`]: revoked, a revoked
    /// token, the wrong role or labels; a credential of ours that is
    /// expired or not yet valid, [`PROVEN_REASONS`]). The guard is keyed
    /// by source address, and many members share one (a NAT, a pod
    /// network): counting these let a few hundred revoked members, asking
    /// again as members do, block their address for every member and
    /// router behind it, whose refreshes and leases then failed until
    /// credentials expired (the 10,003-member ladder of session 14,
    /// `ladder/RESULTS.md`). A proven caller's requests are bounded by
    /// the fair per-source budgets instead.
    ///
    /// Nor is [`Self::Blocked`]: its cause was judged (and counted) when
    /// the guard refused it.
    pub fn is_failure(&self) -> bool {
        match self {
            Self::Invalid(_) => true,
            Self::Unauthenticated { reason, .. } => !PROVEN_REASONS.contains(reason),
            _ => false,
        }
    }

    /// The auth-failure reason, for metrics and the failure guard.
    pub fn auth_reason(&self) -> Option<&'static str> {
        match self {
            Self::Unauthenticated { reason, .. } | Self::Denied { reason, .. } => Some(reason),
            Self::Blocked { cause, .. } => cause.auth_reason(),
            _ => None,
        }
    }
}

fn with_retry_after(mut status: Status, wait: Duration) -> Status {
    let secs = retry_after_secs(wait).to_string();
    if let Ok(v) = MetadataValue::try_from(secs.as_str()) {
        status.metadata_mut().insert(RETRY_AFTER_METADATA, v);
    }
    status
}

/// The gRPC status for an error: the only place errors become statuses.
pub fn to_status(err: &ServiceError) -> Status {
    match err {
        ServiceError::Limited { wait, .. } | ServiceError::Blocked { wait, .. } => {
            with_retry_after(Status::new(Code::ResourceExhausted, err.to_string()), *wait)
        }
        ServiceError::Invalid(_) => Status::invalid_argument(err.to_string()),
        ServiceError::NotFound(_) => Status::not_found(err.to_string()),
        ServiceError::Unauthenticated { .. } => Status::unauthenticated(err.to_string()),
        ServiceError::Denied { .. } => Status::permission_denied(err.to_string()),
        ServiceError::NoSigningKey => {
            with_retry_after(Status::unavailable(err.to_string()), Duration::from_secs(1))
        }
        ServiceError::Store(StoreError::Timeout(wait)) => with_retry_after(
            Status::unavailable(format!("control plane database busy: {wait}")),
            Duration::from_secs(1),
        ),
        ServiceError::Store(StoreError::Conflict(e)) => with_retry_after(
            Status::unavailable(format!("control plane database conflict, retry: {e}")),
            Duration::from_secs(1),
        ),
        // Unknown whether the work committed (the connection may have
        // dropped during COMMIT): no retry-after promise; the caller
        // retries with its request id, on this or another replica.
        ServiceError::Store(e @ StoreError::Unreachable(_)) => {
            tracing::warn!(error = %e, "database connection lost");
            Status::unavailable(format!("control plane database unavailable: {e}"))
        }
        // Never INTERNAL: every storage failure is this replica's database
        // trouble, and another replica (or a later try) may not have it.
        ServiceError::Store(e) => {
            tracing::error!(error = %e, "storage error");
            Status::unavailable(format!("control plane storage error: {e}"))
        }
    }
}

/// The status for an error answered to `method`, counted: a limiter's
/// refusal in `limiter_refusals_total` (the failure guard's under
/// `failure_guard`, a full database queue under `db_busy`), an
/// authentication or authorization refusal in `auth_failures_total` by
/// reason.
pub fn counted_status(m: &Metrics, method: &'static str, err: &ServiceError) -> Status {
    match err {
        ServiceError::Limited { limiter, .. } => m.limited(limiter),
        ServiceError::Blocked { .. } => m.limited("failure_guard"),
        ServiceError::Store(StoreError::Timeout(_)) => m.limited("db_busy"),
        ServiceError::Store(StoreError::Conflict(_)) => m.limited("db_conflict"),
        _ => {}
    }
    if let Some(reason) = err.auth_reason() {
        m.auth_failed(method, reason);
    }
    let status = to_status(err);
    tracing::debug!(method, code = ?status.code(), error = %err, "refused");
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limited_carries_whole_second_retry_after() {
        let s = to_status(&ServiceError::Limited {
            limiter: "enroll",
            wait: Duration::from_millis(1500),
        });
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(crate::client::retry_after(&s), Some(Duration::from_secs(2)));
        let s = to_status(&ServiceError::unauth(
            "unknown_token",
            "token not recognised",
        ));
        assert_eq!(s.code(), Code::Unauthenticated);
        assert!(s.message().contains("token not recognised"));
    }

    #[test]
    fn database_failures_are_unavailable_and_only_a_conflict_or_a_busy_wait_promise_a_retry() {
        let conflict = to_status(&ServiceError::Store(StoreError::Conflict("40001".into())));
        assert_eq!(conflict.code(), Code::Unavailable);
        assert_eq!(
            crate::client::retry_after(&conflict),
            Some(Duration::from_secs(1))
        );
        // The connection lost, maybe during COMMIT: no promise.
        let lost = to_status(&ServiceError::Store(StoreError::Unreachable(
            "57P01".into(),
        )));
        assert_eq!(lost.code(), Code::Unavailable);
        assert_eq!(crate::client::retry_after(&lost), None);
        let query = to_status(&ServiceError::Store(StoreError::Query("42P01".into())));
        assert_eq!(query.code(), Code::Unavailable, "never INTERNAL");
    }
}
