//! This router authenticating to another router (purpose router).

use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthRefusal, AuthRequest, Purpose};
use agentmesh_streams::Control;
use agentmesh_wire::auth::{self, AuthError, AuthOutcome};
use libp2p::PeerId;

use crate::cp::Link;

/// Why authenticating to another router failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboundAuthError {
    /// This router has no credential yet.
    #[error("no credential yet")]
    NoCredential,
    /// The stream could not be opened, or the exchange failed.
    #[error(transparent)]
    Exchange(#[from] AuthError),
    /// The other router refused.
    #[error("refused by {peer}: {reason:?} ({detail})")]
    Refused {
        /// The other router.
        peer: PeerId,
        /// Its reason.
        reason: AuthRefusal,
        /// Its detail.
        detail: String,
    },
    /// The answer was a go-away, not an admission or a refusal.
    #[error("unexpected auth answer from {peer}")]
    Unexpected {
        /// The other router.
        peer: PeerId,
    },
}

/// Shows this router's credential to `peer` with purpose router; returns
/// the admission's end (Unix seconds).
pub(crate) async fn authenticate(
    link: &Link,
    control: &mut Control,
    peer: PeerId,
    deadline: Duration,
) -> Result<i64, OutboundAuthError> {
    let credential = link
        .credential
        .read()
        .clone()
        .ok_or(OutboundAuthError::NoCredential)?;
    let req = AuthRequest {
        credential: Some(credential),
        purpose: Purpose::Router as i32,
        attached_routers: Vec::new(),
        ..Default::default()
    };
    match auth::request(control.clone(), peer, req, deadline).await? {
        AuthOutcome::Admitted { until, .. } => Ok(until),
        AuthOutcome::Refused(reason, detail) => Err(OutboundAuthError::Refused {
            peer,
            reason,
            detail,
        }),
        // Busy: the mesh asks again on its next round.
        AuthOutcome::Busy { detail, .. } => Err(OutboundAuthError::Refused {
            peer,
            reason: AuthRefusal::Overloaded,
            detail,
        }),
        AuthOutcome::GoAway(_) => Err(OutboundAuthError::Unexpected { peer }),
    }
}
