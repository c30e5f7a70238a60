//! Why opening or accepting a stream failed.

use std::io;

use libp2p::{PeerId, StreamProtocol};

use crate::labels::PendingLimit;

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenStreamError {
    /// The peer did not accept this protocol during negotiation: it does
    /// not speak it, or it refused the stream there (a router's resource
    /// manager refuses streams past its budgets by failing the
    /// negotiation). The two cannot be told apart on the wire: the
    /// multistream-select dialer maps an `na` and a stream closed or reset
    /// before the answer to the same `NegotiationFailed` (a yamux 0.14
    /// reset reads as end of stream, and yamux carries no reason or code
    /// per stream); anything else the listener might write in its place is
    /// a bare `InvalidMessage` I/O error that carries no text either, and
    /// would be taken for a broken connection.
    #[error(
        "failed to open stream: remote peer refused {0} or does not support it \
         (a router refuses streams past its budgets during negotiation: see its \
         agentmesh_router_refused_total)"
    )]
    UnsupportedProtocol(StreamProtocol),
    /// The connection (or the dial to the peer) failed, closed, or the
    /// negotiation timed out.
    #[error("failed to open stream: io error: {0}")]
    Io(#[from] io::Error),
    /// Not connected to the peer, and `max` opens already wait for a dial
    /// (to this peer, or to all peers together, as `limit` says): refused
    /// at once instead of queueing without bound behind a dial that may
    /// only fail at its timeout. Counted in
    /// `agentmesh_streams_pending_opens_refused_total{limit}`.
    #[error(
        "failed to open stream to {peer}: not connected, and {max} opens already wait for {limit}"
    )]
    TooManyPending {
        /// The peer the stream was for.
        peer: PeerId,
        /// Which bound was reached.
        limit: PendingLimit,
        /// That bound.
        max: usize,
    },
}

/// A protocol is already accepted by a live [`IncomingStreams`].
#[derive(Debug, thiserror::Error)]
#[error("protocol {0} is already registered")]
pub struct AlreadyRegistered(pub StreamProtocol);
