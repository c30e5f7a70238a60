//! The punch decision and its backoff, without a swarm.

use super::*;

pub(super) fn behaviour(enabled: bool) -> (Behaviour, DirectMetrics) {
    let m = DirectMetrics::default();
    (
        Behaviour::new(PeerId::random(), enabled, m.clone(), ReuseLog::default()),
        m,
    )
}

pub(super) fn count(m: &DirectMetrics, result: &'static str) -> u64 {
    m.upgrade_attempts
        .get_or_create(&crate::metrics::ResultLabel { result })
        .get()
}

/// A relayed address through some router.
fn circuit_addr() -> Multiaddr {
    format!(
        "/ip4/10.0.0.1/tcp/4001/p2p/{}/p2p-circuit",
        PeerId::random()
    )
    .parse()
    .expect("addr")
}

/// Whether a relayed connection's handler runs dcutr (a punch): its
/// handler is on the left of the select then.
fn dcutr_runs(h: Handler) -> bool {
    let Either::Left(select) = h else {
        panic!("a relayed connection gets the relayed handler")
    };
    matches!(select.into_inner().0, Either::Left(_))
}

#[test]
fn punches_only_where_they_can_land_and_not_again_right_after_a_failure() {
    let (mut b, m) = behaviour(true);
    let peer = PeerId::random();
    let now = Instant::now();
    // No observed address yet: skipped.
    assert!(!b.should_punch(&peer, now));
    assert_eq!(count(&m, "skipped_no_address"), 1);
    let seen: SocketAddr = "10.0.0.5:4500".parse().expect("sa");
    let (r1, r2) = (PeerId::random(), PeerId::random());
    assert!(b.observe(r1, Some(seen)));
    assert_eq!(b.observations().kind(), NatKind::Single);
    assert!(b.should_punch(&peer, now));
    // The candidate goes to dcutr once, as /ip4/A/tcp/P.
    assert_eq!(
        b.queued.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["/ip4/10.0.0.5/tcp/4500".to_string()]
    );
    assert!(b.observe(r2, Some(seen)));
    assert_eq!(b.observations().kind(), NatKind::EndpointIndependent);
    assert_eq!(b.queued.len(), 1, "unchanged candidate not queued again");
    // A failure backs that peer off (≥ 30 s), not others.
    b.punched(peer, false, now);
    assert_eq!(count(&m, "failed"), 1);
    assert!(!b.should_punch(&peer, now + Duration::from_secs(29)));
    assert_eq!(count(&m, "skipped_backoff"), 1);
    assert!(b.should_punch(&PeerId::random(), now));
    assert!(b.should_punch(&peer, now + Backoffs::default().max.mul_f64(1.6)));
    // A second failure doubles it; a success clears it.
    b.punched(peer, false, now);
    assert!(b.backoff[&peer].until >= now + Duration::from_secs(60));
    b.punched(peer, true, now);
    assert_eq!(count(&m, "direct"), 1);
    assert!(b.should_punch(&peer, now));
    // An endpoint-dependent NAT: no punch at all.
    assert!(b.observe(r2, Some("10.0.0.5:61000".parse().expect("sa"))));
    assert_eq!(b.observations().kind(), NatKind::EndpointDependent);
    // An endpoint-dependent NAT: no punch; a reversal is asked instead
    // (`tests_reversal.rs`).
    assert!(!b.should_punch(&peer, now));
    assert_eq!(b.upgrade_for(&peer, now), Upgrade::Reverse);
    assert_eq!(count(&m, "skipped_endpoint_dependent"), 0);
}

/// Every member on one host is observed at loopback: without the test
/// flag no peer may dial that, so nothing is offered and no punch starts
/// (it would hold the relayed connection open only to be refused); with
/// the flag the same address is offered and punched.
#[test]
fn an_address_observed_on_loopback_is_offered_only_with_the_test_flag() {
    let seen: SocketAddr = "127.0.0.1:4500".parse().expect("sa");
    for allow in [false, true] {
        let (b, m) = behaviour(true);
        let mut b = b.with_loopback_targets(allow);
        b.observe(PeerId::random(), Some(seen));
        let peer = PeerId::random();
        assert_eq!(
            b.should_punch(&peer, Instant::now()),
            allow,
            "allow {allow}"
        );
        assert_eq!(count(&m, "skipped_no_address"), u64::from(!allow));
        assert_eq!(b.queued.len(), usize::from(allow));
    }
}

#[test]
fn off_never_punches_and_counts_nothing() {
    let (mut b, m) = behaviour(false);
    b.observe(PeerId::random(), Some("10.0.0.5:4500".parse().expect("sa")));
    assert!(!b.should_punch(&PeerId::random(), Instant::now()));
    for r in crate::metrics::UPGRADE_RESULTS {
        assert_eq!(count(&m, r), 0, "{r}");
    }
}

#[test]
fn backoff_grows_and_stays_bounded() {
    let b = Backoffs::default();
    for failures in 1..40 {
        let d = jittered_backoff(failures, b);
        assert!(d >= b.min, "{failures}: {d:?}");
        assert!(d <= b.max.mul_f64(1.5), "{failures}: {d:?}");
    }
    // The flags' values are what bounds it.
    let short = Backoffs {
        min: Duration::from_secs(2),
        max: Duration::from_secs(5),
    };
    assert!(jittered_backoff(1, short) <= Duration::from_secs(3));
    assert!(jittered_backoff(30, short) <= Duration::from_millis(7_500));
    // A max below the min acts as the min.
    let odd = Backoffs {
        min: Duration::from_secs(10),
        max: Duration::from_secs(1),
    };
    assert!(jittered_backoff(3, odd) >= Duration::from_secs(10));
}

#[test]
fn punch_ids_are_remembered_within_a_bound() {
    let (mut b, _) = behaviour(true);
    let first = ConnectionId::new_unchecked(1);
    b.note_punch(first);
    assert!(b.is_punch(&first));
    for i in 2..(MAX_PUNCH_IDS + 2) {
        b.note_punch(ConnectionId::new_unchecked(i));
    }
    assert!(!b.is_punch(&first), "oldest forgotten");
    assert_eq!(b.punches.len(), MAX_PUNCH_IDS);
}

#[test]
fn a_punch_to_addresses_we_must_not_dial_is_refused_and_counted() {
    let (mut b, m) = behaviour(true);
    let peer = PeerId::random();
    let punch = ConnectionId::new_unchecked(7);
    b.note_punch(punch);
    let ok: Multiaddr = format!("/ip4/10.0.0.5/tcp/4500/p2p/{peer}")
        .parse()
        .expect("addr");
    assert!(
        b.handle_pending_outbound_connection(
            punch,
            Some(peer),
            std::slice::from_ref(&ok),
            Endpoint::Dialer,
        )
        .is_ok()
    );
    // What a lying peer may send instead.
    for bad in [
        "/ip4/127.0.0.1/tcp/22",
        "/ip4/169.254.169.254/tcp/80",
        "/ip4/0.0.0.0/tcp/4500",
        "/ip4/224.0.0.1/tcp/4500",
        "/ip6/::1/tcp/4500",
        "/ip6/fe80::1/tcp/4500",
        "/dns4/internal.example/tcp/443",
        "/ip4/127.0.0.1/udp/4500/quic-v1",
        "/ip4/169.254.169.254/udp/80/quic-v1",
    ] {
        let a: Multiaddr = bad.parse().expect("addr");
        let mixed = [ok.clone(), a];
        assert!(
            b.handle_pending_outbound_connection(punch, Some(peer), &mixed, Endpoint::Dialer)
                .is_err(),
            "{bad}"
        );
    }
    let many = vec![ok.clone(); MAX_PUNCH_ADDRS + 1];
    assert!(
        b.handle_pending_outbound_connection(punch, Some(peer), &many, Endpoint::Dialer)
            .is_err()
    );
    assert_eq!(count(&m, "bad_target"), 10);
    // The punch's dial that went ahead is marked for the transport (no
    // fallback to a fresh port); the refused ones are not.
    assert!(b.log.take_punch(&"10.0.0.5:4500".parse().expect("sa")));
    assert!(!b.log.take_punch(&"10.0.0.5:4500".parse().expect("sa")));
    // Dials that are not punches (routers on loopback in tests) pass.
    let router: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
    assert!(
        b.handle_pending_outbound_connection(
            ConnectionId::new_unchecked(8),
            None,
            &[router],
            Endpoint::Dialer
        )
        .is_ok()
    );
}

#[test]
fn a_direct_connection_closed_by_a_timed_out_path_is_told_from_other_closes() {
    use super::close_reason;
    use libp2p::swarm::ConnectionError;
    use std::io::{Error, ErrorKind};
    assert_eq!(close_reason(None), "closed");
    let timed_out = ConnectionError::IO(Error::from(ErrorKind::TimedOut));
    assert_eq!(close_reason(Some(&timed_out)), "timed_out");
    // As the muxer wraps the socket's error.
    let wrapped = ConnectionError::IO(Error::other(Error::from(ErrorKind::TimedOut)));
    assert_eq!(close_reason(Some(&wrapped)), "timed_out");
    let reset = ConnectionError::IO(Error::from(ErrorKind::ConnectionReset));
    assert_eq!(close_reason(Some(&reset)), "error");
    // libp2p's idle close is no dead path and no error.
    assert_eq!(
        close_reason(Some(&ConnectionError::KeepAliveTimeout)),
        "idle"
    );
}

#[test]
fn direct_connections_to_members_are_counted_under_our_nat_kind_and_routers_never() {
    use libp2p::core::ConnectedPoint;
    use libp2p::swarm::ConnectionError;
    let (mut b, m) = behaviour(true);
    let gauge = |nat: &'static str| {
        m.direct_connections
            .get_or_create(&crate::metrics::NatLabel { nat })
            .get()
    };
    let closed = |reason: &'static str| {
        m.direct_closed
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .get()
    };
    let (member, router) = (PeerId::random(), PeerId::random());
    b.relayed_up(member, ConnectionId::new_unchecked(1));
    b.gate.punch_started(member, Instant::now());
    let from_member = ConnectedPoint::Listener {
        local_addr: "/ip4/0.0.0.0/tcp/4500".parse().expect("addr"),
        send_back_addr: "/ip4/10.0.0.9/tcp/4500".parse().expect("addr"),
    };
    let to_router = ConnectedPoint::Dialer {
        address: "/ip4/10.0.0.1/tcp/4001".parse().expect("addr"),
        role_override: libp2p::core::Endpoint::Dialer,
        port_use: libp2p::core::transport::PortUse::Reuse,
    };
    // As the swarm does: the handler first (dcutr tracks the connection
    // there), then the event.
    let up = |b: &mut Behaviour, peer_id, id, endpoint: &ConnectedPoint| {
        let connection_id = ConnectionId::new_unchecked(id);
        let handler = match endpoint {
            ConnectedPoint::Listener {
                local_addr,
                send_back_addr,
            } => b.handle_established_inbound_connection(
                connection_id,
                peer_id,
                local_addr,
                send_back_addr,
            ),
            ConnectedPoint::Dialer {
                address,
                role_override,
                port_use,
            } => b.handle_established_outbound_connection(
                connection_id,
                peer_id,
                address,
                *role_override,
                *port_use,
            ),
        };
        assert!(handler.is_ok(), "connection {id} accepted");
        b.on_swarm_event(FromSwarm::ConnectionEstablished(ConnectionEstablished {
            peer_id,
            connection_id: ConnectionId::new_unchecked(id),
            endpoint,
            failed_addresses: &[],
            other_established: 0,
        }));
    };
    let down = |b: &mut Behaviour, peer_id, id, endpoint: &ConnectedPoint, cause| {
        b.on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
            peer_id,
            connection_id: ConnectionId::new_unchecked(id),
            endpoint,
            cause,
            remaining_established: 0,
        }));
    };
    up(&mut b, member, 2, &from_member);
    up(&mut b, router, 3, &to_router);
    assert_eq!((gauge("unknown"), gauge("endpoint_independent")), (1, 0));
    // Our NAT classified: the count moves to the new kind.
    let seen: SocketAddr = "192.0.2.7:4500".parse().expect("sa");
    b.observe(PeerId::random(), Some(seen));
    b.observe(PeerId::random(), Some(seen));
    assert_eq!((gauge("unknown"), gauge("endpoint_independent")), (0, 1));
    // The router's connection closing is none of this metric's business.
    let timed_out = ConnectionError::IO(std::io::Error::from(std::io::ErrorKind::TimedOut));
    down(&mut b, router, 3, &to_router, Some(&timed_out));
    assert_eq!(closed("timed_out"), 0);
    down(&mut b, member, 2, &from_member, Some(&timed_out));
    assert_eq!((closed("timed_out"), gauge("endpoint_independent")), (1, 0));
}

#[test]
fn the_nat_kind_label_values_are_the_kinds_status_names() {
    for kind in [
        NatKind::Unknown,
        NatKind::Single,
        NatKind::EndpointIndependent,
        NatKind::EndpointDependent,
    ] {
        assert!(
            crate::metrics::NAT_KINDS.contains(&kind.as_str()),
            "{kind:?}"
        );
    }
    assert_eq!(crate::metrics::NAT_KINDS.len(), 4);
}

/// A peer's direct connection from the listening port, as the swarm
/// establishes it: the handler first, then the event. Returns whether it
/// was accepted.
pub(super) fn inbound_direct(b: &mut Behaviour, peer: PeerId, id: u32) -> bool {
    use libp2p::core::ConnectedPoint;
    let local: Multiaddr = "/ip4/0.0.0.0/tcp/4500".parse().expect("addr");
    let remote: Multiaddr = "/ip4/10.0.0.9/tcp/4500".parse().expect("addr");
    let connection_id = ConnectionId::new_unchecked(id as usize);
    if b.handle_established_inbound_connection(connection_id, peer, &local, &remote)
        .is_err()
    {
        return false;
    }
    b.on_swarm_event(FromSwarm::ConnectionEstablished(ConnectionEstablished {
        peer_id: peer,
        connection_id,
        endpoint: &ConnectedPoint::Listener {
            local_addr: local,
            send_back_addr: remote,
        },
        failed_addresses: &[],
        other_established: 0,
    }));
    true
}

fn direct_closed(b: &mut Behaviour, peer: PeerId, id: u32) {
    use libp2p::core::ConnectedPoint;
    b.on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
        peer_id: peer,
        connection_id: ConnectionId::new_unchecked(id as usize),
        endpoint: &ConnectedPoint::Listener {
            local_addr: "/ip4/0.0.0.0/tcp/4500".parse().expect("addr"),
            send_back_addr: "/ip4/10.0.0.9/tcp/4500".parse().expect("addr"),
        },
        cause: None,
        remaining_established: 0,
    }));
}

/// What the behaviour hands the swarm next, other than dcutr's.
pub(super) fn next_out(b: &mut Behaviour) -> Option<ToSwarm<Event, THandlerInEvent<Behaviour>>> {
    let waker = futures::task::noop_waker();
    match b.poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(e) => Some(e),
        Poll::Pending => None,
    }
}

fn closed_count(m: &DirectMetrics, reason: &'static str) -> u64 {
    m.direct_closed
        .get_or_create(&crate::metrics::ReasonLabel { reason })
        .get()
}

#[test]
fn an_inbound_direct_connection_needs_a_punch_with_that_peer_under_way() {
    let (mut b, m) = behaviour(true);
    let refused = |reason: &'static str| {
        m.inbound_refused
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .get()
    };
    let peer = PeerId::random();
    b.relayed_up(peer, ConnectionId::new_unchecked(1));
    // A circuit alone is not enough: closed at once, counted.
    assert!(!inbound_direct(&mut b, peer, 2));
    assert_eq!(refused("not_punching"), 1);
    // A circuit whose punch we skip (no address of ours known yet) starts
    // no punch either.
    let circuit: Multiaddr = format!(
        "/ip4/192.0.2.1/tcp/4001/p2p/{}/p2p-circuit/p2p/{peer}",
        PeerId::random()
    )
    .parse()
    .expect("addr");
    let relayed = |b: &mut Behaviour, id| {
        b.handle_established_outbound_connection(
            ConnectionId::new_unchecked(id),
            peer,
            &circuit,
            Endpoint::Dialer,
            PortUse::Reuse,
        )
        .is_ok()
    };
    assert!(relayed(&mut b, 20));
    assert!(!inbound_direct(&mut b, peer, 21));
    assert_eq!(refused("not_punching"), 2);
    // Once dcutr runs its exchange on a relayed connection to the peer, a
    // punch is under way and its connection is taken.
    b.observe(
        PeerId::random(),
        Some("192.0.2.7:4500".parse().expect("sa")),
    );
    assert!(relayed(&mut b, 22));
    assert!(inbound_direct(&mut b, peer, 3));
    // So it is after dcutr's dial (the exchange done).
    b.gate.punch_started(peer, Instant::now());
    assert!(inbound_direct(&mut b, peer, 23));
    // Another peer with a circuit is still in no punch.
    let other = PeerId::random();
    b.relayed_up(other, ConnectionId::new_unchecked(4));
    assert!(!inbound_direct(&mut b, other, 5));
    assert_eq!(refused("not_punching"), 3);
    // A punch long over no longer lets the peer in.
    let long_ago = Instant::now()
        .checked_sub(gate::PUNCH_WINDOW + Duration::from_secs(1))
        .expect("uptime");
    b.gate.punch_started(peer, long_ago);
    assert!(!inbound_direct(&mut b, peer, 6));
    assert_eq!(refused("not_punching"), 4);
    assert_eq!(refused("no_relayed_connection"), 0);
}

#[test]
fn the_punching_peers_are_bounded() {
    let mut g = gate::Gate::new(Duration::from_secs(5));
    let now = Instant::now();
    let old = now.checked_sub(gate::PUNCH_WINDOW).expect("uptime");
    for _ in 0..gate::MAX_PUNCHING {
        g.punch_started(PeerId::random(), old);
    }
    // Full of stale punches: pruned, the new one is kept.
    let fresh = PeerId::random();
    g.punch_started(fresh, now);
    assert!(g.is_punching(&fresh, now));
    for _ in 0..gate::MAX_PUNCHING {
        g.punch_started(PeerId::random(), now);
    }
    // Full of live ones: the next is not kept (its connection would be
    // refused; the call stays relayed).
    let late = PeerId::random();
    g.punch_started(late, now);
    assert!(!g.is_punching(&late, now));
}

#[test]
fn a_direct_connection_whose_peer_does_not_authenticate_in_time_is_closed_and_counted() {
    let (b, m) = behaviour(true);
    let mut b = b.with_auth_timeout(Duration::from_secs(5));
    let (silent, honest) = (PeerId::random(), PeerId::random());
    for (peer, relayed) in [(silent, 1), (honest, 2)] {
        b.relayed_up(peer, ConnectionId::new_unchecked(relayed));
        b.gate.punch_started(peer, Instant::now());
    }
    let start = Instant::now();
    assert!(inbound_direct(&mut b, silent, 10));
    assert!(inbound_direct(&mut b, honest, 11));
    // The honest peer's hello arrives; the engine verifies it.
    let claims = agentmesh_proto::credential::VerifiedClaims {
        peer: honest,
        claims: Default::default(),
    };
    b.gate.heard(
        honest,
        ConnectionId::new_unchecked(11),
        hello::Heard::Credential(Box::default()),
    );
    match next_out(&mut b) {
        Some(ToSwarm::GenerateEvent(Event::Hello {
            peer, connection, ..
        })) => {
            assert_eq!(
                (peer, connection),
                (honest, ConnectionId::new_unchecked(11))
            );
        }
        other => panic!("the hello goes to the engine: {other:?}"),
    }
    assert!(b.authenticated(ConnectionId::new_unchecked(11), claims.clone()));
    assert!(
        !b.authenticated(ConnectionId::new_unchecked(11), claims),
        "once"
    );
    // Before the deadline nothing closes.
    assert_eq!(b.expire_unauthenticated(start + Duration::from_secs(4)), 0);
    assert!(next_out(&mut b).is_none());
    // Past it, the silent peer's connection closes; the honest one stays.
    assert_eq!(b.expire_unauthenticated(start + Duration::from_secs(6)), 1);
    match next_out(&mut b) {
        Some(ToSwarm::CloseConnection {
            peer_id,
            connection,
        }) => {
            assert_eq!(peer_id, silent);
            assert!(
                matches!(connection, CloseConnection::One(id) if id == ConnectionId::new_unchecked(10))
            );
        }
        other => panic!("the silent connection is closed: {other:?}"),
    }
    assert!(next_out(&mut b).is_none());
    // A hello arriving late changes nothing.
    b.gate.heard(
        silent,
        ConnectionId::new_unchecked(10),
        hello::Heard::Unreadable("late".into()),
    );
    assert!(next_out(&mut b).is_none());
    direct_closed(&mut b, silent, 10);
    assert_eq!(closed_count(&m, "unauthenticated"), 1);
    assert_eq!(closed_count(&m, "closed"), 0);
    assert_eq!(b.verified().count(), 1);
    // A policy change no longer allowing the honest peer: closed, counted
    // under that reason.
    assert!(b.close_direct(ConnectionId::new_unchecked(11), "policy"));
    assert!(
        !b.close_direct(ConnectionId::new_unchecked(11), "policy"),
        "once"
    );
    assert!(matches!(
        next_out(&mut b),
        Some(ToSwarm::CloseConnection { peer_id, .. }) if peer_id == honest
    ));
    direct_closed(&mut b, honest, 11);
    assert_eq!(closed_count(&m, "policy"), 1);
    assert_eq!(b.verified().count(), 0);
    // Nothing else is counted, and nothing is left.
    assert_eq!(closed_count(&m, "closed"), 0);
    assert!(b.gate.next_close().is_none());
}

/// One direct connection per punch: a second relayed connection to a peer
/// while a punch with it is under way is not punched as well, and when
/// our dial fails after the peer's dial already brought a direct
/// connection up, dcutr does not try again (no failure counted). Once the
/// punch has its result, a new relayed connection punches again even with
/// that direct connection open (its peer has likely lost the path).
#[test]
fn a_punch_under_way_or_won_by_the_peers_dial_makes_no_second_connection() {
    use libp2p::core::ConnectedPoint;
    let (mut b, m) = behaviour(true);
    let seen: SocketAddr = "10.0.0.5:4500".parse().expect("sa");
    b.observe(PeerId::random(), Some(seen));
    let peer = PeerId::random();
    let relayed = circuit_addr();
    let dcutr_keeps = |b: &mut Behaviour, id: usize| -> bool {
        let h = b
            .relayed_handler(peer, ConnectionId::new_unchecked(id), |d| {
                d.handle_established_outbound_connection(
                    ConnectionId::new_unchecked(id),
                    peer,
                    &relayed,
                    Endpoint::Dialer,
                    PortUse::Reuse,
                )
            })
            .expect("handler");
        dcutr_runs(h)
    };
    assert!(
        dcutr_keeps(&mut b, 1),
        "the first relayed connection punches"
    );
    assert!(!dcutr_keeps(&mut b, 2), "a punch is under way");
    assert_eq!(count(&m, "skipped_in_progress"), 1);
    // The peer's dial brings the direct connection up.
    let direct = ConnectedPoint::Listener {
        local_addr: "/ip4/0.0.0.0/udp/4500/quic-v1".parse().expect("addr"),
        send_back_addr: "/ip4/10.0.0.9/udp/4500/quic-v1".parse().expect("addr"),
    };
    b.on_swarm_event(FromSwarm::ConnectionEstablished(ConnectionEstablished {
        peer_id: peer,
        connection_id: ConnectionId::new_unchecked(3),
        endpoint: &direct,
        failed_addresses: &[],
        other_established: 1,
    }));
    // Our dial failed: dcutr's next attempt would make the peer dial again
    // (a second connection); the poll drops it when this holds (dcutr's
    // retry needs its real exchange: the NAT matrices count one direct
    // connection per cell). Its failure is no failure and no backoff.
    assert!(b.open.direct_since_punch_began(&peer));
    // Nor is a dial of dcutr's next attempt made when the peer tried again
    // first (as the dialer, counted here; in the listener's role the held
    // back attempt counts it).
    let to: Multiaddr = format!("/ip4/10.0.0.9/tcp/4500/p2p/{peer}")
        .parse()
        .expect("addr");
    for (id, role) in [(4, Endpoint::Dialer), (5, Endpoint::Listener)] {
        let retry = ConnectionId::new_unchecked(id);
        b.note_punch(retry);
        let r = b.handle_pending_outbound_connection(
            retry,
            Some(peer),
            std::slice::from_ref(&to),
            role,
        );
        assert!(r.is_err(), "{role:?}");
    }
    assert_eq!(count(&m, "skipped_direct"), 1);
    assert!(!b.log.take_punch(&"10.0.0.9:4500".parse().expect("sa")));
    b.punched(peer, false, Instant::now());
    assert_eq!(count(&m, "failed"), 0);
    assert!(!b.backoff.contains_key(&peer));
    assert!(!b.open.direct_since_punch_began(&peer), "the punch is over");
    // Over, but the connection is young: the peer, which had not seen it,
    // tries again on the same relayed connection, and our dial (as the
    // dialer: over QUIC it would connect a second time) is not made.
    let retry = ConnectionId::new_unchecked(6);
    b.note_punch(retry);
    assert!(
        b.handle_pending_outbound_connection(
            retry,
            Some(peer),
            std::slice::from_ref(&to),
            Endpoint::Dialer
        )
        .is_err()
    );
    assert_eq!(count(&m, "skipped_direct"), 2);
    // The punch ended: a new relayed connection punches, the direct
    // connection open or not.
    assert_eq!(b.upgrade_for(&peer, Instant::now()), Upgrade::Punch);
    b.on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
        peer_id: peer,
        connection_id: ConnectionId::new_unchecked(3),
        endpoint: &direct,
        cause: None,
        remaining_established: 1,
    }));
    assert!(b.open.none_to(&peer));
}

/// `--direct-max-connections`: once that many direct connections are open,
/// relayed connections are not punched, an inbound direct connection from
/// a punching peer is refused and a reversal is declined, each counted;
/// calls stay relayed. A close makes room again.
#[test]
fn past_the_direct_connection_cap_nothing_more_goes_direct() {
    use libp2p::core::ConnectedPoint;
    let (b, m) = behaviour(true);
    let mut b = b.with_max_connections(1);
    b.observe(PeerId::random(), Some("10.0.0.5:4500".parse().expect("sa")));
    let (first, second) = (PeerId::random(), PeerId::random());
    b.relayed_up(first, ConnectionId::new_unchecked(1));
    let direct = ConnectedPoint::Dialer {
        address: "/ip4/10.0.0.9/tcp/4500".parse().expect("addr"),
        role_override: Endpoint::Dialer,
        port_use: PortUse::Reuse,
    };
    b.on_swarm_event(FromSwarm::ConnectionEstablished(ConnectionEstablished {
        peer_id: first,
        connection_id: ConnectionId::new_unchecked(2),
        endpoint: &direct,
        failed_addresses: &[],
        other_established: 1,
    }));
    let now = Instant::now();
    assert_eq!(b.upgrade_for(&second, now), Upgrade::Skip);
    assert_eq!(count(&m, "skipped_full"), 1);
    // A punching peer's inbound direct connection: refused.
    b.relayed_up(second, ConnectionId::new_unchecked(3));
    b.gate.punch_started(second, now);
    let refused = b.handle_established_inbound_connection(
        ConnectionId::new_unchecked(4),
        second,
        &"/ip4/0.0.0.0/tcp/4500".parse().expect("addr"),
        &"/ip4/10.0.0.10/tcp/4500".parse().expect("addr"),
    );
    assert!(refused.is_err());
    let full = m
        .inbound_refused
        .get_or_create(&crate::metrics::ReasonLabel {
            reason: "direct_full",
        })
        .get();
    assert_eq!(full, 1);
    // A close makes room.
    b.on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
        peer_id: first,
        connection_id: ConnectionId::new_unchecked(2),
        endpoint: &direct,
        cause: None,
        remaining_established: 1,
    }));
    assert_eq!(b.upgrade_for(&second, now), Upgrade::Punch);
}

/// The side a relayed connection reached runs dcutr's exchange. When it
/// ends before dcutr dialed (the peer declined it: it backs off from us
/// after its direct path died, and only its own address change may lift
/// that), nothing was learnt of the path: counted `no_exchange`, not
/// backed off, so the peer's re-punch after it moves is taken at once.
/// One whose dials failed backs off as before.
#[test]
fn a_punch_the_peer_declined_is_not_backed_off_and_one_whose_dials_failed_is() {
    let (mut b, m) = behaviour(true);
    b.observe(PeerId::random(), Some("10.0.0.5:4500".parse().expect("sa")));
    let peer = PeerId::random();
    let relayed = circuit_addr();
    let reached = |b: &mut Behaviour, id: usize| {
        let h = b
            .relayed_handler(peer, ConnectionId::new_unchecked(id), |d| {
                d.handle_established_inbound_connection(
                    ConnectionId::new_unchecked(id),
                    peer,
                    &relayed,
                    &"/ip4/10.0.0.1/tcp/4001".parse().expect("addr"),
                )
            })
            .expect("handler");
        assert!(dcutr_runs(h), "punched");
    };
    reached(&mut b, 1);
    assert_eq!(b.open.unlanded(&peer), open::Unlanded::NoExchange);
    b.punched(peer, false, Instant::now());
    assert_eq!((count(&m, "no_exchange"), count(&m, "failed")), (1, 0));
    assert!(!b.backoff.contains_key(&peer));
    assert!(!b.open.punch_under_way(&peer, Instant::now()), "over");
    // The next relayed connection punches at once; this time dcutr dials
    // and the dials fail: the path, backed off.
    reached(&mut b, 2);
    b.open.punch_dialed(&peer);
    b.punched(peer, false, Instant::now());
    assert_eq!((count(&m, "no_exchange"), count(&m, "failed")), (1, 1));
    assert!(b.backoff.contains_key(&peer));
    assert_eq!(b.upgrade_for(&peer, Instant::now()), Upgrade::Skip);
    assert_eq!(count(&m, "skipped_backoff"), 1);
}
