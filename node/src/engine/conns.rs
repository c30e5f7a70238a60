//! Our connections per peer, and for a relayed one the router it goes
//! through. A call retrying on a fresh route uses this to close relayed
//! connections to a provider through routers it no longer lists (or whose
//! route just failed) and to wait until they are gone: `agentmesh-streams`
//! opens a stream on the peer's newest connection, which may be a dying
//! one, so leaving it in place could take the retry down with it. The engine also closes relayed
//! connections to peers without calls for `--relayed-idle-secs`
//! ([`Conns::relayed`]).

use std::collections::HashMap;

use libp2p::core::ConnectedPoint;
use libp2p::core::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

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

/// One open connection.
#[derive(Debug, Clone, Copy)]
struct Conn {
    id: ConnectionId,
    /// The router a relayed connection goes through.
    via: Option<PeerId>,
    /// We dialed it.
    outbound: bool,
    /// When it came up.
    since: Instant,
    /// Its router was told it was upgraded away (see
    /// [`Conns::circuits_to_notice`]).
    noticed: bool,
}

/// A relayed connection, as [`Conns::relayed`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Relayed {
    pub(crate) peer: PeerId,
    pub(crate) id: ConnectionId,
    /// We dialed it (we are the caller).
    pub(crate) outbound: bool,
    /// When it came up.
    pub(crate) since: Instant,
}

/// Open connections per peer.
#[derive(Debug, Default)]
pub(crate) struct Conns {
    by_peer: HashMap<PeerId, Vec<Conn>>,
}

impl Conns {
    /// A connection to `peer` is up (`endpoint`: ours, dialer or listener).
    pub(crate) fn established(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        endpoint: &ConnectedPoint,
        now: Instant,
    ) {
        let (via, outbound) = match endpoint {
            ConnectedPoint::Dialer { address, .. } => (relay_of(address), true),
            // An inbound circuit: our listen address is `/p2p/R/p2p-circuit`.
            ConnectedPoint::Listener { local_addr, .. } => (relay_of(local_addr), false),
        };
        self.by_peer.entry(peer).or_default().push(Conn {
            id,
            via,
            outbound,
            since: now,
            noticed: false,
        });
    }

    /// A connection closed.
    pub(crate) fn closed(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(v) = self.by_peer.get_mut(&peer) {
            v.retain(|c| c.id != id);
            if v.is_empty() {
                self.by_peer.remove(&peer);
            }
        }
    }

    /// Relayed connections we dialed to `peer` through a router not in `keep`.
    pub(crate) fn stale(&self, peer: &PeerId, keep: &[PeerId]) -> Vec<ConnectionId> {
        self.by_peer.get(peer).map_or_else(Vec::new, |v| {
            v.iter()
                .filter(|c| c.outbound && c.via.is_some_and(|r| !keep.contains(&r)))
                .map(|c| c.id)
                .collect()
        })
    }

    /// Whether the newest connection to `peer` (the one `agentmesh-streams`
    /// opens the next stream on) goes direct or through one of `routers`.
    pub(crate) fn usable(&self, peer: &PeerId, routers: &[PeerId]) -> bool {
        self.by_peer
            .get(peer)
            .and_then(|v| v.last())
            .is_some_and(|c| c.via.is_none_or(|r| routers.contains(&r)))
    }

    /// Whether `id` is an open direct (not relayed) connection to `peer`.
    pub(crate) fn is_direct(&self, peer: &PeerId, id: ConnectionId) -> bool {
        self.by_peer
            .get(peer)
            .is_some_and(|v| v.iter().any(|c| c.id == id && c.via.is_none()))
    }

    /// Whether any of `ids` is still open to `peer`.
    pub(crate) fn any_open(&self, peer: &PeerId, ids: &[ConnectionId]) -> bool {
        self.by_peer
            .get(peer)
            .is_some_and(|v| v.iter().any(|c| ids.contains(&c.id)))
    }

    /// Open connections to `peer` among `ids`.
    pub(crate) fn open_among(
        &self,
        peer: &PeerId,
        ids: &std::collections::HashSet<ConnectionId>,
    ) -> Vec<ConnectionId> {
        self.by_peer.get(peer).map_or_else(Vec::new, |v| {
            v.iter()
                .filter(|c| ids.contains(&c.id))
                .map(|c| c.id)
                .collect()
        })
    }

    /// Relayed connections through `router`, either direction, with their peer.
    pub(crate) fn through(&self, router: &PeerId) -> Vec<(PeerId, ConnectionId)> {
        self.by_peer
            .iter()
            .flat_map(|(peer, v)| {
                v.iter()
                    .filter(|c| c.via.as_ref() == Some(router))
                    .map(|c| (*peer, c.id))
            })
            .collect()
    }

    /// Peers with at least one direct (not relayed) connection.
    pub(crate) fn direct_peers(&self) -> impl Iterator<Item = &PeerId> {
        self.by_peer
            .iter()
            .filter(|(_, v)| v.iter().any(|c| c.via.is_none()))
            .map(|(p, _)| p)
    }

    /// The relayed connections we dialed to `peer` whose router was not
    /// told yet that a direct connection replaced them, with that router;
    /// each is returned once (marked here), so a circuit is noticed at most
    /// once (`super::upgrade_notice`).
    pub(crate) fn circuits_to_notice(&mut self, peer: &PeerId) -> Vec<(ConnectionId, PeerId)> {
        let Some(v) = self.by_peer.get_mut(peer) else {
            return Vec::new();
        };
        v.iter_mut()
            .filter(|c| c.outbound && !c.noticed)
            .filter_map(|c| {
                let router = c.via?;
                c.noticed = true;
                Some((c.id, router))
            })
            .collect()
    }

    /// Every relayed connection, either direction.
    pub(crate) fn relayed(&self) -> Vec<Relayed> {
        self.by_peer
            .iter()
            .flat_map(|(peer, v)| {
                v.iter().filter(|c| c.via.is_some()).map(|c| Relayed {
                    peer: *peer,
                    id: c.id,
                    outbound: c.outbound,
                    since: c.since,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_circuit_we_dialed_is_to_be_noticed_once_and_only_ours() {
        let (r1, r2, p, q) = (
            PeerId::random(),
            PeerId::random(),
            PeerId::random(),
            PeerId::random(),
        );
        let dialer = |address: String| ConnectedPoint::Dialer {
            address: address.parse().expect("addr"),
            role_override: libp2p::core::Endpoint::Dialer,
            port_use: libp2p::core::transport::PortUse::New,
        };
        let id = ConnectionId::new_unchecked;
        let now = Instant::now();
        let mut conns = Conns::default();
        conns.established(
            p,
            id(1),
            &dialer(format!("/ip4/127.0.0.1/tcp/1/p2p/{r1}/p2p-circuit/p2p/{p}")),
            now,
        );
        conns.established(
            p,
            id(2),
            &dialer(format!("/ip4/127.0.0.1/tcp/1/p2p/{r2}/p2p-circuit/p2p/{p}")),
            now,
        );
        conns.established(p, id(3), &dialer("/ip4/127.0.0.1/tcp/1".into()), now);
        // q's circuit to us: its router hears from q, not from us.
        let inbound = ConnectedPoint::Listener {
            local_addr: format!("/ip4/127.0.0.1/tcp/1/p2p/{r1}/p2p-circuit")
                .parse()
                .expect("addr"),
            send_back_addr: format!("/p2p/{q}").parse().expect("addr"),
        };
        conns.established(q, id(4), &inbound, now);
        let mut first = conns.circuits_to_notice(&p);
        first.sort_by_key(|(c, _)| *c);
        assert_eq!(first, vec![(id(1), r1), (id(2), r2)], "relayed ones only");
        assert!(conns.circuits_to_notice(&p).is_empty(), "each once");
        assert!(
            conns.circuits_to_notice(&q).is_empty(),
            "not circuits to us"
        );
        // A new circuit to p is a new notice.
        conns.established(
            p,
            id(5),
            &dialer(format!("/ip4/127.0.0.1/tcp/1/p2p/{r1}/p2p-circuit/p2p/{p}")),
            now,
        );
        assert_eq!(conns.circuits_to_notice(&p), vec![(id(5), r1)]);
    }

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
        let dialer = |address: Multiaddr| ConnectedPoint::Dialer {
            address,
            role_override: libp2p::core::Endpoint::Dialer,
            port_use: libp2p::core::transport::PortUse::New,
        };
        let now = Instant::now();
        let mut conns = Conns::default();
        conns.established(p, a, &dialer(via(r1)), now);
        conns.established(p, b, &dialer(via(r2)), now);
        conns.established(p, c, &dialer(direct.clone()), now);
        // A caller's circuit to us, through r1.
        let (q, d) = (PeerId::random(), ConnectionId::new_unchecked(4));
        let inbound = ConnectedPoint::Listener {
            local_addr: format!("/ip4/127.0.0.1/tcp/1/p2p/{r1}/p2p-circuit")
                .parse()
                .expect("addr"),
            send_back_addr: format!("/p2p/{q}").parse().expect("addr"),
        };
        conns.established(q, d, &inbound, now);
        // Direct connections are never stale; relayed ones are by router;
        // inbound circuits are not ours to replace.
        assert_eq!(conns.stale(&p, &[r2]), vec![a]);
        assert!(conns.stale(&q, &[]).is_empty());
        // Usable: the newest connection goes direct or through a router
        // the peer lists.
        assert!(conns.usable(&p, &[]));
        assert!(conns.usable(&q, &[r1]));
        assert!(!conns.usable(&q, &[r2]));
        assert!(!conns.usable(&PeerId::random(), &[r1]));
        let mut relayed = conns.relayed();
        relayed.sort_by_key(|r| (r.outbound, r.id));
        assert_eq!(
            relayed
                .iter()
                .map(|r| (r.peer, r.id, r.outbound))
                .collect::<Vec<_>>(),
            vec![(q, d, false), (p, a, true), (p, b, true)]
        );
        // Through r1: our circuit to p and q's circuit to us.
        let mut through = conns.through(&r1);
        through.sort_by_key(|(_, id)| *id);
        assert_eq!(through, vec![(p, a), (q, d)]);
        assert_eq!(conns.through(&r2), vec![(p, b)]);
        // Only p has a direct connection (c).
        assert_eq!(conns.direct_peers().collect::<Vec<_>>(), vec![&p]);
        // What a failed call's retry may close as a suspect direct path:
        // c only (not a relayed one, not another peer's, not one unknown).
        assert!(conns.is_direct(&p, c));
        assert!(!conns.is_direct(&p, a));
        assert!(!conns.is_direct(&q, c));
        assert!(!conns.is_direct(&p, ConnectionId::new_unchecked(99)));
        conns.closed(q, d);
        assert!(conns.any_open(&p, &[a]));
        conns.closed(p, a);
        assert!(!conns.any_open(&p, &[a]));
        assert!(conns.stale(&p, &[r2]).is_empty());
        conns.closed(p, b);
        // Newest now through r2.
        let e = ConnectionId::new_unchecked(5);
        conns.established(p, e, &dialer(via(r2)), now);
        assert!(conns.usable(&p, &[r2]));
        conns.closed(p, c);
        assert!(!conns.usable(&p, &[r1]));
        conns.closed(p, e);
        assert!(conns.by_peer.is_empty());
    }
}
