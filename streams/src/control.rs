//! The handle our code holds: open streams, accept a protocol, read the
//! drop counters.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::sync::{mpsc, oneshot};

use crate::shared::{DebugSizes, DropLabels, DropReason, OpenRequest, Route, Shared};

/// Opens streams and registers inbound protocols; cheap to clone, every
/// clone talks to the same [`Behaviour`](crate::Behaviour).
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

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
}

/// A protocol is already accepted by a live [`IncomingStreams`].
#[derive(Debug, thiserror::Error)]
#[error("protocol {0} is already registered")]
pub struct AlreadyRegistered(pub StreamProtocol);

impl Control {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Opens a `protocol` stream to `peer` on its newest connection; when
    /// not connected, asks the swarm to dial the peer (addresses come from
    /// the other behaviours) and fails if that dial fails. The caller bounds
    /// the wait (the negotiation itself times out after the swarm's
    /// substream timeout).
    pub async fn open_stream(
        &mut self,
        peer: PeerId,
        protocol: StreamProtocol,
    ) -> Result<Stream, OpenStreamError> {
        let (reply, answer) = oneshot::channel();
        let req = OpenRequest { protocol, reply };
        if let Route::Connection(conn, req) = self.shared.route(peer, req) {
            conn.send(req).await.map_err(|_| closed(peer))?;
        }
        answer.await.map_err(|_| closed(peer))?
    }

    /// Accepts inbound streams of `protocol` until the returned
    /// [`IncomingStreams`] is dropped; afterwards the protocol is no longer
    /// offered, so peers get "unsupported protocol".
    pub fn accept(
        &mut self,
        protocol: StreamProtocol,
    ) -> Result<IncomingStreams, AlreadyRegistered> {
        self.shared.accept(protocol)
    }

    /// How many inbound streams of `protocol` were dropped for `reason`
    /// (same numbers as the metric).
    pub fn dropped_inbound(&self, protocol: &StreamProtocol, reason: DropReason) -> u64 {
        self.shared
            .dropped
            .get_or_create(&DropLabels {
                protocol: protocol.to_string(),
                reason,
            })
            .get()
    }

    /// Sizes of the internal maps, so tests can assert nothing is left
    /// behind after connections close.
    #[doc(hidden)]
    pub fn debug_sizes(&self) -> DebugSizes {
        self.shared.debug_sizes()
    }
}

fn closed(peer: PeerId) -> OpenStreamError {
    OpenStreamError::Io(io::Error::new(
        io::ErrorKind::ConnectionReset,
        format!("connection to {peer} closed before the stream was opened"),
    ))
}

/// The inbound streams of one protocol, with the peer that opened each.
/// Dropping it unregisters the protocol.
#[must_use = "streams wait (and then get dropped) unless this is polled"]
pub struct IncomingStreams {
    receiver: mpsc::Receiver<(PeerId, Stream)>,
    shared: Arc<Shared>,
    protocol: StreamProtocol,
    id: u64,
}

impl IncomingStreams {
    pub(crate) fn new(
        receiver: mpsc::Receiver<(PeerId, Stream)>,
        shared: Arc<Shared>,
        protocol: StreamProtocol,
        id: u64,
    ) -> Self {
        Self {
            receiver,
            shared,
            protocol,
            id,
        }
    }
}

impl futures::Stream for IncomingStreams {
    type Item = (PeerId, Stream);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(cx)
    }
}

impl Drop for IncomingStreams {
    fn drop(&mut self) {
        self.shared.unregister(&self.protocol, self.id);
    }
}
