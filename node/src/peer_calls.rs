//! Calls in flight per peer (either direction), and since when a peer has
//! had none. The engine closes a relayed connection to a peer once the
//! peer has been idle for `--relayed-idle-secs` (see
//! [`crate::config::ConnectionConfig::relayed_idle`]): a router caps the circuits
//! to one destination, and a popular provider would otherwise be held at
//! that cap by callers whose connections merely wait for the 30 s idle
//! timeout. A caller that calls again within the window reuses the circuit.
//!
//! A call is also counted on the connection that carries it, once known
//! ([`PeerCall::carried_by`]): a router let go after its go-away is kept
//! connected while a relayed connection through it carries a call (see
//! `engine::linger`), so a drain never cuts a call already streaming.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use parking_lot::Mutex;
use tokio::time::Instant;

/// What [`PeerCalls::idle`] knows about a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity {
    /// A call to or from the peer is being set up or in flight.
    Busy,
    /// The last call ended at this instant.
    IdleSince(Instant),
    /// No call seen (or forgotten).
    Unknown,
}

#[derive(Debug)]
struct Entry {
    active: usize,
    /// Of `active`, the calls whose connection is known.
    carried: usize,
    idle_since: Instant,
}

/// What a relayed connection carries, as `engine::linger` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carries {
    /// A call whose stream is on this connection.
    Call,
    /// No call of its own, but a call to or from its peer is being set up
    /// and may still open its stream on it.
    Maybe,
    /// Nothing.
    Nothing,
}

/// Calls in flight per peer, and per connection once known.
#[derive(Debug, Default)]
pub(crate) struct PeerCalls {
    by_peer: Mutex<HashMap<PeerId, Entry>>,
    /// Calls in flight per connection carrying them (entries removed at 0,
    /// so bounded by the calls in flight).
    by_conn: Mutex<HashMap<ConnectionId, usize>>,
}

impl PeerCalls {
    /// A call to or from `peer` begins; it counts until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>, peer: PeerId) -> PeerCall {
        let mut m = self.by_peer.lock();
        let e = m.entry(peer).or_insert(Entry {
            active: 0,
            carried: 0,
            idle_since: Instant::now(),
        });
        e.active += 1;
        PeerCall {
            calls: self.clone(),
            peer,
            conn: None,
        }
    }

    /// What connection `conn` to `peer` carries: a call of its own, maybe
    /// one (a call to or from `peer` not yet on a connection), or nothing.
    pub(crate) fn carries(&self, peer: &PeerId, conn: ConnectionId) -> Carries {
        if self.by_conn.lock().get(&conn).is_some_and(|n| *n > 0) {
            return Carries::Call;
        }
        match self.by_peer.lock().get(peer) {
            Some(e) if e.active > e.carried => Carries::Maybe,
            _ => Carries::Nothing,
        }
    }

    /// Whether `peer` has a call in flight, or since when it has not.
    pub(crate) fn idle(&self, peer: &PeerId) -> Activity {
        match self.by_peer.lock().get(peer) {
            Some(e) if e.active > 0 => Activity::Busy,
            Some(e) => Activity::IdleSince(e.idle_since),
            None => Activity::Unknown,
        }
    }

    /// Forgets peers idle for longer than `older_than` (bounds the map to
    /// peers called recently).
    pub(crate) fn prune(&self, now: Instant, older_than: Duration) {
        self.by_peer.lock().retain(|_, e| {
            e.active > 0 || now.saturating_duration_since(e.idle_since) < older_than
        });
    }

    fn end(&self, peer: &PeerId, conn: Option<ConnectionId>) {
        if let Some(c) = conn {
            let mut by_conn = self.by_conn.lock();
            if let Some(n) = by_conn.get_mut(&c) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by_conn.remove(&c);
                }
            }
        }
        let mut m = self.by_peer.lock();
        if let Some(e) = m.get_mut(peer) {
            e.active = e.active.saturating_sub(1);
            if conn.is_some() {
                e.carried = e.carried.saturating_sub(1);
            }
            if e.active == 0 {
                e.idle_since = Instant::now();
            }
        }
    }
}

/// One call to or from a peer, counted while alive.
#[derive(Debug)]
pub(crate) struct PeerCall {
    calls: Arc<PeerCalls>,
    peer: PeerId,
    conn: Option<ConnectionId>,
}

impl PeerCall {
    /// The call's stream travels on `conn`: counted there until the call
    /// ends (once; a second connection is ignored).
    pub(crate) fn carried_by(&mut self, conn: ConnectionId) {
        if self.conn.is_some() {
            return;
        }
        self.conn = Some(conn);
        *self.calls.by_conn.lock().entry(conn).or_insert(0) += 1;
        if let Some(e) = self.calls.by_peer.lock().get_mut(&self.peer) {
            e.carried += 1;
        }
    }
}

impl Drop for PeerCall {
    fn drop(&mut self) {
        self.calls.end(&self.peer, self.conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_busy_while_any_call_lives_and_idle_from_the_last_end() {
        let calls = Arc::new(PeerCalls::default());
        let (p, q) = (PeerId::random(), PeerId::random());
        assert_eq!(calls.idle(&p), Activity::Unknown);
        let a = calls.begin(p);
        let b = calls.begin(p);
        assert_eq!(calls.idle(&p), Activity::Busy);
        drop(a);
        assert_eq!(calls.idle(&p), Activity::Busy);
        let before = Instant::now();
        drop(b);
        let Activity::IdleSince(t) = calls.idle(&p) else {
            panic!("not idle: {:?}", calls.idle(&p));
        };
        assert!(t >= before);
        assert_eq!(calls.idle(&q), Activity::Unknown);
        // Busy peers are never forgotten; idle ones after `older_than`.
        let c = calls.begin(q);
        calls.prune(
            Instant::now() + Duration::from_secs(100),
            Duration::from_secs(10),
        );
        assert_eq!(calls.idle(&p), Activity::Unknown);
        assert_eq!(calls.idle(&q), Activity::Busy);
        drop(c);
        calls.prune(Instant::now(), Duration::from_secs(10));
        assert!(matches!(calls.idle(&q), Activity::IdleSince(_)));
    }

    #[test]
    fn a_call_is_counted_on_its_connection_once_known() {
        let calls = Arc::new(PeerCalls::default());
        let p = PeerId::random();
        let (a, b) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        assert_eq!(calls.carries(&p, a), Carries::Nothing);
        // Being set up: any connection to the peer may still get its stream.
        let mut first = calls.begin(p);
        assert_eq!(calls.carries(&p, a), Carries::Maybe);
        first.carried_by(a);
        assert_eq!(calls.carries(&p, a), Carries::Call);
        assert_eq!(calls.carries(&p, b), Carries::Nothing);
        // Once only: a second connection is ignored.
        first.carried_by(b);
        assert_eq!(calls.carries(&p, b), Carries::Nothing);
        let mut second = calls.begin(p);
        assert_eq!(calls.carries(&p, b), Carries::Maybe);
        second.carried_by(b);
        drop(first);
        assert_eq!(calls.carries(&p, a), Carries::Nothing);
        assert_eq!(calls.carries(&p, b), Carries::Call);
        drop(second);
        assert_eq!(calls.carries(&p, b), Carries::Nothing);
        assert!(calls.by_conn.lock().is_empty(), "entries go at zero");
    }
}
