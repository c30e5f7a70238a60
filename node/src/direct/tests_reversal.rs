//! Connection reversal without a swarm: who asks, what is dialed and
//! counted, and that only the peer that asked on its relayed connection
//! gets in.

use libp2p::core::ConnectedPoint;
use libp2p::swarm::behaviour::DialFailure;
use libp2p::swarm::{DialError, NotifyHandler};

use super::tests::{behaviour, count, inbound_direct, next_out};
use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("sa")
}

/// Our routers see two ports: endpoint-dependent.
fn endpoint_dependent(b: &mut Behaviour) {
    b.observe(PeerId::random(), Some(sa("198.51.100.4:40001")));
    b.observe(PeerId::random(), Some(sa("198.51.100.4:40002")));
    assert_eq!(b.observations().kind(), NatKind::EndpointDependent);
}

/// A circuit to `peer` comes up as our dial; returns whether its handler
/// asks for a reversal.
fn circuit(b: &mut Behaviour, peer: PeerId, id: usize) -> bool {
    let addr: Multiaddr = format!(
        "/ip4/192.0.2.1/tcp/4001/p2p/{}/p2p-circuit/p2p/{peer}",
        PeerId::random()
    )
    .parse()
    .expect("addr");
    let handler = b
        .handle_established_outbound_connection(
            ConnectionId::new_unchecked(id),
            peer,
            &addr,
            Endpoint::Dialer,
            PortUse::Reuse,
        )
        .expect("a circuit is always taken");
    match handler {
        Either::Left(select) => select.into_inner().1.asks(),
        Either::Right(_) => panic!("a relayed connection gets the relayed handler"),
    }
}

fn answered(b: &mut Behaviour, peer: PeerId, id: usize, a: Result<Option<Multiaddr>, String>) {
    b.on_connection_handler_event(
        peer,
        ConnectionId::new_unchecked(id),
        Either::Left(Either::Right(reversal::Out::Answered(a))),
    );
}

fn asked(b: &mut Behaviour, peer: PeerId, id: usize) {
    b.on_connection_handler_event(
        peer,
        ConnectionId::new_unchecked(id),
        Either::Left(Either::Right(reversal::Out::Asked)),
    );
}

/// The dial the behaviour hands the swarm next: its id and addresses.
fn next_dial(b: &mut Behaviour) -> Option<ConnectionId> {
    match next_out(b)? {
        ToSwarm::Dial { opts } => Some(opts.connection_id()),
        _ => None,
    }
}

/// The answer the behaviour hands the handler of `id` next.
fn next_reply(b: &mut Behaviour, id: usize) -> Option<Option<Multiaddr>> {
    match next_out(b)? {
        ToSwarm::NotifyHandler {
            handler: NotifyHandler::One(to),
            event: Either::Left(Either::Right(reversal::In::Reply(addr))),
            ..
        } if to == ConnectionId::new_unchecked(id) => Some(addr),
        _ => None,
    }
}

fn established(b: &mut Behaviour, peer: PeerId, id: ConnectionId) {
    b.on_swarm_event(FromSwarm::ConnectionEstablished(ConnectionEstablished {
        peer_id: peer,
        connection_id: id,
        endpoint: &ConnectedPoint::Dialer {
            address: "/ip4/192.0.2.9/tcp/4500".parse().expect("addr"),
            role_override: Endpoint::Dialer,
            port_use: PortUse::Reuse,
        },
        failed_addresses: &[],
        other_established: 1,
    }));
}

#[test]
fn an_endpoint_dependent_member_asks_and_dials_the_answer_each_result_counted() {
    let (mut b, m) = behaviour(true);
    // An endpoint-independent member never asks.
    b.observe(PeerId::random(), Some(sa("198.51.100.4:40001")));
    assert!(!circuit(&mut b, PeerId::random(), 1));
    endpoint_dependent(&mut b);
    while next_out(&mut b).is_some() {}

    // Asks; the answer is dialed, as a punch (its failure is no caller's,
    // its connection runs the hello); the connection coming up counts.
    let peer = PeerId::random();
    assert!(circuit(&mut b, peer, 2));
    let to: Multiaddr = "/ip4/192.0.2.9/tcp/4500".parse().expect("addr");
    answered(&mut b, peer, 2, Ok(Some(to)));
    let dial = next_dial(&mut b).expect("the reversal's dial");
    assert!(b.is_punch(&dial));
    established(&mut b, peer, dial);
    assert_eq!(count(&m, "reversed"), 1);
    assert_eq!(count(&m, "skipped_endpoint_dependent"), 0);

    // A dial that fails: counted, and the peer backed off.
    let failing = PeerId::random();
    assert!(circuit(&mut b, failing, 3));
    answered(
        &mut b,
        failing,
        3,
        Ok(Some("/ip4/192.0.2.10/tcp/4500".parse().expect("addr"))),
    );
    let dial = next_dial(&mut b).expect("dial");
    // A second circuit while that dial is under way asks nothing.
    assert!(!circuit(&mut b, failing, 4));
    assert_eq!(count(&m, "skipped_endpoint_dependent"), 1);
    b.on_swarm_event(FromSwarm::DialFailure(DialFailure {
        peer_id: Some(failing),
        error: &DialError::Aborted,
        connection_id: dial,
    }));
    assert_eq!(count(&m, "reversal_failed"), 1);
    assert!(!circuit(&mut b, failing, 5));
    assert_eq!(count(&m, "skipped_backoff"), 1);

    // A refusal, a failed exchange: counted, backed off, nothing dialed.
    let (refusing, silent) = (PeerId::random(), PeerId::random());
    assert!(circuit(&mut b, refusing, 6));
    answered(&mut b, refusing, 6, Ok(None));
    assert!(circuit(&mut b, silent, 7));
    answered(&mut b, silent, 7, Err("protocol not supported".into()));
    assert!(next_out(&mut b).is_none());
    assert_eq!(count(&m, "reversal_refused"), 1);
    assert_eq!(count(&m, "reversal_failed"), 2);
    assert!(!circuit(&mut b, refusing, 8));
    assert_eq!(count(&m, "skipped_backoff"), 2);

    // A lying peer's answer naming what we never dial: refused whole.
    for bad in ["/ip4/127.0.0.1/tcp/22", "/ip4/169.254.169.254/tcp/80"] {
        let liar = PeerId::random();
        assert!(circuit(&mut b, liar, 9));
        answered(&mut b, liar, 9, Ok(Some(bad.parse().expect("addr"))));
        assert!(next_out(&mut b).is_none(), "{bad} dialed");
    }
    assert_eq!(count(&m, "bad_target"), 2);
}

#[test]
fn only_a_peer_that_asked_on_its_relayed_connection_may_connect_reversed() {
    let (mut b, m) = behaviour(true);
    let refused = |reason: &'static str| {
        m.inbound_refused
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .get()
    };
    b.observe(PeerId::random(), Some(sa("198.51.100.7:4500")));
    while next_out(&mut b).is_some() {}
    let (asker, other, stranger) = (PeerId::random(), PeerId::random(), PeerId::random());
    b.relayed_up(asker, ConnectionId::new_unchecked(1));
    b.relayed_up(other, ConnectionId::new_unchecked(2));

    // The asker gets our address and its dial is taken.
    asked(&mut b, asker, 1);
    assert_eq!(
        next_reply(&mut b, 1),
        Some(Some("/ip4/198.51.100.7/tcp/4500".parse().expect("addr")))
    );
    assert_eq!(count(&m, "reversal_agreed"), 1);
    assert!(inbound_direct(&mut b, asker, 10));

    // A peer with a circuit that did not ask is refused, as before.
    assert!(!inbound_direct(&mut b, other, 11));
    assert_eq!(refused("not_punching"), 1);
    // Asking on a connection that is not its relayed one (another peer's
    // circuit id) gets nothing and lets nothing in.
    asked(&mut b, other, 1);
    assert_eq!(next_reply(&mut b, 1), Some(None));
    assert!(!inbound_direct(&mut b, other, 12));
    // Nor does a stranger without any circuit.
    asked(&mut b, stranger, 3);
    assert_eq!(next_reply(&mut b, 3), Some(None));
    assert!(!inbound_direct(&mut b, stranger, 13));
    assert_eq!(refused("no_relayed_connection"), 1);
    assert_eq!(count(&m, "reversal_declined"), 2);

    // Behind an endpoint-dependent NAT ourselves we have no address to
    // offer: declined, and the peer stays out.
    endpoint_dependent(&mut b);
    while next_out(&mut b).is_some() {}
    asked(&mut b, other, 2);
    assert_eq!(next_reply(&mut b, 2), Some(None));
    assert!(!inbound_direct(&mut b, other, 14));
    assert_eq!(refused("not_punching"), 3);
    assert_eq!(count(&m, "reversal_agreed"), 1);
}
