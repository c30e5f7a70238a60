//! The handle our code holds: open streams, accept a protocol, read the
//! drop and refusal counters.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::{AlreadyRegistered, OpenStreamError};
use crate::info::ConnectionInfo;
use crate::labels::{DropLabels, DropReason, PendingLimit, RefusedLabels};
use crate::shared::{DebugSizes, InboundQueue, OpenRequest, Route, Shared};

/// Opens streams and registers inbound protocols; cheap to clone, every
/// clone talks to the behaviour that made it.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl Control {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Opens a `protocol` stream to `peer` on its newest connection (not
    /// held back, see [`Control::hold`]); when
    /// not connected, asks the swarm to dial the peer (addresses come from
    /// the other behaviours) and fails if that dial fails. The caller bounds
    /// the wait (the negotiation itself times out after the swarm's
    /// substream timeout). Refused at once with
    /// [`OpenStreamError::TooManyPending`] when too many opens already wait
    /// for a dial ([`PendingOpenLimits`](crate::PendingOpenLimits)).
    pub async fn open_stream(
        &mut self,
        peer: PeerId,
        protocol: StreamProtocol,
    ) -> Result<Stream, OpenStreamError> {
        self.open_stream_with_info(peer, protocol)
            .await
            .map(|(_, stream)| stream)
    }

    /// [`Control::open_stream`], also saying which connection carries the
    /// stream (relayed or direct, its remote address).
    pub async fn open_stream_with_info(
        &mut self,
        peer: PeerId,
        protocol: StreamProtocol,
    ) -> Result<(ConnectionInfo, Stream), OpenStreamError> {
        let (reply, answer) = oneshot::channel();
        let req = OpenRequest { protocol, reply };
        match self.shared.route(peer, req) {
            Route::Connection(conn, req) => conn.send(req).await.map_err(|_| closed(peer))?,
            Route::Dialing => {}
            Route::Refused(e) => return Err(e),
        }
        answer.await.map_err(|_| closed(peer))?
    }

    /// Holds connection `conn` back from new streams while its peer has
    /// another connection: opens go on the peer's newest connection that
    /// is not held, and on a held one only when every connection of the
    /// peer is held. For a connection that may not carry streams yet (a
    /// direct connection whose peer has not authenticated); may be called
    /// before the connection is established (from another behaviour's
    /// `handle_established_*`, which runs before ours when it is an
    /// earlier field). Forgotten when the connection closes. False when
    /// too many (4,096) are held already: it is then not held.
    pub fn hold(&self, conn: ConnectionId) -> bool {
        self.shared.hold(conn)
    }

    /// New streams may go on `conn` again (see [`Control::hold`]).
    pub fn release(&self, conn: ConnectionId) {
        self.shared.release(conn);
    }

    /// The connection a stream opened to `peer` now would go on (the
    /// newest not held back, see [`Control::hold`]), and whether it is relayed; `None` when not connected. A
    /// caller whose stream then fails learns which path to suspect (a new
    /// connection may come up in between: this is a hint, not a promise).
    pub fn newest_connection(&self, peer: &PeerId) -> Option<(ConnectionId, bool)> {
        self.shared.newest(peer)
    }

    /// Accepts inbound streams of `protocol` until the returned
    /// [`IncomingStreams`] is dropped; afterwards the protocol is no longer
    /// offered, so peers get "unsupported protocol".
    pub fn accept(
        &mut self,
        protocol: StreamProtocol,
    ) -> Result<IncomingStreams, AlreadyRegistered> {
        let (queue, id) = self.shared.accept(protocol.clone())?;
        Ok(IncomingStreams {
            queue,
            shared: self.shared.clone(),
            protocol,
            id,
        })
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

    /// Counts one inbound stream that our caller refused on the connection
    /// `info` names, and returns that connection's refusals so far; `None`
    /// when the connection is already gone. The count lives with the
    /// connection's other state and goes with it, so a caller can bound
    /// what one connection may cost it in refusals without a table of its
    /// own.
    pub fn count_refused(&self, info: &ConnectionInfo) -> Option<u32> {
        self.shared.count_refused(info.connection)
    }

    /// Asks the swarm to close the connection `info` names (all its
    /// streams with it). True the first time for a live connection; later
    /// asks change nothing, so each connection is queued at most once.
    pub fn close_connection(&self, info: &ConnectionInfo) -> bool {
        self.shared.request_close(info.connection)
    }

    /// Tells when connection `conn` (a stream's
    /// [`ConnectionInfo::connection`]) is gone: closed by either side,
    /// found dead (failed pings), or failed. Already closed for a
    /// connection that is not live. A stream whose connection is gone
    /// fails when polled (see [`crate::yamux`]); this is for holders that
    /// are not polling it (a call half-closed by its caller, waiting on its
    /// backend).
    pub fn closed(&self, conn: ConnectionId) -> ConnectionClosed {
        ConnectionClosed(self.shared.closed(conn))
    }

    /// How many opens were refused because `limit` was reached (same
    /// numbers as `agentmesh_streams_pending_opens_refused_total`).
    pub fn pending_opens_refused(&self, limit: PendingLimit) -> u64 {
        self.shared
            .refused
            .get_or_create(&RefusedLabels { limit })
            .get()
    }

    /// Sizes of the internal maps, so tests can assert nothing is left
    /// behind after connections close.
    #[doc(hidden)]
    pub fn debug_sizes(&self) -> DebugSizes {
        self.shared.debug_sizes()
    }
}

/// Whether a connection is gone, and a wait for it ([`Control::closed`]).
/// Cheap to clone; every clone tells of the same connection.
#[derive(Debug, Clone)]
pub struct ConnectionClosed(CancellationToken);

impl ConnectionClosed {
    /// Whether the connection is gone now.
    pub fn is_closed(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Completes once the connection is gone (at once if it is already).
    pub fn wait(&self) -> WaitForCancellationFuture<'_> {
        self.0.cancelled()
    }

    /// A signal of no connection, fired by [`ConnectionClosed::fire`]:
    /// for tests of code that waits on one.
    #[doc(hidden)]
    pub fn unattached() -> Self {
        Self(CancellationToken::new())
    }

    /// Fires a signal made by [`ConnectionClosed::unattached`].
    #[doc(hidden)]
    pub fn fire(&self) {
        self.0.cancel();
    }
}

fn closed(peer: PeerId) -> OpenStreamError {
    OpenStreamError::Io(io::Error::new(
        io::ErrorKind::ConnectionReset,
        format!("connection to {peer} closed before the stream was opened"),
    ))
}

/// The inbound streams of one protocol, each with the connection it came on
/// (peer, connection id, remote address, relayed or not), in arrival order
/// from a bounded queue shared fairly by peer (see
/// [`Config::inbound_queue_per_protocol`](crate::Config)). Dropping it
/// unregisters the protocol and drops what is queued.
#[must_use = "streams wait (and then get dropped) unless this is polled"]
pub struct IncomingStreams {
    queue: Arc<InboundQueue>,
    shared: Arc<Shared>,
    protocol: StreamProtocol,
    id: u64,
}

impl futures::Stream for IncomingStreams {
    type Item = (ConnectionInfo, Stream);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.queue.poll_pop(cx).map(Some)
    }
}

impl Drop for IncomingStreams {
    fn drop(&mut self) {
        self.shared.unregister(&self.protocol, self.id);
        self.queue.close();
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::Poll;

    use super::*;
    use crate::PendingOpenLimits;

    type Open = Pin<Box<dyn Future<Output = Result<Stream, OpenStreamError>> + Send>>;

    /// An open to `peer` that owns its control, so many can wait at once.
    fn open(control: &Control, peer: PeerId) -> Open {
        let mut c = control.clone();
        Box::pin(async move { c.open_stream(peer, StreamProtocol::new("/t/1")).await })
    }

    /// Polls once. No swarm drives the behaviour here, so an open that is
    /// not refused stays parked waiting for its dial.
    fn poll_once(f: &mut Open) -> Poll<Result<Stream, OpenStreamError>> {
        f.as_mut()
            .poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
    }

    fn limits(per_peer: usize, total: usize) -> Control {
        let limits = PendingOpenLimits {
            max_pending_opens_per_peer: per_peer,
            max_pending_opens_total: total,
        };
        Control::new(Arc::new(Shared::new(1, limits)))
    }

    #[test]
    fn opens_beyond_the_per_peer_bound_are_refused_while_another_peer_queues() {
        let control = limits(3, 100);
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut parked: Vec<Open> = (0..3).map(|_| open(&control, a)).collect();
        for f in &mut parked {
            assert!(poll_once(f).is_pending(), "the first 3 opens to a wait");
        }
        match poll_once(&mut open(&control, a)) {
            Poll::Ready(Err(OpenStreamError::TooManyPending { peer, limit, max })) => {
                assert_eq!((peer, limit, max), (a, PendingLimit::PerPeer, 3));
            }
            other => panic!("4th open to a not refused: {:?}", other.map(|r| r.err())),
        }
        let mut to_b = open(&control, b);
        assert!(poll_once(&mut to_b).is_pending(), "b still queues");
        assert_eq!(control.pending_opens_refused(PendingLimit::PerPeer), 1);
        assert_eq!(control.pending_opens_refused(PendingLimit::Total), 0);
        let sizes = control.debug_sizes();
        assert_eq!((sizes.pending_dials, sizes.pending_opens), (2, 4));

        // A caller that gave up frees its place.
        parked.pop();
        let mut again = open(&control, a);
        assert!(poll_once(&mut again).is_pending());
        assert_eq!(control.debug_sizes().pending_opens, 4);
    }

    #[test]
    fn opens_beyond_the_total_bound_are_refused_until_a_caller_gives_up() {
        let control = limits(10, 3);
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut parked = vec![open(&control, a), open(&control, a), open(&control, b)];
        for f in &mut parked {
            assert!(poll_once(f).is_pending());
        }
        let refused = poll_once(&mut open(&control, c));
        let Poll::Ready(Err(e @ OpenStreamError::TooManyPending { .. })) = refused else {
            panic!("open beyond the total bound not refused");
        };
        assert!(
            e.to_string()
                .contains("3 opens already wait for dials to all peers together"),
            "{e}"
        );
        assert_eq!(control.pending_opens_refused(PendingLimit::Total), 1);
        // The refused peer left no entry behind.
        assert_eq!(control.debug_sizes().pending_dials, 2);

        drop(parked.remove(2));
        let mut to_c = open(&control, c);
        assert!(
            poll_once(&mut to_c).is_pending(),
            "b's caller gave up: c queues"
        );
        let sizes = control.debug_sizes();
        assert_eq!((sizes.pending_dials, sizes.pending_opens), (2, 3));
    }
}
