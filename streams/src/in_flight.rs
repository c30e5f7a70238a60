//! Outbound dials in flight per peer, so one failed dial fails the opens
//! waiting for that peer only when no other dial to it is still under way.
//!
//! A peer can be dialed several ways at once: the open's own dial, the
//! embedder's dial for a call, a hole punch (libp2p-dcutr dials the peer
//! while a relayed connection to it may be closing). Failing every waiting
//! open on the first failure would blame a punch's failure on a caller
//! whose connection was about to come up on another dial. The swarm tells
//! every behaviour about every outbound dial before it starts
//! (`handle_pending_outbound_connection`) and ends each with either an
//! established connection or a `DialFailure`, so the set stays exact.

use std::collections::HashMap;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;

/// Dials tracked at most, all peers together. Past it a dial is not
/// tracked, and a failure with nothing tracked for its peer fails the
/// waiting opens as before: the bound costs precision, never a lost
/// failure.
pub(crate) const MAX_TRACKED_DIALS: usize = 4096;

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    by_peer: HashMap<PeerId, Vec<ConnectionId>>,
    total: usize,
}

impl InFlight {
    /// A dial to `peer` started as connection `id`.
    pub(crate) fn started(&mut self, peer: PeerId, id: ConnectionId) {
        if self.total >= MAX_TRACKED_DIALS {
            return;
        }
        self.by_peer.entry(peer).or_default().push(id);
        self.total += 1;
    }

    /// The dial `id` to `peer` ended (established or failed); returns
    /// whether another dial to `peer` is still in flight.
    pub(crate) fn ended(&mut self, peer: PeerId, id: ConnectionId) -> bool {
        let Some(ids) = self.by_peer.get_mut(&peer) else {
            return false;
        };
        let before = ids.len();
        ids.retain(|d| *d != id);
        self.total -= before - ids.len();
        let others = !ids.is_empty();
        if !others {
            self.by_peer.remove(&peer);
        }
        others
    }

    /// Dials tracked, all peers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_whether_another_dial_to_the_peer_is_still_under_way() {
        let mut f = InFlight::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        let (d1, d2, d3) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
            ConnectionId::new_unchecked(3),
        );
        f.started(a, d1);
        f.started(a, d2);
        f.started(b, d3);
        assert!(f.ended(a, d1), "d2 still dials a");
        assert!(!f.ended(a, d2), "nothing left for a");
        // An end never seen started (tracked past the bound, or another
        // behaviour denied it first): nothing else is known in flight.
        assert!(!f.ended(a, ConnectionId::new_unchecked(9)));
        assert!(!f.ended(b, d3));
        assert_eq!(f.len(), 0);
        assert!(f.by_peer.is_empty());
    }

    #[test]
    fn tracking_is_bounded_and_a_dial_past_the_bound_fails_as_before() {
        let mut f = InFlight::default();
        let p = PeerId::random();
        for i in 0..MAX_TRACKED_DIALS + 10 {
            f.started(PeerId::random(), ConnectionId::new_unchecked(i));
        }
        assert_eq!(f.len(), MAX_TRACKED_DIALS);
        let late = ConnectionId::new_unchecked(MAX_TRACKED_DIALS + 20);
        f.started(p, late);
        assert!(!f.ended(p, late));
        assert_eq!(f.len(), MAX_TRACKED_DIALS);
    }
}
