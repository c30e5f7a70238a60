//! This router authenticating to another router (purpose router).

use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthRefusal, AuthRequest, Purpose, auth_response};
use agentmesh_streams::{Control, OpenStreamError};
use futures::AsyncWriteExt;
use libp2p::{PeerId, StreamProtocol};

use super::wire;
use crate::cp::Link;
use crate::frames::WireError;

/// Why authenticating to another router failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutboundAuthError {
    /// This router has no credential yet.
    #[error("no credential yet")]
    NoCredential,
    /// The auth stream could not be opened.
    #[error("opening auth stream to {peer}: {source}")]
    Open {
        /// The other router.
        peer: PeerId,
        /// The cause.
        source: OpenStreamError,
    },
    /// The exchange failed.
    #[error("auth exchange with {peer}: {source}")]
    Wire {
        /// The other router.
        peer: PeerId,
        /// The cause.
        source: WireError,
    },
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
    /// The answer was neither admitted nor refused.
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
    let protocol = StreamProtocol::new(agentmesh_proto::protocols::AUTH);
    let mut stream = match tokio::time::timeout(deadline, control.open_stream(peer, protocol)).await
    {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(OutboundAuthError::Open { peer, source }),
        Err(_) => {
            return Err(OutboundAuthError::Wire {
                peer,
                source: WireError::Timeout(deadline),
            });
        }
    };
    let req = AuthRequest {
        credential: Some(credential),
        purpose: Purpose::Router as i32,
        attached_routers: Vec::new(),
    };
    let resp = wire::exchange(&mut stream, &req, deadline)
        .await
        .map_err(|source| OutboundAuthError::Wire { peer, source })?;
    let _ = tokio::time::timeout(deadline, stream.close()).await;
    match resp.result {
        Some(auth_response::Result::Admitted(a)) => Ok(a.until_unix_secs),
        Some(auth_response::Result::Refused(r)) => Err(OutboundAuthError::Refused {
            peer,
            reason: AuthRefusal::try_from(r.reason).unwrap_or(AuthRefusal::Unspecified),
            detail: r.detail,
        }),
        _ => Err(OutboundAuthError::Unexpected { peer }),
    }
}
