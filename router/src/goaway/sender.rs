//! Sending go-away: the router opens `/agentmesh/goaway/1` to a member,
//! writes one `GoAway` frame and reads one `GoAwayAck` frame, the whole
//! exchange within the stream timeout; at most
//! `goaway_max_concurrent_streams` exchanges run at once.

use std::time::Duration;

use agentmesh_proto::pb::mesh::GoAway;
use agentmesh_streams::Control;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::goaway::{self, GoAwayError};
use agentmesh_wire::open::OpenError;
use futures::StreamExt as _;
use libp2p::PeerId;

use super::{GoAways, Reason};

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

/// Sends go-away `reason` to every peer in `peers`, at most
/// `goaway_max_concurrent_streams` at once, counting each result; returns
/// each peer's outcome.
pub(crate) async fn send_all(
    goaways: &GoAways,
    control: &Control,
    peers: Vec<PeerId>,
    reason: Reason,
) -> Vec<(PeerId, Outcome)> {
    if peers.is_empty() {
        return Vec::new();
    }
    let msg = goaways.message(reason);
    let deadline = goaways.config.stream_timeout;
    let fanout = goaways.config.goaway_max_concurrent_streams.max(1);
    let msg = &msg;
    let results: Vec<(PeerId, Outcome)> = futures::stream::iter(peers)
        .map(|peer| {
            let control = control.clone();
            async move {
                let outcome = send_one(control, peer, msg, deadline).await;
                // Counted as each exchange ends, not when all have: a drain
                // whose grace ends mid-send drops this future, and the
                // go-aways already sent must still show on /metrics.
                goaways.count(reason, outcome.as_str());
                (peer, outcome)
            }
        })
        .buffer_unordered(fanout)
        .collect()
        .await;
    let acked = results.iter().filter(|(_, o)| *o == Outcome::Acked).count();
    tracing::info!(
        reason = reason.as_str(),
        sent = results.len(),
        acked,
        alternatives = msg.alternatives.len(),
        "go-away sent"
    );
    results
}
