//! Opening a stream of one of our protocols to a peer.

use agentmesh_streams::{ConnectionInfo, Control, OpenStreamError};
use libp2p::{PeerId, Stream, StreamProtocol};

/// Why a stream could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The peer refused the protocol during negotiation: it does not speak
    /// it, or it refused the stream there for a budget (a router does);
    /// see `agentmesh_streams::OpenStreamError::UnsupportedProtocol` for
    /// why the two cannot be told apart.
    #[error("{0}")]
    Unsupported(String),
    /// Too many opens wait for a dial to the peer.
    #[error("{0}")]
    Refused(String),
    /// The connection under the stream failed (closed, reset, not
    /// connected): a fresh connection may succeed where this one did not.
    #[error("connection failed: {0}")]
    Connection(String),
}

/// Opens a stream of `protocol` to `peer`.
pub async fn open(
    control: &mut Control,
    peer: PeerId,
    protocol: &'static str,
) -> Result<Stream, OpenError> {
    open_with_info(control, peer, protocol)
        .await
        .map(|(_, s)| s)
}

/// [`open`], also saying which connection carries the stream.
pub async fn open_with_info(
    control: &mut Control,
    peer: PeerId,
    protocol: &'static str,
) -> Result<(ConnectionInfo, Stream), OpenError> {
    control
        .open_stream_with_info(peer, StreamProtocol::new(protocol))
        .await
        .map_err(|e| match e {
            OpenStreamError::Io(e) => OpenError::Connection(e.to_string()),
            e @ OpenStreamError::UnsupportedProtocol(_) => OpenError::Unsupported(e.to_string()),
            other => OpenError::Refused(other.to_string()),
        })
}
