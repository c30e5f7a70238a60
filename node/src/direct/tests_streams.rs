//! New streams keep off a direct connection to a member until its peer
//! authenticated: the direct behaviour holds it back in the streams
//! behaviour (a real one, its connections set up as the swarm sets them
//! up: the direct behaviour first).

use libp2p::swarm::NetworkBehaviour as _;

use super::tests::{behaviour, inbound_direct};
use super::*;

/// A streams behaviour, the direct behaviour holding connections back in
/// it, a peer in a punch with us, and its relayed connection (id 1),
/// registered as the swarm would (its handler kept: handlers live as long
/// as their connections).
struct Setup {
    streams: agentmesh_streams::Behaviour,
    control: agentmesh_streams::Control,
    b: Behaviour,
    peer: PeerId,
    relayed: ConnectionId,
    _on_relayed: libp2p::swarm::THandler<agentmesh_streams::Behaviour>,
}

fn with_a_relayed_connection() -> Setup {
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
    let on_relayed = streams
        .handle_established_inbound_connection(relayed, peer, &circuit, &remote)
        .expect("relayed");
    Setup {
        streams,
        control,
        b,
        peer,
        relayed,
        _on_relayed: on_relayed,
    }
}

impl Setup {
    /// A direct connection `id` accepted on the listening port from
    /// `from_port`: the direct behaviour's hello takes it first, then the
    /// streams behaviour registers it; its handler, to keep.
    fn direct(
        &mut self,
        id: u32,
        from_port: u32,
    ) -> libp2p::swarm::THandler<agentmesh_streams::Behaviour> {
        assert!(inbound_direct(&mut self.b, self.peer, id));
        let local: Multiaddr = "/ip4/0.0.0.0/tcp/4500".parse().expect("addr");
        let from: Multiaddr = format!("/ip4/10.0.0.9/tcp/{from_port}")
            .parse()
            .expect("addr");
        self.streams
            .handle_established_inbound_connection(
                ConnectionId::new_unchecked(id as usize),
                self.peer,
                &local,
                &from,
            )
            .expect("direct")
    }
}

#[test]
fn calls_keep_to_the_relayed_connection_until_the_direct_peer_authenticated() {
    let mut s = with_a_relayed_connection();
    let (peer, relayed) = (s.peer, s.relayed);
    let direct = ConnectionId::new_unchecked(2);
    let _on_direct = s.direct(2, 4500);

    // Its hello not verified yet: a call's stream would go relayed.
    assert_eq!(s.control.newest_connection(&peer), Some((relayed, true)));
    // Verified: the direct connection, the newest, carries new streams.
    let claims = agentmesh_proto::credential::VerifiedClaims {
        peer,
        claims: Default::default(),
    };
    assert!(s.b.authenticated(direct, claims));
    assert_eq!(s.control.newest_connection(&peer), Some((direct, false)));
}

#[test]
fn a_direct_connection_that_never_authenticates_carries_no_call_beside_a_relayed_one() {
    let mut s = with_a_relayed_connection();
    let (peer, relayed) = (s.peer, s.relayed);
    // Two direct connections from a peer that sends no hello (or a bad
    // one): neither is ever used while the relayed one is there.
    let mut handlers = Vec::new();
    for id in [3u32, 4] {
        handlers.push(s.direct(id, 4500 + id));
        assert_eq!(s.control.newest_connection(&peer), Some((relayed, true)));
    }
    // Closed unauthenticated: still not released.
    assert_eq!(
        s.b.expire_unauthenticated(Instant::now() + Duration::from_secs(3600)),
        2
    );
    assert_eq!(s.control.newest_connection(&peer), Some((relayed, true)));
}
