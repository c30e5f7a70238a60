//! The state shared by the behaviour, its connection handlers and every
//! control handle: registered protocols, live connections,
//! open requests waiting for a dial (bounded per peer and in total), and
//! the drop and refusal counters.
//!
//! Every per-connection entry is added when a handler is created and removed
//! when that handler is dropped (or the swarm reports the connection
//! closed, whichever comes first), so nothing outlives its connection.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::Arc;
use std::task::Waker;

use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, Stream, StreamProtocol};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::{AlreadyRegistered, OpenStreamError};
use crate::info::ConnectionInfo;
use crate::labels::{DropLabels, DropReason, PendingLimit, RefusedLabels};
use crate::queue::{FairQueue, Pushed};
use crate::{OPEN_QUEUE_PER_CONNECTION, PendingOpenLimits};

/// A protocol's queue of negotiated inbound streams.
pub(crate) type InboundQueue = FairQueue<(ConnectionInfo, Stream)>;

/// Sizes of every internal map and queue, for tests asserting that nothing
/// is left behind once connections are gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DebugSizes {
    /// Registered inbound protocols (one per live `IncomingStreams`).
    pub protocols: usize,
    /// Live connections.
    pub connections: usize,
    /// Peers with at least one live connection.
    pub peers: usize,
    /// Peers with open requests waiting for a dial.
    pub pending_dials: usize,
    /// Open requests waiting for a dial, all peers together.
    pub pending_opens: usize,
    /// Dials requested but not yet handed to the swarm.
    pub queued_dials: usize,
    /// Closes requested but not yet handed to the swarm.
    pub queued_closes: usize,
}

/// One `open_stream` call on its way to a connection.
#[derive(Debug)]
pub struct OpenRequest {
    pub(crate) protocol: StreamProtocol,
    pub(crate) reply: oneshot::Sender<Result<(ConnectionInfo, Stream), OpenStreamError>>,
}

/// Where an open request goes.
pub(crate) enum Route {
    /// Hand it to this connection's handler.
    Connection(mpsc::Sender<OpenRequest>, OpenRequest),
    /// Parked until a dial to the peer connects or fails.
    Dialing,
    /// Refused: too many opens already wait for a dial.
    Refused(OpenStreamError),
}

struct Registration {
    id: u64,
    queue: Arc<InboundQueue>,
}

struct Conn {
    peer: PeerId,
    /// A relayed circuit rather than a direct connection.
    relayed: bool,
    requests: mpsc::Sender<OpenRequest>,
    /// Inbound streams our caller refused on this connection (see
    /// [`Shared::count_refused`]); forgotten with the connection.
    refused: u32,
    /// A close was asked for (at most one close is queued per connection,
    /// so the close queue is bounded by the live connections).
    closing: bool,
    /// Cancelled when the connection goes (see [`Shared::closed`]).
    closed: CancellationToken,
}

/// What the behaviour asks the swarm for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Close this connection of this peer.
    Close(PeerId, ConnectionId),
    /// Dial this peer.
    Dial(PeerId),
}

#[derive(Default)]
struct Inner {
    protocols: HashMap<StreamProtocol, Registration>,
    connections: HashMap<ConnectionId, Conn>,
    /// Live connections of each peer, oldest first.
    peers: HashMap<PeerId, Vec<ConnectionId>>,
    pending: HashMap<PeerId, Vec<OpenRequest>>,
    /// Requests in `pending`, all peers together (kept, not summed: a sum
    /// would cost one step per pending peer on every open).
    pending_total: usize,
    dials: VecDeque<PeerId>,
    /// Connections our caller asked to close, oldest first; each at most
    /// once (its `closing` flag), so bounded by `connections`.
    closes: VecDeque<(PeerId, ConnectionId)>,
    /// The behaviour's waker, for a dial or a close to hand out.
    dial_waker: Option<Waker>,
    next_registration: u64,
    /// Connections held back from new streams while the peer has another
    /// (see [`Shared::hold`]); may name one not registered yet. At most
    /// [`MAX_HELD`].
    held: HashSet<ConnectionId>,
}

/// Connections held back at most (see [`Shared::hold`]).
pub(crate) const MAX_HELD: usize = 4096;

/// The connection a new stream to `peer` goes on: its newest that is not
/// held back, else its newest.
fn pick(inner: &Inner, peer: &PeerId) -> Option<ConnectionId> {
    let list = inner.peers.get(peer)?;
    list.iter()
        .rev()
        .find(|id| !inner.held.contains(id))
        .or(list.last())
        .copied()
}

/// See the module doc.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    inbound_queue: usize,
    max_pending_per_peer: usize,
    max_pending_total: usize,
    pub(crate) dropped: Family<DropLabels, Counter>,
    pub(crate) refused: Family<RefusedLabels, Counter>,
}

impl Shared {
    pub(crate) fn new(inbound_queue: usize, limits: PendingOpenLimits) -> Self {
        let refused = Family::default();
        for limit in PendingLimit::ALL {
            let _ = refused.get_or_create(&RefusedLabels { limit });
        }
        Self {
            inner: Mutex::new(Inner::default()),
            inbound_queue: inbound_queue.max(1),
            max_pending_per_peer: limits.max_pending_opens_per_peer.max(1),
            max_pending_total: limits.max_pending_opens_total.max(1),
            dropped: Family::default(),
            refused,
        }
    }

    pub(crate) fn debug_sizes(&self) -> DebugSizes {
        let inner = self.inner.lock();
        DebugSizes {
            protocols: inner.protocols.len(),
            connections: inner.connections.len(),
            peers: inner.peers.len(),
            pending_dials: inner.pending.len(),
            pending_opens: inner.pending_total,
            queued_dials: inner.dials.len(),
            queued_closes: inner.closes.len(),
        }
    }

    /// Registers `protocol` for inbound streams: the queue they arrive on
    /// and the registration's id (for [`Shared::unregister`]).
    pub(crate) fn accept(
        &self,
        protocol: StreamProtocol,
    ) -> Result<(Arc<InboundQueue>, u64), AlreadyRegistered> {
        let mut inner = self.inner.lock();
        if inner
            .protocols
            .get(&protocol)
            .is_some_and(|r| !r.queue.is_closed())
        {
            return Err(AlreadyRegistered(protocol));
        }
        for reason in DropReason::ALL {
            let _ = self.dropped.get_or_create(&DropLabels {
                protocol: protocol.to_string(),
                reason,
            });
        }
        let queue = Arc::new(FairQueue::new(self.inbound_queue));
        let id = inner.next_registration;
        inner.next_registration += 1;
        inner.protocols.insert(
            protocol,
            Registration {
                id,
                queue: queue.clone(),
            },
        );
        Ok((queue, id))
    }

    /// Removes registration `id` of `protocol` (if it is still the current
    /// one); its queue is closed by its holder.
    pub(crate) fn unregister(&self, protocol: &StreamProtocol, id: u64) {
        let mut inner = self.inner.lock();
        if inner.protocols.get(protocol).is_some_and(|r| r.id == id) {
            inner.protocols.remove(protocol);
        }
    }

    /// The protocols we currently accept, offered on every inbound stream.
    pub(crate) fn supported(&self) -> Vec<StreamProtocol> {
        let mut inner = self.inner.lock();
        inner.protocols.retain(|_, r| !r.queue.is_closed());
        inner.protocols.keys().cloned().collect()
    }

    /// Delivers a negotiated inbound stream into its protocol's fair queue
    /// (see [`FairQueue`]), or drops and counts it; a stream it preempts is
    /// dropped and counted too.
    pub(crate) fn inbound(&self, info: &ConnectionInfo, stream: Stream, protocol: StreamProtocol) {
        let queue = self
            .inner
            .lock()
            .protocols
            .get(&protocol)
            .map(|r| r.queue.clone());
        let (peer, reason) = match queue {
            None => (info.peer, DropReason::NotAccepted),
            Some(q) => match q.push(info.peer, (info.clone(), stream)) {
                Pushed::Queued => return,
                Pushed::Preempted((old, _)) => (old.peer, DropReason::Preempted),
                Pushed::Full(_) => (info.peer, DropReason::QueueFull),
                Pushed::Closed(_) => (info.peer, DropReason::NotAccepted),
            },
        };
        tracing::debug!(%peer, %protocol, ?reason, "inbound stream dropped");
        self.dropped
            .get_or_create(&DropLabels {
                protocol: protocol.to_string(),
                reason,
            })
            .inc();
    }

    /// Registers a new connection's handler; returns its request queue and
    /// the requests that were waiting for a connection to `peer`.
    pub(crate) fn connection_up(
        &self,
        conn: ConnectionId,
        peer: PeerId,
        relayed: bool,
    ) -> (mpsc::Receiver<OpenRequest>, Vec<OpenRequest>) {
        let (requests, receiver) = mpsc::channel(OPEN_QUEUE_PER_CONNECTION);
        let mut inner = self.inner.lock();
        inner.connections.insert(
            conn,
            Conn {
                peer,
                relayed,
                requests,
                refused: 0,
                closing: false,
                closed: CancellationToken::new(),
            },
        );
        inner.peers.entry(peer).or_default().push(conn);
        let waiting = inner.pending.remove(&peer).unwrap_or_default();
        inner.pending_total = inner.pending_total.saturating_sub(waiting.len());
        shrink_sparse(&mut inner.pending);
        (receiver, waiting)
    }

    /// Forgets a connection (idempotent: called from the handler's drop and
    /// on the swarm's connection-closed event).
    pub(crate) fn connection_down(&self, conn: ConnectionId) {
        let mut inner = self.inner.lock();
        inner.held.remove(&conn);
        let Some(c) = inner.connections.remove(&conn) else {
            return;
        };
        c.closed.cancel();
        if let Some(list) = inner.peers.get_mut(&c.peer) {
            list.retain(|id| *id != conn);
            if list.is_empty() {
                inner.peers.remove(&c.peer);
            }
        }
        shrink_sparse(&mut inner.connections);
        shrink_sparse(&mut inner.peers);
    }

    /// The connection the next stream to `peer` opens on (its newest), and
    /// whether it is relayed.
    pub(crate) fn newest(&self, peer: &PeerId) -> Option<(ConnectionId, bool)> {
        let inner = self.inner.lock();
        let id = pick(&inner, peer)?;
        inner.connections.get(&id).map(|c| (id, c.relayed))
    }

    /// Holds connection `conn` back from new streams while its peer has
    /// another connection (it is still used when it is the peer's only
    /// one); may be called before the connection registers. False when
    /// [`MAX_HELD`] connections are held already (it is then not held).
    pub(crate) fn hold(&self, conn: ConnectionId) -> bool {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        if inner.held.len() >= MAX_HELD && !inner.held.contains(&conn) {
            // Held ids of connections that never came up or are gone.
            let live = &inner.connections;
            inner.held.retain(|id| live.contains_key(id));
            if inner.held.len() >= MAX_HELD {
                return false;
            }
        }
        inner.held.insert(conn);
        true
    }

    /// New streams may go on `conn` again.
    pub(crate) fn release(&self, conn: ConnectionId) {
        self.inner.lock().held.remove(&conn);
    }

    /// Picks the newest connection to `peer`, or parks the request and asks
    /// for a dial; refuses it when the peer's (or every peer's) parked
    /// requests are at their bound, so a caller looping on an unreachable
    /// peer cannot queue without end while each dial runs to its timeout.
    pub(crate) fn route(&self, peer: PeerId, req: OpenRequest) -> Route {
        let mut inner = self.inner.lock();
        let conn = pick(&inner, &peer);
        if let Some(c) = conn.and_then(|id| inner.connections.get(&id)) {
            return Route::Connection(c.requests.clone(), req);
        }
        let inner = &mut *inner;
        // Requests whose callers gave up need not wait for the dial, nor
        // count against the bounds.
        let waiting_here = match inner.pending.get_mut(&peer) {
            Some(waiting) => {
                let before = waiting.len();
                waiting.retain(|r| !r.reply.is_closed());
                inner.pending_total = inner.pending_total.saturating_sub(before - waiting.len());
                waiting.len()
            }
            None => 0,
        };
        let refused = if waiting_here >= self.max_pending_per_peer {
            Some((PendingLimit::PerPeer, self.max_pending_per_peer))
        } else if inner.pending_total >= self.max_pending_total
            && prune_gone(inner) >= self.max_pending_total
        {
            Some((PendingLimit::Total, self.max_pending_total))
        } else {
            None
        };
        if let Some((limit, max)) = refused {
            if inner.pending.get(&peer).is_some_and(Vec::is_empty) {
                inner.pending.remove(&peer);
            }
            return Route::Refused(self.refuse(peer, limit, max));
        }
        let waiting = inner.pending.entry(peer).or_default();
        let first = waiting.is_empty();
        waiting.push(req);
        inner.pending_total += 1;
        if first {
            inner.dials.push_back(peer);
            if let Some(w) = inner.dial_waker.take() {
                w.wake();
            }
        }
        Route::Dialing
    }

    /// Counts a refused open and says why.
    fn refuse(&self, peer: PeerId, limit: PendingLimit, max: usize) -> OpenStreamError {
        tracing::debug!(%peer, limit = limit.as_str(), max, "open refused: too many waiting for a dial");
        self.refused.get_or_create(&RefusedLabels { limit }).inc();
        OpenStreamError::TooManyPending { peer, limit, max }
    }

    /// Fails the requests waiting for a dial to `peer`.
    pub(crate) fn dial_failed(&self, peer: PeerId, reason: &str) {
        let waiting = {
            let mut inner = self.inner.lock();
            let waiting = inner.pending.remove(&peer);
            let n = waiting.as_ref().map_or(0, Vec::len);
            inner.pending_total = inner.pending_total.saturating_sub(n);
            shrink_sparse(&mut inner.pending);
            waiting
        };
        for r in waiting.into_iter().flatten() {
            let e = io::Error::new(
                io::ErrorKind::NotConnected,
                format!("dial to {peer} failed: {reason}"),
            );
            let _ = r.reply.send(Err(OpenStreamError::Io(e)));
        }
    }

    /// Counts one inbound stream refused on connection `conn`; returns the
    /// connection's refusals so far, or `None` if it is not live (closed
    /// meanwhile: nothing to count against).
    pub(crate) fn count_refused(&self, conn: ConnectionId) -> Option<u32> {
        let mut inner = self.inner.lock();
        let c = inner.connections.get_mut(&conn)?;
        c.refused = c.refused.saturating_add(1);
        Some(c.refused)
    }

    /// The signal that connection `conn` is gone: cancelled when its
    /// handler is dropped or the swarm reports it closed, whichever comes
    /// first (for a close we or the swarm start, the handler goes before
    /// the muxer's closing handshake, so this fires at the start of the
    /// close). Already cancelled for a connection that is not live.
    pub(crate) fn closed(&self, conn: ConnectionId) -> CancellationToken {
        match self.inner.lock().connections.get(&conn) {
            Some(c) => c.closed.clone(),
            None => {
                let gone = CancellationToken::new();
                gone.cancel();
                gone
            }
        }
    }

    /// Asks the swarm to close connection `conn`; true the first time for
    /// a live connection (later asks, and asks for a connection already
    /// gone, change nothing).
    pub(crate) fn request_close(&self, conn: ConnectionId) -> bool {
        let mut inner = self.inner.lock();
        let Some(c) = inner.connections.get_mut(&conn) else {
            return false;
        };
        if std::mem::replace(&mut c.closing, true) {
            return false;
        }
        let peer = c.peer;
        inner.closes.push_back((peer, conn));
        if let Some(w) = inner.dial_waker.take() {
            w.wake();
        }
        true
    }

    /// The next close or dial to hand to the swarm (closes first: they
    /// free resources), or registers `waker` for when there is one. One
    /// lock for both, so nothing queued between two checks is missed.
    pub(crate) fn next(&self, waker: &Waker) -> Option<Next> {
        let mut inner = self.inner.lock();
        while let Some((peer, conn)) = inner.closes.pop_front() {
            // A connection that closed on its own meanwhile needs nothing.
            if inner.connections.contains_key(&conn) {
                return Some(Next::Close(peer, conn));
            }
        }
        if inner.closes.capacity() > KEEP_CAPACITY {
            inner.closes.shrink_to_fit();
        }
        if let Some(peer) = inner.dials.pop_front() {
            return Some(Next::Dial(peer));
        }
        inner.dial_waker = Some(waker.clone());
        None
    }
}

/// Drops the parked requests of every peer whose callers gave up (and the
/// peers left with none); returns how many requests remain. A full sweep,
/// run only when the total bound is reached, so it costs at most that bound.
fn prune_gone(inner: &mut Inner) -> usize {
    inner.pending.retain(|_, waiting| {
        waiting.retain(|r| !r.reply.is_closed());
        !waiting.is_empty()
    });
    inner.pending_total = inner.pending.values().map(Vec::len).sum();
    shrink_sparse(&mut inner.pending);
    inner.pending_total
}

/// Tables this small keep their capacity (not worth a rehash).
const KEEP_CAPACITY: usize = 64;

/// Gives back a table's capacity once it is under a quarter full (rebuilt at
/// twice its length; hysteresis keeps the rehash cost amortised O(1) per
/// removal). A `HashMap` otherwise keeps its largest table: after 5,000
/// members left a router, these two tables alone held 1.8 MiB sized for
/// them (heap profile, ladder/RESULTS.md).
fn shrink_sparse<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > KEEP_CAPACITY && map.len().saturating_mul(4) < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_on(shared: &Shared, peer: PeerId) -> Option<Route> {
        let (reply, _answer) = oneshot::channel();
        let req = OpenRequest {
            protocol: StreamProtocol::new("/t/1"),
            reply,
        };
        Some(shared.route(peer, req))
    }

    #[test]
    fn a_held_connection_is_passed_over_while_the_peer_has_another() {
        let shared = Shared::new(1, PendingOpenLimits::default());
        let peer = PeerId::random();
        let (relayed, direct, later) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
            ConnectionId::new_unchecked(3),
        );
        // Held before it registers, as the direct behaviour does while the
        // swarm sets the connection up.
        assert!(shared.hold(direct));
        let (mut on_relayed, _) = shared.connection_up(relayed, peer, true);
        let (mut on_direct, _) = shared.connection_up(direct, peer, false);
        assert_eq!(shared.newest(&peer), Some((relayed, true)));
        let Some(Route::Connection(tx, req)) = open_on(&shared, peer) else {
            panic!("routed to a connection");
        };
        tx.try_send(req).expect("queued");
        assert!(on_relayed.try_recv().is_ok(), "the open went relayed");
        assert!(on_direct.try_recv().is_err());
        // Released (its peer authenticated): the newest again.
        shared.release(direct);
        assert_eq!(shared.newest(&peer), Some((direct, false)));
        // Every connection held: the newest is still used.
        assert!(shared.hold(direct));
        assert!(shared.hold(relayed));
        assert_eq!(shared.newest(&peer), Some((direct, false)));
        // A newer unheld one wins; a closed connection's hold is forgotten.
        let _l = shared.connection_up(later, peer, false);
        assert_eq!(shared.newest(&peer), Some((later, false)));
        shared.connection_down(direct);
        shared.connection_down(relayed);
        assert!(shared.inner.lock().held.is_empty());
    }

    #[test]
    fn held_connections_are_bounded() {
        let shared = Shared::new(1, PendingOpenLimits::default());
        for i in 0..MAX_HELD {
            assert!(shared.hold(ConnectionId::new_unchecked(i)));
        }
        // None of those came up: pruned to make room.
        assert!(shared.hold(ConnectionId::new_unchecked(MAX_HELD)));
        assert_eq!(shared.inner.lock().held.len(), 1);
        // Live ones are kept: past the bound a new one is not held.
        let peer = PeerId::random();
        let mut keep = Vec::new();
        for i in 0..MAX_HELD {
            let id = ConnectionId::new_unchecked(MAX_HELD + 1 + i);
            keep.push(shared.connection_up(id, peer, false));
            shared.hold(id);
        }
        assert!(!shared.hold(ConnectionId::new_unchecked(usize::MAX)));
        assert!(shared.inner.lock().held.len() <= MAX_HELD);
    }

    #[test]
    fn refusals_and_closes_are_per_live_connection_and_queued_once() {
        let shared = Shared::new(1, PendingOpenLimits::default());
        let (a, b) = (PeerId::random(), PeerId::random());
        let (ca, cb) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        let _ra = shared.connection_up(ca, a, false);
        let _rb = shared.connection_up(cb, b, false);
        assert_eq!(shared.count_refused(ca), Some(1));
        assert_eq!(shared.count_refused(ca), Some(2));
        assert_eq!(shared.count_refused(cb), Some(1), "counted per connection");
        assert!(shared.request_close(ca));
        assert!(!shared.request_close(ca), "queued once");
        let waker = futures::task::noop_waker();
        assert_eq!(shared.next(&waker), Some(Next::Close(a, ca)));
        assert_eq!(shared.next(&waker), None);
        // A close asked for a connection that then goes away is skipped.
        assert!(shared.request_close(cb));
        shared.connection_down(cb);
        assert_eq!(shared.next(&waker), None);
        assert_eq!(shared.count_refused(cb), None, "gone with its connection");
        assert!(!shared.request_close(cb));
        shared.connection_down(ca);
        assert_eq!(shared.debug_sizes().queued_closes, 0);
    }

    #[test]
    fn the_closed_signal_fires_when_the_connection_goes_and_at_once_for_one_gone() {
        let shared = Shared::new(1, PendingOpenLimits::default());
        let (a, ca, cb) = (
            PeerId::random(),
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        let _ra = shared.connection_up(ca, a, false);
        let _rb = shared.connection_up(cb, a, false);
        let (closed_a, closed_b) = (shared.closed(ca), shared.closed(cb));
        assert!(!closed_a.is_cancelled() && !closed_b.is_cancelled());
        shared.connection_down(ca);
        assert!(closed_a.is_cancelled(), "fires when its connection goes");
        assert!(
            !closed_b.is_cancelled(),
            "the peer's other connection lives"
        );
        assert!(
            shared.closed(ca).is_cancelled(),
            "a gone connection: at once"
        );
        assert!(
            shared.closed(ConnectionId::new_unchecked(9)).is_cancelled(),
            "never known: at once"
        );
    }

    #[test]
    fn tables_give_back_capacity_after_a_peak() {
        let shared = Shared::new(1, PendingOpenLimits::default());
        let peers: Vec<PeerId> = (0..2_000).map(|_| PeerId::random()).collect();
        let mut receivers = Vec::new();
        for (i, p) in peers.iter().enumerate() {
            receivers.push(shared.connection_up(ConnectionId::new_unchecked(i), *p, false));
        }
        let peak = shared.inner.lock().connections.capacity();
        assert!(peak >= 2_000);
        for i in 0..peers.len() {
            shared.connection_down(ConnectionId::new_unchecked(i));
        }
        let inner = shared.inner.lock();
        assert!(inner.connections.is_empty() && inner.peers.is_empty());
        assert!(
            inner.connections.capacity() <= KEEP_CAPACITY * 2,
            "connections kept {} slots of {peak}",
            inner.connections.capacity()
        );
        assert!(
            inner.peers.capacity() <= KEEP_CAPACITY * 2,
            "peers kept {}",
            inner.peers.capacity()
        );
    }
}
