//! Unit tests of the manager's bookkeeping: charges taken and released,
//! per-source limits only for peers not admitted, failed logins.

use std::collections::HashSet;
use std::sync::Arc;

use libp2p::core::{ConnectedPoint, Endpoint};
use libp2p::{Multiaddr, PeerId};
use parking_lot::RwLock;
use prometheus_client::registry::Registry;

use super::budget::{Proto, Resource, Scope};
use super::*;

pub(super) fn manager(
    f: impl FnOnce(&mut config::ResourceConfig),
) -> (Arc<ResourceManager>, Arc<RwLock<HashSet<PeerId>>>) {
    let mut config = config::ResourceConfig {
        unauthenticated_connections_per_ip: 2,
        failed_logins_per_ip_per_minute: 3,
        ..Default::default()
    };
    f(&mut config);
    let mut reg = Registry::default();
    let admitted = Arc::new(RwLock::new(HashSet::new()));
    let deps = Deps::for_tests(Arc::new(Admitted(admitted.clone())));
    let mgr = ResourceManager::new(
        budgets_of(&config, 64 << 20),
        &mut reg,
        Family::default(),
        deps,
    );
    (mgr, admitted)
}

/// The admitted peers as a test writes them.
struct Admitted(Arc<RwLock<HashSet<PeerId>>>);

impl AdmittedPeers for Admitted {
    fn is_admitted(&self, peer: &PeerId) -> bool {
        self.0.read().contains(peer)
    }
}

/// Every peer admitted.
pub(super) struct Everyone;

impl AdmittedPeers for Everyone {
    fn is_admitted(&self, _: &PeerId) -> bool {
        true
    }
}

/// An inbound connection from `ip` (IPv4, or IPv6 when it has a colon).
pub(super) fn inbound_from(ip: &str) -> ConnectedPoint {
    let family = if ip.contains(':') { "ip6" } else { "ip4" };
    ConnectedPoint::Listener {
        local_addr: "/ip4/127.0.0.1/tcp/4001"
            .parse::<Multiaddr>()
            .expect("addr"),
        send_back_addr: format!("/{family}/{ip}/tcp/5000").parse().expect("addr"),
    }
}

fn refused(mgr: &ResourceManager, r: Resource, s: Scope, p: &'static str) -> u64 {
    mgr.metrics
        .refused
        .get_or_create(&[
            ("resource", r.as_str()),
            ("scope", s.as_str()),
            ("protocol", p),
        ])
        .get()
}

/// Fills one source to its cap (2, see `manager`) and past it by the one
/// newcomer it lets in: a connection from a fresh peer at each of `ips`.
/// Keep the guards as long as the source should stay full.
fn fill_source(mgr: &Arc<ResourceManager>, ips: [&str; 3]) -> Vec<Arc<ConnectionGuard>> {
    ["1", "2", "the newcomer past the cap"]
        .into_iter()
        .zip(ips)
        .map(|(what, ip)| {
            mgr.open_connection(PeerId::random(), &inbound_from(ip))
                .expect(what)
        })
        .collect()
}

/// `times` failed logins for `reason` from `ip`.
fn fail_logins(mgr: &ResourceManager, ip: &str, times: usize, reason: &'static str) {
    let from = Some(ip.parse().expect("ip"));
    for _ in 0..times {
        mgr.failed_login(from, reason);
    }
}

/// An admitted member's connection from `ip`.
fn member_from(
    mgr: &Arc<ResourceManager>,
    admitted: &RwLock<HashSet<PeerId>>,
    ip: &str,
) -> Arc<ConnectionGuard> {
    let member = PeerId::random();
    admitted.write().insert(member);
    mgr.open_connection(member, &inbound_from(ip))
        .expect("member")
}

#[test]
fn charges_are_released_on_drop() {
    let (mgr, _) = manager(|_| {});
    let peer = PeerId::random();
    let conn = mgr
        .open_connection(peer, &inbound_from("10.0.0.1"))
        .expect("conn");
    let base = mgr.state.lock().memory;
    assert_eq!(base, mgr.budgets().connection_charge_bytes);
    let s1 = mgr.open_stream(&conn, Proto::RelayHop, true).expect("hop");
    let s2 = mgr.open_stream(&conn, Proto::Auth, true).expect("auth");
    assert_eq!(
        mgr.state.lock().memory,
        base + Proto::RelayHop.charge_bytes() + Proto::Auth.charge_bytes()
    );
    assert_eq!(mgr.metrics.stream_gauge(Proto::RelayHop, true).get(), 1);
    drop(s1);
    drop(s2);
    assert_eq!(mgr.state.lock().memory, base);
    assert_eq!(mgr.metrics.stream_gauge(Proto::RelayHop, true).get(), 0);
    drop(conn);
    let st = mgr.state.lock();
    assert_eq!(st.memory, 0);
    assert!(st.peers.is_empty() && st.sources.is_empty() && st.strangers.used() == 0);
}

#[test]
fn per_peer_protocol_budget_refuses_that_protocol_only() {
    let (mgr, _) = manager(|c| {
        c.peer_stream_budgets.insert("catalog".into(), 2);
    });
    let peer = PeerId::random();
    let conn = mgr
        .open_connection(peer, &inbound_from("10.0.0.1"))
        .expect("conn");
    let _a = mgr.open_stream(&conn, Proto::Catalog, true).expect("1");
    let _b = mgr.open_stream(&conn, Proto::Catalog, true).expect("2");
    let err = mgr
        .open_stream(&conn, Proto::Catalog, true)
        .expect_err("3rd refused");
    assert_eq!((err.resource, err.scope), (Resource::Stream, Scope::Peer));
    assert_eq!(refused(&mgr, Resource::Stream, Scope::Peer, "catalog"), 1);
    let _c = mgr
        .open_stream(&conn, Proto::Auth, true)
        .expect("auth still fine");
    // Another peer is not affected.
    let other = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.2"))
        .expect("conn");
    let _d = mgr
        .open_stream(&other, Proto::Catalog, true)
        .expect("other peer");
}

#[test]
fn source_limit_applies_to_unauthenticated_connections_only() {
    let (mgr, admitted) = manager(|_| {});
    let (p1, p2, p3) = (PeerId::random(), PeerId::random(), PeerId::random());
    let _c1 = mgr
        .open_connection(p1, &inbound_from("10.0.0.9"))
        .expect("1");
    let _c2 = mgr
        .open_connection(p2, &inbound_from("10.0.0.9"))
        .expect("2");
    // One newcomer past the cap gets in (the swarm loop then closes the
    // source's oldest); the next is refused until that close completes.
    let newcomer = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.9"))
        .expect("the newcomer");
    let err = mgr
        .open_connection(p3, &inbound_from("10.0.0.9"))
        .expect_err("past the cap and its newcomer");
    assert_eq!(
        (err.resource, err.scope),
        (Resource::Connection, Scope::Source)
    );
    assert_eq!(
        refused(&mgr, Resource::Connection, Scope::Source, "none"),
        1
    );
    drop(newcomer);
    // Once admitted, members behind that IP no longer count.
    admitted.write().extend([p1, p2]);
    mgr.peer_admitted(&p1);
    mgr.peer_admitted(&p2);
    let _c3 = mgr
        .open_connection(p3, &inbound_from("10.0.0.9"))
        .expect("3");
    let mut more = Vec::new();
    admitted.write().insert(p3);
    for _ in 0..10 {
        let p = PeerId::random();
        admitted.write().insert(p);
        more.push(
            mgr.open_connection(p, &inbound_from("10.0.0.9"))
                .expect("admitted"),
        );
    }
    // Our own dials are never refused.
    let dial = ConnectedPoint::Dialer {
        address: "/ip4/10.0.0.9/tcp/1".parse().expect("addr"),
        role_override: Endpoint::Dialer,
        port_use: libp2p::core::transport::PortUse::Reuse,
    };
    let _d = mgr.open_connection(PeerId::random(), &dial).expect("dial");
}

#[test]
fn failed_logins_close_the_source_to_new_unauthenticated_connections() {
    let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 100);
    let bad = PeerId::random();
    let _c = mgr
        .open_connection(bad, &inbound_from("10.0.0.7"))
        .expect("conn");
    let from = Some("10.0.0.7".parse().expect("ip"));
    for _ in 0..10 {
        mgr.failed_login(from, "unknown_key");
    }
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.7"))
            .is_ok(),
        "refusals the router caused are not failed logins"
    );
    for _ in 0..3 {
        mgr.failed_login(from, "bad_signature");
    }
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.7"))
            .is_err()
    );
    assert_eq!(mgr.metrics.failed_login_blocks.get(), 1);
    let counted = |r: &'static str| {
        mgr.metrics
            .failed_logins
            .get_or_create(&[("reason", r)])
            .get()
    };
    assert_eq!((counted("bad_signature"), counted("silent")), (3, 0));
    mgr.failed_login(from, "silent");
    assert_eq!(counted("silent"), 1, "a silent stream is a failed login");
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.8"))
            .is_ok()
    );
    let good = PeerId::random();
    admitted.write().insert(good);
    assert!(mgr.open_connection(good, &inbound_from("10.0.0.7")).is_ok());
}

#[test]
fn a_source_with_admitted_members_is_not_blocked_for_failed_logins() {
    let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 100);
    let _m = member_from(&mgr, &admitted, "10.0.0.9");
    fail_logins(&mgr, "10.0.0.9", 5, "silent");
    assert_eq!(
        mgr.metrics.failed_login_blocks.get(),
        1,
        "counted and recorded"
    );
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.9"))
            .is_ok(),
        "members behind this address vouch for it: not blocked"
    );
    // The same failures from a source without members block it.
    let _s = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.10"))
        .expect("stranger");
    fail_logins(&mgr, "10.0.0.10", 5, "silent");
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.10"))
            .is_err()
    );
}

#[test]
fn a_source_with_admitted_members_is_not_blocked_before_the_handshake_either() {
    let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 100);
    let _m = member_from(&mgr, &admitted, "10.0.0.9");
    fail_logins(&mgr, "10.0.0.9", 5, "silent");
    let h = mgr.handshakes();
    assert!(
        h.admit(ip("10.0.0.9"), h.arriving()).is_some(),
        "a member re-attaching from its own address is not refused before its handshake"
    );
    fail_logins(&mgr, "10.0.0.10", 5, "silent");
    assert!(
        h.admit(ip("10.0.0.10"), h.arriving()).is_none(),
        "a source without members stays blocked"
    );
    assert_eq!(handshakes_refused(&mgr, "blocked"), 1);
    assert_eq!(
        refused(&mgr, Resource::Connection, Scope::Source, "none"),
        1
    );
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn handshakes_refused(mgr: &ResourceManager, reason: &'static str) -> u64 {
    mgr.handshake_metrics
        .refused
        .get_or_create(&[("reason", reason)])
        .get()
}

fn handshakes_shed(mgr: &ResourceManager, reason: &'static str) -> u64 {
    ["none", "partial"]
        .into_iter()
        .map(|p| {
            mgr.handshake_metrics
                .shed
                .get_or_create(&[("reason", reason), ("progress", p)])
                .get()
        })
        .sum()
}

#[test]
fn memory_budget_refuses_and_counts() {
    let config = config::ResourceConfig {
        connection_charge_bytes: 1 << 20,
        ..Default::default()
    };
    let mut reg = Registry::default();
    // Room for two connections and one data stream.
    let budget = (2 << 20) + Proto::RelayHop.charge_bytes();
    // Members (admitted): the router's budget alone applies, not the
    // strangers' pool.
    let mgr = ResourceManager::new(
        budgets_of(&config, budget),
        &mut reg,
        Family::default(),
        Deps::for_tests(Arc::new(Everyone)),
    );
    let c1 = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.1"))
        .expect("1");
    let _c2 = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.2"))
        .expect("2");
    let s = mgr.open_stream(&c1, Proto::RelayHop, true).expect("fits");
    let err = mgr
        .open_stream(&c1, Proto::RelayHop, true)
        .expect_err("over");
    assert_eq!((err.resource, err.scope), (Resource::Memory, Scope::System));
    assert!(
        mgr.open_connection(PeerId::random(), &inbound_from("10.0.0.3"))
            .is_err()
    );
    assert_eq!(
        refused(&mgr, Resource::Memory, Scope::System, "relay_hop"),
        1
    );
    assert_eq!(refused(&mgr, Resource::Memory, Scope::System, "none"), 1);
    drop(s);
    assert!(mgr.open_stream(&c1, Proto::RelayHop, true).is_ok());
}

#[test]
fn circuits_per_destination_are_capped() {
    let (mgr, _) = manager(|c| c.circuits_per_destination = 2);
    let dst = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.1"))
        .expect("conn");
    let _a = mgr.open_stream(&dst, Proto::RelayStop, false).expect("1");
    let _b = mgr.open_stream(&dst, Proto::RelayStop, false).expect("2");
    let err = mgr
        .open_stream(&dst, Proto::RelayStop, false)
        .expect_err("3");
    assert_eq!((err.resource, err.scope), (Resource::Circuit, Scope::Peer));
}

#[test]
fn a_source_gets_its_share_of_the_circuits_to_one_destination() {
    let (mgr, _) = manager(|c| c.circuits_per_destination = 8);
    let dst = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.1"))
        .expect("conn");
    let (attacker, member) = (PeerId::random(), PeerId::random());
    let stop = |source: PeerId| {
        let mut g = mgr.open_stream(&dst, Proto::RelayStop, false)?;
        mgr.charge_circuit_source(&mut g, source).map(|()| g)
    };
    // Alone, the attacker gets half of the destination's circuits.
    let mut held: Vec<_> = (0..4).map(|_| stop(attacker).expect("share")).collect();
    let r = stop(attacker).expect_err("over its share");
    assert_eq!((r.resource, r.scope), (Resource::Circuit, Scope::Source));
    assert_eq!(
        refused(&mgr, Resource::Circuit, Scope::Source, "relay_stop"),
        1
    );
    // Another member still gets circuits to it.
    let m1 = stop(member).expect("member 1");
    let m2 = stop(member).expect("member 2");
    // The refused stream released its place: 6 held.
    assert_eq!(mgr.state.lock().circuit_sources[&dst.peer][&attacker], 4);
    // A circuit the attacker closes frees its share.
    held.pop();
    assert!(stop(attacker).is_err(), "3 held, 3 free: still its share");
    drop(m1);
    held.push(stop(attacker).expect("3 held, 4 free"));
    drop(held);
    drop(m2);
    assert!(
        mgr.state.lock().circuit_sources.is_empty(),
        "nothing left behind"
    );
}

#[test]
fn every_refusal_label_is_pre_created() {
    let mut reg = Registry::default();
    let refused = Family::default();
    reg.register("agentmesh_router_refused", "refusals", refused.clone());
    let _mgr = ResourceManager::new(
        {
            let c = config::ResourceConfig::default();
            budgets_of(&c, 1 << 30)
        },
        &mut reg,
        refused,
        Deps::nobody(),
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
    let series = text
        .lines()
        .filter(|l| l.starts_with("agentmesh_router_refused_total{"))
        .count();
    assert_eq!(
        series,
        Resource::ALL.len() * Scope::ALL.len() * (Proto::COUNT + 1)
    );
    assert!(text.contains(
        "agentmesh_router_refused_total{resource=\"circuit\",scope=\"peer\",protocol=\"relay_stop\"} 0"
    ));
    assert!(text.contains("agentmesh_router_memory_budget_bytes 1073741824"));
    assert!(text.contains("agentmesh_router_ipv6_source_prefix_len 64"));
    assert!(text.contains(
        "agentmesh_router_refused_total{resource=\"memory\",scope=\"peer\",protocol=\"relay_hop\"} 0"
    ));
    // 5% of the 1 GiB budget.
    assert!(text.contains("agentmesh_router_memory_per_peer_max_bytes 53687091"));
    for p in Proto::ALL {
        assert!(text.contains(&format!(
            "agentmesh_router_streams{{protocol=\"{}\",direction=\"inbound\"}} 0",
            p.as_str()
        )));
    }
}

#[test]
fn handshakes_share_their_sources_room_and_the_budget_and_shed_for_newcomers() {
    let (mgr, admitted) = manager(|c| c.pending_connections_max = 3);
    let h = mgr.handshakes();
    let src = ip("10.0.0.9");
    // Limit 2 per IP (see `manager`) and the newcomer past it: a room of 3.
    assert_eq!(mgr.handshake_room(src), Some(3));
    let first = h.admit(src, h.arriving()).expect("1");
    let _second = h.admit(src, h.arriving()).expect("2");
    let _third = h.admit(src, h.arriving()).expect("the newcomer");
    // A fourth finds the room full: the oldest that has not started gives
    // way to it (its upgrade is told and closes its socket).
    let _fourth = h.admit(src, h.arriving()).expect("sheds the oldest");
    assert!(first.is_shed());
    assert_eq!(handshakes_shed(&mgr, "source_full"), 1);
    assert_eq!(h.held_by(src), 3);
    // The whole budget (3) is taken: sources holding fewer take the
    // heaviest one's least progressed, until each holds one, and then a
    // newcomer is refused its share (sources in /24s of their own: the
    // table keys IPv4 sources per /24 as it fills).
    let _other = h.admit(ip("10.0.1.1"), h.arriving()).expect("lighter");
    let _third_source = h.admit(ip("10.0.2.1"), h.arriving()).expect("lighter");
    assert_eq!(handshakes_shed(&mgr, "lighter_source"), 2);
    assert!(h.admit(ip("10.0.3.1"), h.arriving()).is_none());
    assert_eq!(handshakes_refused(&mgr, "budget_share"), 1);
    assert_eq!(
        refused(&mgr, Resource::Connection, Scope::Source, "none"),
        1
    );
    assert_eq!(h.in_progress(), 3);
    // An established connection from the IP whose peer is not admitted
    // takes a place of its room; once its peer is admitted it no longer does.
    let peer = PeerId::random();
    let _c = mgr
        .open_connection(peer, &inbound_from("10.0.0.9"))
        .expect("conn");
    assert_eq!(mgr.handshake_room(src), Some(2));
    admitted.write().insert(peer);
    mgr.peer_admitted(&peer);
    assert_eq!(mgr.handshake_room(src), Some(3));
}

#[test]
fn a_peer_is_connected_while_a_muxer_of_it_lives() {
    let (mgr, _) = manager(|_| {});
    let peer = PeerId::random();
    assert!(!mgr.is_connected(&peer));
    let first = mgr
        .open_connection(peer, &inbound_from("10.0.0.1"))
        .expect("first");
    let second = mgr
        .open_connection(peer, &inbound_from("10.0.0.1"))
        .expect("second");
    // A stream still held (say, the auth stream being served) keeps the
    // charge, not the connection.
    let auth = mgr.open_stream(&first, Proto::Auth, true).expect("auth");
    first.muxer_dropped();
    assert!(mgr.is_connected(&peer), "its second connection lives");
    second.muxer_dropped();
    second.muxer_dropped();
    assert!(!mgr.is_connected(&peer), "both muxers gone");
    drop(second);
    drop(first);
    assert!(!mgr.is_connected(&peer));
    drop(auth);
    assert!(mgr.state.lock().peers.is_empty());
    // A guard dropped without its muxer ever reporting counts down too.
    let third = mgr
        .open_connection(peer, &inbound_from("10.0.0.1"))
        .expect("third");
    assert!(mgr.is_connected(&peer));
    drop(third);
    assert!(!mgr.is_connected(&peer));
}

#[test]
fn ipv6_sources_in_one_prefix_share_one_share() {
    // Limit 2 per source (see `manager`), default prefix /64.
    let (mgr, _) = manager(|_| {});
    let _full = fill_source(
        &mgr,
        [
            "2001:db8:1:2::1",
            "2001:db8:1:2:ffff::9",
            "2001:db8:1:2::77",
        ],
    );
    let err = mgr
        .open_connection(PeerId::random(), &inbound_from("2001:db8:1:2::3"))
        .expect_err("a fourth address of the same /64: past the cap and its newcomer");
    assert_eq!(
        (err.resource, err.scope),
        (Resource::Connection, Scope::Source)
    );
    assert_eq!(
        refused(&mgr, Resource::Connection, Scope::Source, "none"),
        1
    );
    // Handshakes from the /64 are refused too, before they start: its
    // room is full of connections and it holds no handshake to give.
    let h = mgr.handshakes();
    assert!(h.admit(ip("2001:db8:1:2::77"), h.arriving()).is_none());
    assert_eq!(handshakes_refused(&mgr, "source_full"), 1);
    // Another /64 has its own share.
    let _c3 = mgr
        .open_connection(PeerId::random(), &inbound_from("2001:db8:1:3::1"))
        .expect("another /64");
    let _h = h
        .admit(ip("2001:db8:1:3::2"), h.arriving())
        .expect("handshake from another /64");
    assert_eq!(mgr.state.lock().sources.len(), 2, "one entry per /64");
}

#[test]
fn failed_logins_count_against_the_whole_ipv6_prefix() {
    // 3 failed logins per source per minute (see `manager`).
    let (mgr, _) = manager(|_| {});
    let liar = PeerId::random();
    let _c = mgr
        .open_connection(liar, &inbound_from("2001:db8:9:9::1"))
        .expect("conn");
    for _ in 0..3 {
        mgr.failed_login(
            Some("2001:db8:9:9::1".parse().expect("ip")),
            "bad_signature",
        );
    }
    let err = mgr
        .open_connection(PeerId::random(), &inbound_from("2001:db8:9:9::2"))
        .expect_err("another address of the /64 after 3 failed logins");
    assert_eq!(err.scope, Scope::Source);
    mgr.open_connection(PeerId::random(), &inbound_from("2001:db8:9:a::1"))
        .expect("another /64 did not fail any login");
}

#[test]
fn prefix_128_counts_each_ipv6_address_alone() {
    let (mgr, _) = manager(|c| c.ipv6_source_prefix_len = 128);
    let held: Vec<_> = (1..=6)
        .map(|i| {
            mgr.open_connection(
                PeerId::random(),
                &inbound_from(&format!("2001:db8:1:2::{i}")),
            )
            .expect("each address has its own share")
        })
        .collect();
    assert_eq!(mgr.state.lock().sources.len(), held.len());
    let _second = mgr
        .open_connection(PeerId::random(), &inbound_from("2001:db8:1:2::1"))
        .expect("2nd from one address");
    let _newcomer = mgr
        .open_connection(PeerId::random(), &inbound_from("2001:db8:1:2::1"))
        .expect("the newcomer past the cap");
    mgr.open_connection(PeerId::random(), &inbound_from("2001:db8:1:2::1"))
        .expect_err("4th from one address");
}

#[test]
fn an_ipv4_mapped_source_counts_as_its_ipv4_address() {
    let (mgr, _) = manager(|_| {});
    let _full = fill_source(&mgr, ["10.0.0.9", "::ffff:10.0.0.9", "::ffff:10.0.0.9"]);
    let err = mgr
        .open_connection(PeerId::random(), &inbound_from("::ffff:10.0.0.9"))
        .expect_err("the same IPv4 host, mapped");
    assert_eq!(err.scope, Scope::Source);
    // Other IPv4 hosts, mapped or not, are other sources (not one ::/64).
    let _c3 = mgr
        .open_connection(PeerId::random(), &inbound_from("::ffff:10.0.0.10"))
        .expect("another IPv4 host");
    let _c4 = mgr
        .open_connection(PeerId::random(), &inbound_from("::ffff:10.0.0.11"))
        .expect("and another");
}

#[test]
fn one_peers_streams_are_refused_past_its_memory_share_and_others_still_open() {
    // 2% of the 64 MiB budget: 1.28 MiB, five relay HOP windows.
    let (mgr, _) = manager(|c| c.memory_per_peer_max_percent = 2);
    let share = mgr.budgets().peer_memory_bytes;
    assert_eq!(share, (64 << 20) * 2 / 100);
    let fit = share / Proto::RelayHop.charge_bytes();
    assert_eq!(fit, 5);
    let busy = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.1"))
        .expect("busy caller");
    let mut held: Vec<_> = (0..fit)
        .map(|_| {
            mgr.open_stream(&busy, Proto::RelayHop, true)
                .expect("within its share")
        })
        .collect();
    let err = mgr
        .open_stream(&busy, Proto::RelayHop, true)
        .expect_err("past its share");
    assert_eq!((err.resource, err.scope), (Resource::Memory, Scope::Peer));
    assert_eq!(refused(&mgr, Resource::Memory, Scope::Peer, "relay_hop"), 1);
    assert_eq!(
        refused(&mgr, Resource::Memory, Scope::System, "relay_hop"),
        0,
        "the budget itself has room"
    );
    // A control stream that no longer fits is refused too.
    let left = share - fit * Proto::RelayHop.charge_bytes();
    assert!(left < Proto::Auth.charge_bytes());
    assert_eq!(
        mgr.open_stream(&busy, Proto::Auth, true)
            .expect_err("auth")
            .scope,
        Scope::Peer
    );
    // Another caller has a share of its own.
    let other = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.2"))
        .expect("other caller");
    let _o = mgr
        .open_stream(&other, Proto::RelayHop, true)
        .expect("another peer's share");
    // Circuits towards the busy peer (STOP streams, which others open) are
    // not its share.
    let _stop = mgr
        .open_stream(&busy, Proto::RelayStop, false)
        .expect("a circuit to it");
    // A stream that ends frees its place.
    held.pop();
    let _again = mgr
        .open_stream(&busy, Proto::RelayHop, true)
        .expect("room again");
    drop(held);
    drop(_again);
    assert_eq!(
        mgr.state
            .lock()
            .peers
            .get(&busy.peer)
            .map(|u| u.inbound_memory),
        Some(0)
    );
}

#[test]
fn a_small_budget_still_gives_each_peer_four_data_streams() {
    let config = config::ResourceConfig::default();
    let budget = 8 << 20;
    let b = budgets_of(&config, budget);
    // 5% of 8 MiB is 410 KiB: the floor wins.
    assert_eq!(b.peer_memory_bytes, budget::PEER_MEMORY_FLOOR_BYTES);
    assert_eq!(
        budget::PEER_MEMORY_FLOOR_BYTES,
        4 * Proto::RelayHop.charge_bytes()
    );
    let big = 1 << 30;
    assert_eq!(budgets_of(&config, big).peer_memory_bytes, big * 5 / 100);
}

#[test]
fn strangers_are_charged_in_their_pool_until_admitted() {
    let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 100);
    let pool = mgr.budgets().unauthenticated_memory_bytes;
    let stranger = PeerId::random();
    let conn = mgr
        .open_connection(stranger, &inbound_from("10.0.0.20"))
        .expect("conn");
    let auth = mgr.open_stream(&conn, Proto::Auth, true).expect("auth");
    let held = || mgr.state.lock().strangers.used();
    let charge = mgr.budgets().connection_charge_bytes + Proto::Auth.charge_bytes();
    assert_eq!(held(), charge);
    assert_eq!(
        mgr.metrics.unauthenticated_memory_in_use.get(),
        charge as i64
    );
    // Admitted: its charges leave the pool; its later streams never enter it.
    admitted.write().insert(stranger);
    mgr.peer_admitted(&stranger);
    assert_eq!(held(), 0);
    let later = mgr
        .open_stream(&conn, Proto::Catalog, true)
        .expect("catalog");
    assert_eq!(held(), 0);
    drop((auth, later, conn));
    assert_eq!(held(), 0);
    assert_eq!(mgr.state.lock().memory, 0);
    assert!(pool >= 64 * charge, "the pool holds one source's share");
    // A peer we dialed (another router) is not a stranger, nor its streams.
    let dial = ConnectedPoint::Dialer {
        address: "/ip4/10.0.0.9/tcp/1".parse().expect("addr"),
        role_override: Endpoint::Dialer,
        port_use: libp2p::core::transport::PortUse::Reuse,
    };
    let dialed = mgr.open_connection(PeerId::random(), &dial).expect("dial");
    let _kad = mgr.open_stream(&dialed, Proto::Kad, true).expect("kad");
    assert_eq!(held(), 0);
}

#[test]
fn a_full_strangers_pool_refuses_strangers_but_never_members() {
    // A pool of 20% of the 64 MiB budget (see `manager`): about a dozen
    // strangers' connections of 1 MiB, each from its own address.
    let (mgr, admitted) = manager(|c| c.connection_charge_bytes = 1 << 20);
    let pool = mgr.budgets().unauthenticated_memory_bytes;
    let mut held = Vec::new();
    let mut refused_at = None;
    for i in 0..64u32 {
        let ip = format!("10.1.{}.{}", i / 200, i % 200 + 1);
        match mgr.open_connection(PeerId::random(), &inbound_from(&ip)) {
            Ok(c) => held.push(c),
            Err(r) => {
                refused_at = Some((i, r));
                break;
            }
        }
    }
    let (n, r) = refused_at.expect("the pool fills");
    assert_eq!(r.resource, Resource::Memory);
    assert!(
        matches!(r.scope, Scope::Unauthenticated | Scope::Source),
        "{r:?}"
    );
    assert!(
        u64::from(n) * (1 << 20) <= pool,
        "no more than the pool: {n}"
    );
    // A member (admitted, reconnecting) is charged to the budget as before.
    let member = PeerId::random();
    admitted.write().insert(member);
    mgr.open_connection(member, &inbound_from("10.9.9.9"))
        .expect("members are not charged to the strangers' pool");
}

#[test]
fn charged_circuits_are_cut_when_no_longer_allowed_and_leave_on_drop() {
    let (mgr, _) = manager(|_| {});
    let dst = mgr
        .open_connection(PeerId::random(), &inbound_from("10.0.0.1"))
        .expect("conn");
    let (a, b) = (PeerId::random(), PeerId::random());
    let stop = |source: PeerId| {
        let mut g = mgr
            .open_stream(&dst, Proto::RelayStop, false)
            .expect("stream");
        mgr.charge_circuit_source(&mut g, source).expect("charged");
        g
    };
    let (from_a, from_b) = (stop(a), stop(b));
    let waker = futures::task::noop_waker();
    let cx = std::task::Context::from_waker(&waker);
    assert!(!from_a.poll_is_cut(&cx) && !from_b.poll_is_cut(&cx));
    assert_eq!(
        from_a.peer(),
        dst.peer,
        "the destination is the connection's peer"
    );
    assert_eq!(mgr.cut_circuits(|s, d| *s != a || *d != dst.peer), 1);
    assert!(from_a.poll_is_cut(&cx), "a's circuit is cut");
    assert!(!from_b.poll_is_cut(&cx), "b's stays");
    drop((from_a, from_b));
    assert_eq!(
        mgr.circuits.len(),
        0,
        "cut or not, a dropped circuit leaves"
    );
}
