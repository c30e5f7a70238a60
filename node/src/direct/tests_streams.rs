//! New streams keep off a direct connection to a member until its peer
//! authenticated: the direct behaviour holds it back in the streams
//! behaviour (a real one, its connections set up as the swarm sets them
//! up: the direct behaviour first).

use libp2p::swarm::NetworkBehaviour as _;

use super::tests::{behaviour, inbound_direct};
use super::*;

#[test]
fn calls_keep_to_the_relayed_connection_until_the_direct_peer_authenticated() {
    let mut streams = agentmesh_streams::Behaviour::new();
    let control = streams.new_control();
    let (b, _m) = behaviour(true);
    let mut b = b.with_streams(control.clone());
    let peer = PeerId::random();
    b.as_if_punching(peer);

    // The relayed connection, then the direct one accepted on the
    // listening port: the direct behaviour's hello takes it first, then
    // the streams behaviour registers it.
    let circuit: Multiaddr = format!(
        "/ip4/192.0.2.1/tcp/4001/p2p/{}/p2p-circuit",
        PeerId::random()
    )
    .parse()
    .expect("addr");
    let (relayed, direct) = (
        ConnectionId::new_unchecked(1),
        ConnectionId::new_unchecked(2),
    );
    let remote: Multiaddr = format!("/p2p/{peer}").parse().expect("addr");
    // Handlers live as long as their connections: kept.
    let _on_relayed = streams
        .handle_established_inbound_connection(relayed, peer, &circuit, &remote)
        .expect("relayed");
    assert!(inbound_direct(&mut b, peer, 2));
    let local: Multiaddr = "/ip4/0.0.0.0/tcp/4500".parse().expect("addr");
    let from: Multiaddr = "/ip4/10.0.0.9/tcp/4500".parse().expect("addr");
    let _on_direct = streams
        .handle_established_inbound_connection(direct, peer, &local, &from)
        .expect("direct");

    // Its hello not verified yet: a call's stream would go relayed.
    assert_eq!(control.newest_connection(&peer), Some((relayed, true)));
    // Verified: the direct connection, the newest, carries new streams.
    let claims = agentmesh_proto::credential::VerifiedClaims {
        peer,
        claims: Default::default(),
    };
    assert!(b.authenticated(direct, claims));
    assert_eq!(control.newest_connection(&peer), Some((direct, false)));
}

#[test]
fn a_direct_connection_that_never_authenticates_carries_no_call_beside_a_relayed_one() {
    let mut streams = agentmesh_streams::Behaviour::new();
    let control = streams.new_control();
    let (b, _m) = behaviour(true);
    let mut b = b.with_streams(control.clone());
    let peer = PeerId::random();
    b.as_if_punching(peer);
    let circuit: Multiaddr = format!(
        "/ip4/192.0.2.1/tcp/4001/p2p/{}/p2p-circuit",
        PeerId::random()
    )
    .parse()
    .expect("addr");
    let remote: Multiaddr = format!("/p2p/{peer}").parse().expect("addr");
    let relayed = ConnectionId::new_unchecked(1);
    // Handlers live as long as their connections: kept.
    let _on_relayed = streams
        .handle_established_inbound_connection(relayed, peer, &circuit, &remote)
        .expect("relayed");
    // Two direct connections from a peer that sends no hello (or a bad
    // one): neither is ever used while the relayed one is there.
    let mut handlers = Vec::new();
    for id in [3u32, 4] {
        assert!(inbound_direct(&mut b, peer, id));
        let local: Multiaddr = "/ip4/0.0.0.0/tcp/4500".parse().expect("addr");
        let from: Multiaddr = format!("/ip4/10.0.0.9/tcp/{}", 4500 + id)
            .parse()
            .expect("addr");
        handlers.push(
            streams
                .handle_established_inbound_connection(
                    ConnectionId::new_unchecked(id as usize),
                    peer,
                    &local,
                    &from,
                )
                .expect("direct"),
        );
        assert_eq!(control.newest_connection(&peer), Some((relayed, true)));
    }
    // Closed unauthenticated: still not released.
    assert_eq!(
        b.expire_unauthenticated(Instant::now() + Duration::from_secs(3600)),
        2
    );
    assert_eq!(control.newest_connection(&peer), Some((relayed, true)));
}
