//! Limits that bite before admission, on loopback with real sockets:
//!
//! - a source IP opening many connections sheds its own before the
//!   handshake (raw TCP connections that never start noise fill their IP's
//!   share; the next one takes the oldest one's place, which is closed
//!   unread and counted), a real dial from the same IP gets in, and
//!   admitted members from the same IP do not count;
//! - the high watermark sized from the memory budget (no flag) is what a
//!   new member meets: go-away instead of admission at the watermark;
//! - an auth stream that sends no byte in time is a failed login of its
//!   source, one that started and stalls is not; failed logins block the
//!   source's new connections.

use crate::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{Purpose, auth_response};
use agentmesh_router::Config;
use futures::AsyncWriteExt as _;
use libp2p::multiaddr::Protocol;
use support::cp::{Cp, start_cp};
use support::{DEADLINE, TestPeer, TestRouter, eventually};
use tokio::io::AsyncReadExt;

type Router = TestRouter;

/// What these tests read of a router.
trait LimitsRouter {
    /// Connections refused before the handshake, by `scope`.
    fn refused_connections(&self, scope: &str) -> f64;
    /// Handshakes that never started, closed for a newcomer of their source.
    fn shed_silent(&self) -> f64;
    /// The router's TCP listen address as a socket address.
    fn socket_addr(&self) -> std::net::SocketAddr;
}

impl LimitsRouter for TestRouter {
    fn refused_connections(&self, scope: &str) -> f64 {
        self.refused("connection", scope, "none")
    }

    fn shed_silent(&self) -> f64 {
        self.metric(
            r#"agentmesh_router_handshakes_shed_total{reason="source_full",progress="none"}"#,
        )
    }
    fn socket_addr(&self) -> std::net::SocketAddr {
        let mut ip = None;
        let mut port = None;
        for p in self.addr.iter() {
            match p {
                Protocol::Ip4(a) => ip = Some(a),
                Protocol::Tcp(p) => port = Some(p),
                _ => {}
            }
        }
        (ip.expect("ip4"), port.expect("tcp")).into()
    }
}

/// A router with a 60 s auth deadline and a 10 s control-plane retry
/// budget; `adjust` changes anything else.
async fn start_router(cp: &Cp, adjust: impl FnOnce(&mut Config)) -> Router {
    TestRouter::start(cp, &[], |c| {
        c.auth.deadline = Duration::from_secs(60);
        c.control_plane.retry_budget = Duration::from_secs(10);
        adjust(c);
    })
    .await
}

/// A TCP connection that never starts the noise handshake.
async fn silent(r: &Router) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(r.socket_addr())
        .await
        .expect("tcp connect")
}

/// Reads until the router closes `s` (EOF or reset), within the deadline.
async fn closed_by_router(mut s: tokio::net::TcpStream) {
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(DEADLINE, s.read(&mut buf))
        .await
        .expect("the router closes the refused connection in time");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "nothing is sent on a refused connection: {n:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_from_one_ip_sheds_its_own_handshakes() {
    const PER_IP: u32 = 4;
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources.unauthenticated_connections_per_ip = PER_IP;
    })
    .await;
    assert_eq!(r.shed_silent(), 0.0);

    // Four silent connections hold 127.0.0.1's share of handshakes, and a
    // fifth is let past it as the source's newcomer (were it to finish its
    // handshake, the source's oldest unauthenticated connection would go).
    let mut held = std::collections::VecDeque::new();
    for _ in 0..=PER_IP {
        held.push_back(silent(&r).await);
    }
    // A sixth takes the place of the oldest, which is closed without a
    // byte: its handshake never started.
    held.push_back(silent(&r).await);
    closed_by_router(held.pop_front().expect("oldest")).await;
    assert_eq!(r.shed_silent(), 1.0);
    // A real libp2p dial from the same address gets in: its handshake
    // starts at once, and another silent one gives way to it.
    let dialer = TestPeer::new();
    let addr = r.addr.clone();
    dialer
        .with_swarm(move |s| s.dial(addr).expect("dial"))
        .await;
    eventually("the libp2p dial gets in past the flood", || async {
        dialer.is_connected(r.handle.peer_id()).await.then_some(())
    })
    .await;
    assert_eq!(r.shed_silent(), 2.0);
    assert_eq!(r.refused_connections("source"), 0.0, "nothing refused");
    drop(dialer);

    // The flood ends: its handshakes stop counting.
    drop(held);
    let token = cp.token(Role::Member).await;
    let mut members = Vec::new();
    for _ in 0..PER_IP + 2 {
        // Admitted members from the same IP do not count, so more of them
        // than the per-IP share get in, one after the other.
        let m = TestPeer::new();
        eventually("a member connects once the flood is gone", || async {
            let addr = r.addr.clone();
            m.with_swarm(move |s| s.dial(addr).expect("dial")).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            m.is_connected(r.handle.peer_id()).await.then_some(())
        })
        .await;
        let cred = cp.enroll(&token, &m.key).await;
        let resp = m
            .auth(r.handle.peer_id(), Some(cred), Purpose::Attach)
            .await;
        assert!(
            matches!(resp.result, Some(auth_response::Result::Admitted(_))),
            "{resp:?}"
        );
        members.push(m);
    }
    // With six admitted members on 127.0.0.1 the IP's share is free again:
    // five silent ones fit, a sixth takes the oldest one's place.
    let shed = r.shed_silent();
    let mut held = std::collections::VecDeque::new();
    for _ in 0..=PER_IP {
        held.push_back(silent(&r).await);
    }
    assert_eq!(r.shed_silent(), shed);
    held.push_back(silent(&r).await);
    closed_by_router(held.pop_front().expect("oldest")).await;
    assert_eq!(r.shed_silent(), shed + 1.0);
    for m in &members {
        assert!(m.is_connected(r.handle.peer_id()).await, "members stay");
    }
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_high_watermark_sized_from_the_memory_budget_answers_go_away() {
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        // 8 MiB × 3% ÷ 72 KiB per idle member = 3 members; low == high so
        // trimming does not make room while the test fills the router.
        c.resources.memory_limit_bytes = Some(8 << 20);
        c.resources.memory_budget_percent = 100;
        c.watermarks.high_memory_percent = 3;
        c.watermarks.low = Some(3);
    })
    .await;
    let s = r.handle.sizing();
    assert!(s.sized_from_memory);
    assert_eq!(
        (s.high_watermark, s.relay_max_reservations),
        (3, 3),
        "{s:?}"
    );
    let token = cp.token(Role::Member).await;
    let mut members = Vec::new();
    for i in 0..5 {
        let (m, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
        let resp = m
            .auth(r.handle.peer_id(), Some(cred), Purpose::Attach)
            .await;
        if i < 3 {
            assert!(
                matches!(resp.result, Some(auth_response::Result::Admitted(_))),
                "member {i}: {resp:?}"
            );
        } else {
            assert!(
                matches!(resp.result, Some(auth_response::Result::GoAway(_))),
                "member {i} at the sized watermark: {resp:?}"
            );
        }
        members.push(m);
    }
    eventually("attached gauge at the sized watermark", || async {
        (r.metric("agentmesh_router_attached_members") == 3.0).then_some(())
    })
    .await;
    assert_eq!(
        r.metric("agentmesh_router_goaway_sent_total{reason=\"overloaded\",result=\"on_auth\"}"),
        2.0
    );
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuits_of_one_source_peer_are_capped_by_its_hop_streams() {
    use support::Ev;
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources
            .peer_stream_budgets
            .insert("relay_hop".into(), 2);
    })
    .await;
    let router = r.handle.peer_id();
    let token = cp.token(Role::Member).await;
    let circuit = r
        .addr
        .clone()
        .with(Protocol::P2p(router))
        .with(Protocol::P2pCircuit);

    // Two members attach and reserve; each serves echo.
    let mut dsts = Vec::new();
    let mut echoes = Vec::new();
    for _ in 0..2 {
        let (mut d, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
        let resp = d.auth(router, Some(cred), Purpose::Attach).await;
        assert!(matches!(
            resp.result,
            Some(auth_response::Result::Admitted(_))
        ));
        let c = circuit.clone();
        d.with_swarm(move |s| s.listen_on(c).expect("listen on circuit"))
            .await;
        d.wait(
            "reservation accepted",
            |e| matches!(e, Ev::ListenAddr(a) if a.iter().any(|p| p == Protocol::P2pCircuit)),
        )
        .await;
        echoes.push(d.serve_echo("/test/echo/1"));
        dsts.push(d);
    }

    // One source (transit) opens circuits: two to A fit its HOP budget, a
    // third, to B, is refused for that source peer, not for B.
    let (mut src, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
    let resp = src.auth(router, Some(cred), Purpose::Transit).await;
    assert!(matches!(
        resp.result,
        Some(auth_response::Result::Admitted(_))
    ));
    let (a, b) = (dsts[0].peer_id, dsts[1].peer_id);
    for _ in 0..2 {
        src.dial_through(&circuit, a).await;
        src.wait(
            "relayed connection to A",
            |e| matches!(e, Ev::Connected { peer, relayed: true } if *peer == a),
        )
        .await;
    }
    let refused =
        "agentmesh_router_refused_total{resource=\"stream\",scope=\"peer\",protocol=\"relay_hop\"}";
    assert_eq!(r.metric(refused), 0.0);
    src.dial_through(&circuit, b).await;
    eventually("the source's third circuit refused", || async {
        (r.metric(refused) >= 1.0).then_some(())
    })
    .await;
    assert!(
        !src.is_connected(b).await,
        "no circuit to B beyond the source's budget"
    );
    // B itself is not limited: another source reaches it.
    let (mut other, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
    let resp = other.auth(router, Some(cred), Purpose::Transit).await;
    assert!(matches!(
        resp.result,
        Some(auth_response::Result::Admitted(_))
    ));
    other.dial_through(&circuit, b).await;
    other
        .wait(
            "relayed connection to B from another source",
            |e| matches!(e, Ev::Connected { peer, relayed: true } if *peer == b),
        )
        .await;
    let data = vec![9u8; 16 * 1024];
    assert_eq!(other.echo(b, "/test/echo/1", &data).await, data);
    r.handle.shutdown().await;
}

/// Reads `s` until the router closes it, within the deadline.
async fn stream_closed_by_router(mut s: libp2p::Stream) {
    let mut buf = [0u8; 64];
    loop {
        let n = tokio::time::timeout(DEADLINE, futures::AsyncReadExt::read(&mut s, &mut buf))
            .await
            .expect("the router closes the stream in time");
        if matches!(n, Ok(0) | Err(_)) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_auth_stream_is_a_failed_login_and_a_slow_one_is_not() {
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.auth.first_byte_timeout = Duration::from_millis(200);
        c.connections.stream_timeout = Duration::from_secs(1);
        c.resources.failed_logins_per_ip_per_minute = 3;
        // The block outlasts the test.
        c.resources.failed_login_block_secs = 3600;
    })
    .await;
    let silent_logins = r#"agentmesh_router_failed_logins_total{reason="silent"}"#;
    let blocks = "agentmesh_router_failed_login_blocks_total";
    let mut p = TestPeer::new();
    p.connect(r.id(), r.addr.clone()).await;

    // Slow: one length byte, then nothing. Closed at the stream timeout
    // as an i/o error, not a failed login.
    let mut slow = p.open(r.id(), agentmesh_proto::protocols::AUTH).await;
    slow.write_all(&[64]).await.expect("write");
    slow.flush().await.expect("flush");
    stream_closed_by_router(slow).await;
    eventually("the slow stream counted as i/o", || async {
        (r.metric(r#"agentmesh_router_auth_total{purpose="attach",result="io"}"#) >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(r.metric(silent_logins), 0.0);

    // Silent: each closed past the first-byte deadline and a failed login;
    // the third blocks 127.0.0.1.
    for _ in 0..3 {
        let s = p.open(r.id(), agentmesh_proto::protocols::AUTH).await;
        stream_closed_by_router(s).await;
    }
    eventually("three silent streams counted", || async {
        (r.metric(silent_logins) >= 3.0).then_some(())
    })
    .await;
    assert_eq!(
        r.metric(r#"agentmesh_router_auth_total{purpose="attach",result="silent"}"#),
        3.0
    );
    assert_eq!(r.metric(blocks), 1.0);
    // The blocked source's new connections are refused before the handshake.
    let before = r.refused_connections("source");
    closed_by_router(silent(&r).await).await;
    assert_eq!(r.refused_connections("source"), before + 1.0);
    r.handle.shutdown().await;
}

/// A member re-presenting its credential on a connection it is admitted on
/// may be late (a loaded host, credentials refreshed every few seconds):
/// its auth stream, silent past the first-byte deadline, is still served
/// and is no failed login; a stranger's is closed at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_members_late_re_presentation_is_served_and_no_failed_login() {
    use agentmesh_proto::pb::mesh::{AuthRequest, AuthResponse};
    use agentmesh_wire::frame::{read_frame, write_frame};
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.auth.first_byte_timeout = Duration::from_millis(200);
        c.connections.stream_timeout = Duration::from_secs(5);
    })
    .await;
    let silent_logins = r#"agentmesh_router_failed_logins_total{reason="silent"}"#;
    let token = cp.token(Role::Member).await;
    let (m, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
    let first = m.auth(r.id(), Some(cred.clone()), Purpose::Attach).await;
    assert!(
        matches!(first.result, Some(auth_response::Result::Admitted(_))),
        "{first:?}"
    );

    // Re-presentation whose request comes 4× the first-byte deadline late.
    let mut s = m.open(r.id(), agentmesh_proto::protocols::AUTH).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let req = AuthRequest {
        credential: Some(cred),
        purpose: Purpose::Attach as i32,
        ..Default::default()
    };
    write_frame(&mut s, &req)
        .await
        .expect("late request written");
    let again: AuthResponse = read_frame(&mut s, 1 << 20)
        .await
        .expect("the router answers the late re-presentation");
    assert!(
        matches!(again.result, Some(auth_response::Result::Admitted(_))),
        "{again:?}"
    );
    assert_eq!(r.metric(silent_logins), 0.0);

    // A stranger's silent stream is still closed at the deadline and counted.
    let mut p = TestPeer::new();
    p.connect(r.id(), r.addr.clone()).await;
    let s = p.open(r.id(), agentmesh_proto::protocols::AUTH).await;
    stream_closed_by_router(s).await;
    eventually("the stranger's silent stream counted", || async {
        (r.metric(silent_logins) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(r.metric(silent_logins), 1.0);
    r.handle.shutdown().await;
}

/// `--listen-backlog-connections` reaches the kernel: the router's TCP
/// listening socket is created with that backlog (what `ss` shows as the
/// listener's Send-Q), and the kernel's overflow counter is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_backlog_flag_reaches_the_listening_socket() {
    let cp = start_cp().await;
    let router = Router::start(&cp, &[], |c: &mut Config| {
        c.resources.transport.listen_backlog_connections = 37;
        // The process-wide collectors (allocator, listen queue) are
        // registered under the watchdog switch, as in the binary.
        c.runtime_watchdog = true;
    })
    .await;
    let port = router.socket_addr().port();
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // State Recv-Q Send-Q Local Peer: for a listener Send-Q is the backlog.
    let backlogs: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(backlogs, ["37"], "ss output: {text}");
    let text = router.handle.metrics_text();
    assert!(
        text.contains("agentmesh_runtime_tcp_listen_overflows_total "),
        "{text}"
    );
}
