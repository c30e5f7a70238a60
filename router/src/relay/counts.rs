//! Live relay reservations and circuits, counted from the relay's events
//! by the swarm loop (behind `agentmesh_router_reservations` and
//! `agentmesh_router_circuits`; the loop publishes the circuit count to the
//! drain through its tables).

/// Active relay reservations per peer, from the relay's events.
///
/// libp2p-relay 0.22 reports `ReservationClosed` for every closed connection
/// it saw, whether it held a reservation or not (denied, transit, peer
/// routers), so a gauge decremented on every close runs negative. Closes are
/// matched here against the reservations seen accepted; a close for a peer
/// without one is ignored. (A peer with two connections, one reserved, can
/// end its count early; it never goes below zero.)
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    per_peer: std::collections::HashMap<libp2p::PeerId, usize>,
    total: usize,
}

impl Reservations {
    /// A reservation accepted; a renewal of one already counted adds nothing.
    pub(crate) fn accepted(&mut self, peer: libp2p::PeerId, renewed: bool) {
        let n = self.per_peer.entry(peer).or_insert(0);
        if !renewed || *n == 0 {
            *n += 1;
            self.total += 1;
        }
    }

    /// A reservation closed or timed out; ignored if `peer` holds none.
    pub(crate) fn ended(&mut self, peer: &libp2p::PeerId) {
        if let Some(n) = self.per_peer.get_mut(peer) {
            *n = n.saturating_sub(1);
            self.total = self.total.saturating_sub(1);
            if *n == 0 {
                self.per_peer.remove(peer);
                crate::shrink::ShrinkSparse::shrink_sparse(&mut self.per_peer);
            }
        }
    }

    /// Peers holding at least one reservation.
    pub(crate) fn peers(&self) -> usize {
        self.per_peer.len()
    }

    /// Reservations held now.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

/// Live relayed circuits, behind `agentmesh_router_circuits`.
///
/// libp2p-relay 0.22 can report `CircuitClosed` twice for one circuit: once
/// when one of its connections closes (`on_connection_closed`) and again when
/// the other side's handler ends the circuit (the handler event is forwarded
/// whether or not the circuit was still known). A gauge decremented on every
/// close ran negative (−61 after 1,200 members). Closes are matched here
/// against circuits seen accepted per (source, destination); an unmatched
/// close is ignored. (Two circuits between the same pair, one closed twice,
/// can end the count early; it never goes below zero.)
#[derive(Debug, Default)]
pub(crate) struct Circuits {
    per_pair: std::collections::HashMap<(libp2p::PeerId, libp2p::PeerId), usize>,
    total: usize,
}

impl Circuits {
    /// A circuit from `src` to `dst` was accepted.
    pub(crate) fn accepted(&mut self, src: libp2p::PeerId, dst: libp2p::PeerId) {
        *self.per_pair.entry((src, dst)).or_insert(0) += 1;
        self.total += 1;
    }

    /// A circuit from `src` to `dst` closed; ignored if none is counted.
    pub(crate) fn closed(&mut self, src: libp2p::PeerId, dst: libp2p::PeerId) {
        if let Some(n) = self.per_pair.get_mut(&(src, dst)) {
            *n = n.saturating_sub(1);
            self.total = self.total.saturating_sub(1);
            if *n == 0 {
                self.per_pair.remove(&(src, dst));
                crate::shrink::ShrinkSparse::shrink_sparse(&mut self.per_pair);
            }
        }
    }

    /// Circuits live now.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libp2p::PeerId;

    #[test]
    fn closes_without_a_reservation_and_renewals_do_not_move_the_count() {
        let mut r = Reservations::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        // Connections that never reserved (denied, transit) close.
        r.ended(&c);
        r.ended(&c);
        assert_eq!(r.total(), 0);
        r.accepted(a, false);
        r.accepted(a, true);
        r.accepted(a, true);
        r.accepted(b, false);
        assert_eq!(r.total(), 2);
        // A renewal reported for a reservation we never saw counts once.
        r.accepted(c, true);
        assert_eq!(r.total(), 3);
        r.ended(&a);
        r.ended(&a);
        r.ended(&c);
        assert_eq!(r.total(), 1);
        r.ended(&b);
        r.ended(&b);
        assert_eq!(r.total(), 0);
        assert!(r.per_peer.is_empty(), "no entry left behind");
    }

    #[test]
    fn a_circuit_closed_twice_is_counted_once() {
        let mut c = Circuits::default();
        let (a, b, d) = (PeerId::random(), PeerId::random(), PeerId::random());
        c.closed(a, b);
        assert_eq!(c.total(), 0, "a close without a circuit moves nothing");
        c.accepted(a, b);
        c.accepted(d, b);
        assert_eq!(c.total(), 2);
        // libp2p-relay reports the close from the connection and the handler.
        c.closed(a, b);
        c.closed(a, b);
        assert_eq!(c.total(), 1);
        c.closed(d, b);
        assert_eq!(c.total(), 0);
        assert!(c.per_pair.is_empty(), "no entry left behind");
    }
}
