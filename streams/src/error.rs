//! Why opening or accepting a stream failed.

use std::io;

use libp2p::{PeerId, StreamProtocol};

use crate::labels::PendingLimit;

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenStreamError {
    /// The peer does not accept this protocol (negotiation failed).
    #[error("failed to open stream: remote peer does not support {0}")]
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
