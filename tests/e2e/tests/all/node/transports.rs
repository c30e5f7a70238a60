//! How members reach routers: QUIC, from a source IP or not, and routers that
//! announce DNS names. A real control plane, real routers started with
//! `spawn`, real nodes on loopback.

use super::support;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::udp_sockets_on;
use support::*;

/// A free loopback port for `proto` ("tcp" or "udp").
async fn free_port(proto: &str) -> u16 {
    if proto == "udp" {
        agentmesh_testkit::free_udp_port()
    } else {
        agentmesh_testkit::free_tcp_port()
    }
}

/// A provider `b` and a caller `a` on one router that listens on QUIC only,
/// dialing from `b_source` and `a_source` (none: the default), attach and
/// call each other through it (a 64 KiB round trip).
async fn call_over_quic(b_source: Option<IpAddr>, a_source: Option<IpAddr>) {
    let cp = start_cp().await;
    let r = start_router_on(
        &cp,
        "q",
        Duration::from_secs(1),
        "/ip4/127.0.0.1/udp/0/quic-v1",
    )
    .await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |mut base| {
            base.connections.dial_source_ip = b_source;
            base
        },
        |mut base| {
            base.connections.dial_source_ip = a_source;
            base
        },
    )
    .await;
    let mut s = call_until_found(&a, "echo").await;
    assert_eq!(s.route().via_router, r.handle.peer_id());
    round_trip(&mut s, 64 * 1024).await;
    drop(s);
    a.shutdown().await;
    b.shutdown().await;
    r.handle.shutdown().await;
}

/// Members attach and call over QUIC (the router listens on QUIC only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_attach_and_call_over_quic() {
    call_over_quic(None, None).await;
}

/// A provider and a caller, each dialing from its own 127.0.0.x over QUIC
/// (the router listens on QUIC only), attach and call each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_dial_quic_from_their_source_ip() {
    let source = |ip: &str| Some(ip.parse::<IpAddr>().expect("ip"));
    call_over_quic(source("127.0.0.2"), source("127.0.0.3")).await;
}

/// A member with `--dial-source-ip` attached to a TCP-only router has
/// opened no UDP socket; its first QUIC dial (a transit connection to the
/// provider's QUIC-only router, for a call) opens exactly one, from its
/// source IP, and a second call opens no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quic_socket_is_opened_by_the_first_quic_dial() {
    let cp = start_cp().await;
    let tcp = start_router_on(&cp, "tcp", Duration::from_secs(1), "/ip4/127.0.0.1/tcp/0").await;
    let quic = start_router_on(
        &cp,
        "quic",
        Duration::from_secs(1),
        "/ip4/127.0.0.1/udp/0/quic-v1",
    )
    .await;
    let member = cp.token(Role::Member).await;
    // An address no other test uses: the count is of the whole namespace.
    let source = Ipv4Addr::new(127, 0, 62, 3);
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |mut base| {
            base.routers.selector = selector("quic");
            base
        },
        |mut base| {
            base.routers.selector = selector("tcp");
            base.connections.dial_source_ip = Some(source.into());
            base
        },
    )
    .await;
    assert_eq!(a.status().borrow().reserved, vec![tcp.handle.peer_id()]);
    assert_eq!(
        udp_sockets_on(source),
        0,
        "a member only on a TCP router opened a UDP socket"
    );

    let mut s = call_until_found(&a, "echo").await;
    assert_eq!(s.route().via_router, quic.handle.peer_id());
    assert!(s.route().transit, "{:?}", s.route());
    round_trip(&mut s, 1024).await;
    drop(s);
    assert_eq!(udp_sockets_on(source), 1, "after the first QUIC dial");

    // Later calls (and any redial of the QUIC router) keep that one socket.
    let mut s = call_until_found(&a, "echo").await;
    round_trip(&mut s, 1024).await;
    drop(s);
    assert_eq!(udp_sockets_on(source), 1, "after another QUIC call");

    a.shutdown().await;
    b.shutdown().await;
    tcp.handle.shutdown().await;
    quic.handle.shutdown().await;
}

/// Routers announcing `/dns4/localhost/...` (as behind a Kubernetes
/// Service) are reached by name, over TCP and over QUIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_dial_routers_that_announce_dns_names() {
    let cp = start_cp().await;
    let tcp_port = free_port("tcp").await;
    let udp_port = free_port("udp").await;
    let tcp = start_router_tweaked(
        &cp,
        "tcp",
        Duration::from_secs(1),
        &format!("/ip4/127.0.0.1/tcp/{tcp_port}"),
        |c| {
            c.external_addr = vec![
                format!("/dns4/localhost/tcp/{tcp_port}")
                    .parse()
                    .expect("addr"),
            ]
        },
    )
    .await;
    let quic = start_router_tweaked(
        &cp,
        "quic",
        Duration::from_secs(1),
        &format!("/ip4/127.0.0.1/udp/{udp_port}/quic-v1"),
        |c| {
            c.external_addr = vec![
                format!("/dns4/localhost/udp/{udp_port}/quic-v1")
                    .parse()
                    .expect("addr"),
            ]
        },
    )
    .await;
    let member = cp.token(Role::Member).await;
    for (name, router) in [("tcp", &tcp), ("quic", &quic)] {
        let announced = router.handle.external_addrs();
        assert!(
            announced
                .iter()
                .all(|a| a.to_string().starts_with("/dns4/localhost/")),
            "{name} router announces {announced:?}"
        );
        let (n, _dir) = spawn_node(&cp, &member, "spawn", |mut base| {
            base.routers.selector = selector(name);
            base
        })
        .await;
        ready(&n, name).await;
        assert_eq!(
            n.status().borrow().reserved,
            vec![router.handle.peer_id()],
            "{name}"
        );
        n.shutdown().await;
    }
    tcp.handle.shutdown().await;
    quic.handle.shutdown().await;
}
