//! Our observed address changing: the candidate dcutr offers is replaced,
//! and peers punched before the change are punched again, once, counted.

use libp2p::core::ConnectedPoint;
use libp2p::swarm::behaviour::NewExternalAddrCandidate;

use super::tests::{behaviour, count, next_out};
use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("sa")
}

/// Both routers observe us at `a`; returns the candidates handed to the
/// swarm (and fed back, as the swarm does).
fn both_observe(b: &mut Behaviour, routers: [PeerId; 2], a: SocketAddr) -> Vec<Multiaddr> {
    b.observe(routers[0], Some(a));
    b.observe(routers[1], Some(a));
    let mut out = Vec::new();
    while let Some(e) = next_out(b) {
        if let ToSwarm::NewExternalAddrCandidate(addr) = e {
            b.on_swarm_event(FromSwarm::NewExternalAddrCandidate(
                NewExternalAddrCandidate { addr: &addr },
            ));
            out.push(addr);
        }
    }
    out
}

fn relayed(b: &mut Behaviour, peer: PeerId) -> Upgrade {
    b.relayed_up(peer, ConnectionId::new_unchecked(1));
    b.upgrade_for(&peer, Instant::now())
}

#[test]
fn a_new_observed_address_replaces_the_candidate_and_only_it_reaches_dcutr() {
    let (mut b, _m) = behaviour(true);
    let routers = [PeerId::random(), PeerId::random()];
    let (a, new) = (sa("198.51.100.4:4500"), sa("198.51.100.4:61234"));
    assert_eq!(both_observe(&mut b, routers, a), vec![path_addr(a, false)]);

    // A direct connection dcutr saw come up before the change.
    let peer = PeerId::random();
    let id = ConnectionId::new_unchecked(7);
    let addr: Multiaddr = "/ip4/192.0.2.9/tcp/4500".parse().expect("addr");
    let endpoint = ConnectedPoint::Dialer {
        address: addr.clone(),
        role_override: Endpoint::Dialer,
        port_use: PortUse::Reuse,
    };
    b.handle_established_outbound_connection(id, peer, &addr, Endpoint::Dialer, PortUse::Reuse)
        .expect("taken");

    // The routers see a new port (a rebinding): the old candidate goes,
    // only the new one is handed on, and a late event of the old one is
    // kept from dcutr.
    assert_eq!(
        both_observe(&mut b, routers, new),
        vec![path_addr(new, false)]
    );
    let old = path_addr(a, false);
    assert!(!b.for_inner(&FromSwarm::NewExternalAddrCandidate(
        NewExternalAddrCandidate { addr: &old }
    )));
    // The same address again is no change (nothing handed on).
    assert!(both_observe(&mut b, routers, new).is_empty());

    // The connection from before closes: the fresh dcutr never saw it and
    // is not told (it would panic).
    b.on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
        peer_id: peer,
        connection_id: id,
        endpoint: &endpoint,
        cause: None,
        remaining_established: 0,
    }));
    // One made after the change is told, as before.
    let id2 = ConnectionId::new_unchecked(8);
    b.handle_established_outbound_connection(id2, peer, &addr, Endpoint::Dialer, PortUse::Reuse)
        .expect("taken");
    assert!(b.for_inner(&FromSwarm::ConnectionClosed(ConnectionClosed {
        peer_id: peer,
        connection_id: id2,
        endpoint: &endpoint,
        cause: None,
        remaining_established: 0,
    })));
}

#[test]
fn a_peer_backed_off_before_our_address_changed_is_punched_again_once_counted() {
    let (mut b, m) = behaviour(true);
    let routers = [PeerId::random(), PeerId::random()];
    both_observe(&mut b, routers, sa("198.51.100.4:4500"));
    let (failed, fresh) = (PeerId::random(), PeerId::random());
    assert_eq!(relayed(&mut b, failed), Upgrade::Punch);
    // Its punch fails (or a call fell back from its direct path): backed off.
    b.punched(failed, false, Instant::now());
    assert_eq!(relayed(&mut b, failed), Upgrade::Skip);
    assert_eq!(count(&m, "skipped_backoff"), 1);

    both_observe(&mut b, routers, sa("198.51.100.4:61234"));
    // Punched again past its backoff, counted; a peer never punched is
    // punched as ever, not counted.
    assert_eq!(relayed(&mut b, failed), Upgrade::Punch);
    assert_eq!(count(&m, "repunched"), 1);
    assert_eq!(relayed(&mut b, fresh), Upgrade::Punch);
    assert_eq!(count(&m, "repunched"), 1);
    // Once: the next relayed connection waits out the backoff again.
    assert_eq!(relayed(&mut b, failed), Upgrade::Skip);
    assert_eq!(count(&m, "skipped_backoff"), 2);
}

/// With `--direct-transport=quic` the observed address is our UDP
/// socket's mapping: dcutr offers it as a QUIC address.
#[test]
fn a_quic_member_offers_its_observed_address_as_quic() {
    let (b, _m) = behaviour(true);
    let mut b = b.with_quic(true);
    let routers = [PeerId::random(), PeerId::random()];
    let a = sa("198.51.100.4:4500");
    let want: Multiaddr = "/ip4/198.51.100.4/udp/4500/quic-v1".parse().expect("addr");
    assert_eq!(both_observe(&mut b, routers, a), vec![want]);
}
