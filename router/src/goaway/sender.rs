//! Sending go-away: the router opens `/agentmesh/goaway/1` to a member,
//! writes one `GoAway` frame and reads one `GoAwayAck` frame, the whole
//! exchange within the stream timeout ([`super::pace`] sends many, in
//! waves, at most `goaway_max_concurrent_streams` at once).

use std::time::Duration;

use agentmesh_proto::pb::mesh::GoAway;
use agentmesh_streams::Control;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::goaway::{self, GoAwayError};
use agentmesh_wire::open::OpenError;
use libp2p::PeerId;

/// How one go-away ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The member acknowledged it.
    Acked,
    /// No acknowledgement within the stream timeout.
    Timeout,
    /// The member does not speak the protocol.
    Unsupported,
    /// The stream failed.
    Error,
}

impl Outcome {
    /// The metric label (one of [`super::RESULTS`]).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Acked => "acked",
            Self::Timeout => "timeout",
            Self::Unsupported => "unsupported",
            Self::Error => "error",
        }
    }
}

/// Sends `msg` to one member and waits for its ack, within `deadline`.
pub(crate) async fn send_one(
    control: Control,
    peer: PeerId,
    msg: &GoAway,
    deadline: Duration,
) -> Outcome {
    match goaway::send(control, peer, msg, deadline).await {
        Ok(()) => Outcome::Acked,
        Err(GoAwayError::Open(OpenError::Unsupported(_))) => Outcome::Unsupported,
        Err(e) if e.is_timeout() => Outcome::Timeout,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "go-away not delivered");
            Outcome::Error
        }
    }
}
