//! Our connections per peer, and for a relayed one the router it goes
//! through. A call retrying on a fresh route uses this to close relayed
//! connections to a provider through routers it no longer lists (or whose
//! route just failed) and to wait until they are gone: `libp2p-stream`
//! opens a stream on any connection to the peer, so a dying one left in
//! place could take the retry down with it.

use std::collections::HashMap;

use libp2p::core::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};

/// The router a relayed address goes through: the `/p2p/R` before `/p2p-circuit`.
pub(crate) fn relay_of(addr: &Multiaddr) -> Option<PeerId> {
    let mut last = None;
    for p in addr.iter() {
        match p {
            Protocol::P2p(id) => last = Some(id),
            Protocol::P2pCircuit => return last,
            _ => {}
        }
    }
    None
}

/// Open connections per peer.
#[derive(Debug, Default)]
pub(crate) struct Conns {
    by_peer: HashMap<PeerId, Vec<(ConnectionId, Option<PeerId>)>>,
}

impl Conns {
    /// A connection to `peer` at `addr` is up.
    pub(crate) fn established(&mut self, peer: PeerId, id: ConnectionId, addr: &Multiaddr) {
        self.by_peer
            .entry(peer)
            .or_default()
            .push((id, relay_of(addr)));
    }

    /// A connection closed.
    pub(crate) fn closed(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(v) = self.by_peer.get_mut(&peer) {
            v.retain(|(c, _)| *c != id);
            if v.is_empty() {
                self.by_peer.remove(&peer);
            }
        }
    }

    /// Relayed connections to `peer` through a router not in `keep`.
    pub(crate) fn stale(&self, peer: &PeerId, keep: &[PeerId]) -> Vec<ConnectionId> {
        self.by_peer.get(peer).map_or_else(Vec::new, |v| {
            v.iter()
                .filter(|(_, via)| via.is_some_and(|r| !keep.contains(&r)))
                .map(|(c, _)| *c)
                .collect()
        })
    }

    /// Whether any of `ids` is still open to `peer`.
    pub(crate) fn any_open(&self, peer: &PeerId, ids: &[ConnectionId]) -> bool {
        self.by_peer
            .get(peer)
            .is_some_and(|v| v.iter().any(|(c, _)| ids.contains(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_connections_through_routers_not_kept_are_stale() {
        let (r1, r2, p) = (PeerId::random(), PeerId::random(), PeerId::random());
        let via = |r: PeerId| -> Multiaddr {
            format!("/ip4/127.0.0.1/tcp/1/p2p/{r}/p2p-circuit/p2p/{p}")
                .parse()
                .expect("addr")
        };
        assert_eq!(relay_of(&via(r1)), Some(r1));
        let direct: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().expect("addr");
        assert_eq!(relay_of(&direct), None);
        let (a, b, c) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
            ConnectionId::new_unchecked(3),
        );
        let mut conns = Conns::default();
        conns.established(p, a, &via(r1));
        conns.established(p, b, &via(r2));
        conns.established(p, c, &direct);
        // Direct connections are never stale; relayed ones are by router.
        assert_eq!(conns.stale(&p, &[r2]), vec![a]);
        assert!(conns.any_open(&p, &[a]));
        conns.closed(p, a);
        assert!(!conns.any_open(&p, &[a]));
        assert!(conns.stale(&p, &[r2]).is_empty());
        conns.closed(p, b);
        conns.closed(p, c);
        assert!(conns.by_peer.is_empty());
    }
}
