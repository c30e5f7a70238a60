//! The flood on a member's listening port (`handshakes.rs`), TCP and QUIC:
//! hosts open handshakes that never progress, past their sources' shares
//! and the whole budget, and an honest peer's handshake (real libp2p
//! dials: TCP + noise + yamux, or QUIC) still completes, even from the
//! flood's own address. It holds no relayed connection to the member, so
//! the member then closes it as `no_relayed_connection`: counted only
//! once the handshake is done, that is the proof it got through. The
//! flood's stalled handshakes give way, each counted under its reason and
//! its socket closed.
//!
//! Addresses: 127.0.X.1 of distinct /24s are distinct sources even once
//! the table aggregates IPv4 sources to /24s.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use agentmesh_streams::dial::{DialTcp, IpTarget, ip_target};
use futures::StreamExt as _;
use futures::future::poll_fn;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::{DialOpts, PortUse};
use libp2p::core::upgrade::Version;
use libp2p::core::{Endpoint, Transport};
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId, Swarm, noise, yamux};
use tokio::io::AsyncReadExt as _;

use super::tests_direct::{DEADLINE, listening_member};
use super::{Behaviour, quic};
use crate::metrics::{DirectMetrics, ReasonLabel};

/// `--direct-max-pending-inbound`, `--direct-max-pending-inbound-per-source`.
const BUDGET: (usize, usize) = (4, 2);
/// Sources: the flood's two hosts and a third.
const A: Ipv4Addr = Ipv4Addr::new(127, 0, 1, 1);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 1);
const C: Ipv4Addr = Ipv4Addr::new(127, 0, 3, 1);

const SOURCE_FULL: &str = "handshake_shed_source_full";
const BUDGET_FULL: &str = "handshake_shed_budget_full";
const LIGHTER: &str = "handshake_shed_lighter_source";
const HONEST_DONE: &str = "no_relayed_connection";

fn refused(m: &DirectMetrics, reason: &'static str) -> u64 {
    m.inbound_refused
        .get_or_create(&ReasonLabel { reason })
        .get()
}

fn in_progress(m: &DirectMetrics) -> u64 {
    u64::try_from(m.direct_handshakes_in_progress.get()).expect("a count")
}

/// Every handshake the table took: in progress, shed, or completed (and
/// refused as a stranger's). None times out here (see the callers).
fn accepted(m: &DirectMetrics) -> u64 {
    in_progress(m)
        + [SOURCE_FULL, BUDGET_FULL, LIGHTER, HONEST_DONE]
            .into_iter()
            .map(|r| refused(m, r))
            .sum::<u64>()
}

/// Waits until `done` holds (the member's task counted what a socket
/// did), at most [`DEADLINE`].
async fn until(what: &str, m: &DirectMetrics, mut done: impl FnMut(&DirectMetrics) -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !done(m) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{what}: in progress {}, source_full {}, budget_full {}, lighter {}, completed {}",
        in_progress(m),
        refused(m, SOURCE_FULL),
        refused(m, BUDGET_FULL),
        refused(m, LIGHTER),
        refused(m, HONEST_DONE),
    );
}

/// Drives the member's swarm until the test ends.
fn drive(mut swarm: Swarm<Behaviour>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            swarm.select_next_some().await;
        }
    })
}

fn socket_addr(addr: &Multiaddr) -> SocketAddr {
    match ip_target(addr).expect("an IP address") {
        IpTarget::Tcp(a) | IpTarget::Quic(a) => a,
    }
}

/// A stalled TCP handshake from `ip`: connected, never a byte sent.
async fn stall_tcp(ip: Ipv4Addr, to: SocketAddr) -> tokio::net::TcpStream {
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind(SocketAddr::new(ip.into(), 0)).expect("bind");
    s.connect(to).await.expect("connect")
}

/// Waits until the member closed `s` (EOF or reset).
async fn closed_by_the_member(s: &mut tokio::net::TcpStream, which: &str) {
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(DEADLINE, s.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0) | Err(_))),
        "{which}: not closed ({r:?})"
    );
}

/// An honest peer's handshake from `ip` (TCP with noise and yamux over a
/// real socket, or with `quic` QUIC from a socket bound there, as a member
/// dials) to the member `member` at `to`; returns once it completed.
async fn honest(ip: Ipv4Addr, to: Multiaddr, member: PeerId, quic: bool) {
    let key = Keypair::generate_ed25519();
    let mut t = if quic {
        quic::DialQuic::new(libp2p::quic::Config::new(&key), Some(IpAddr::V4(ip)))
            .map(|(p, c), _| (p, StreamMuxerBox::new(c)))
            .boxed()
    } else {
        DialTcp {
            source_ip: Some(ip.into()),
        }
        .upgrade(Version::V1)
        .authenticate(noise::Config::new(&key).expect("noise"))
        .multiplex(yamux::Config::default())
        .map(|(p, m), _| (p, StreamMuxerBox::new(m)))
        .boxed()
    };
    let dial = t
        .dial(
            to,
            DialOpts {
                role: Endpoint::Dialer,
                port_use: PortUse::New,
            },
        )
        .expect("dial");
    // The transport's own events (QUIC's socket), alongside.
    let socket = poll_fn(|cx| {
        let _ = Pin::new(&mut t).poll(cx);
        Poll::<()>::Pending
    });
    let done = tokio::time::timeout(DEADLINE, async {
        tokio::select! {
            r = dial => r,
            () = socket => unreachable!("polls forever"),
        }
    })
    .await
    .expect("the honest handshake in time");
    let (peer, _connection) = done.expect("the honest handshake completes");
    assert_eq!(peer, member);
}

/// A member listening (TCP, or QUIC with `quic`) with the test's budget,
/// its swarm driven, for a flood.
struct Flooded {
    m: DirectMetrics,
    member: PeerId,
    driver: tokio::task::JoinHandle<()>,
    addr: Multiaddr,
    to: SocketAddr,
}

/// [`Flooded`]. A connect timeout past the test: no stalled TCP handshake
/// ends by itself, so every slot freed is a shed (the counts are exact).
async fn flooded(quic: bool) -> Flooded {
    let m = DirectMetrics::default();
    let key = Keypair::generate_ed25519();
    let (swarm, addr) =
        listening_member(&key, quic, m.clone(), BUDGET, Duration::from_secs(600)).await;
    Flooded {
        m,
        member: key.public().to_peer_id(),
        driver: drive(swarm),
        to: socket_addr(&addr),
        addr,
    }
}

#[tokio::test]
async fn a_flood_of_stalled_tcp_handshakes_sheds_its_own_and_honest_peers_complete() {
    let Flooded {
        m,
        member,
        driver,
        addr,
        to,
    } = flooded(false).await;

    // Two hosts flood, each twice its share: the budget is full, and each
    // newcomer past its source's share sheds that source's oldest.
    let mut flood = Vec::new();
    for ip in [A, B] {
        for _ in 0..4 {
            flood.push(stall_tcp(ip, to).await);
            let n = flood.len() as u64;
            until("the flood's connection taken", &m, |m| accepted(m) == n).await;
        }
    }
    assert_eq!(in_progress(&m), 4, "the budget is full");
    assert_eq!(refused(&m, SOURCE_FULL), 4);
    for (i, which) in [
        (0, "A's first"),
        (1, "A's second"),
        (4, "B's first"),
        (5, "B's second"),
    ] {
        closed_by_the_member(&mut flood[i], which).await;
    }

    // An honest peer behind the flood's own address: its handshake sheds
    // the flood's oldest there, moves at once, and completes.
    honest(A, addr.clone(), member, false).await;
    until("the honest handshake from A counted", &m, |m| {
        refused(m, HONEST_DONE) == 1 && in_progress(m) == 3
    })
    .await;
    assert_eq!(refused(&m, SOURCE_FULL), 5);
    closed_by_the_member(&mut flood[2], "A's third").await;

    // The flood fills its share again: the budget is full...
    flood.push(stall_tcp(A, to).await);
    until("A's renewal taken", &m, |m| in_progress(m) == 4).await;
    // ...and an honest peer from a third host, holding nothing, takes the
    // place of a flooding host's oldest.
    honest(C, addr, member, false).await;
    until("the honest handshake from C counted", &m, |m| {
        refused(m, HONEST_DONE) == 2
    })
    .await;
    assert_eq!(refused(&m, LIGHTER), 1);
    assert_eq!(refused(&m, "pending_full"), 0);
    assert_eq!(refused(&m, BUDGET_FULL), 0);
    driver.abort();
}

/// The first datagram of a real QUIC client's handshake (its Initial,
/// fresh connection ids each time), as sent to a socket that never
/// answers.
async fn client_initial(client: &mut libp2p::quic::tokio::Transport) -> Vec<u8> {
    let sink = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = sink.local_addr().expect("addr");
    let to = Multiaddr::from(at.ip())
        .with(libp2p::multiaddr::Protocol::Udp(at.port()))
        .with(libp2p::multiaddr::Protocol::QuicV1);
    let dial = client
        .dial(
            to,
            DialOpts {
                role: Endpoint::Dialer,
                port_use: PortUse::New,
            },
        )
        .expect("dial");
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(DEADLINE, async {
        tokio::select! {
            r = sink.recv(&mut buf) => r.expect("recv"),
            r = dial => panic!("the dial to a silent socket ended: {:?}", r.err()),
        }
    })
    .await
    .expect("the client's Initial");
    buf.truncate(n);
    buf
}

/// A stalled QUIC handshake from `ip`: a real client's Initial sent from
/// a socket of its own, which never reads the member's answer. The
/// socket is kept open for the member's answers to arrive.
async fn stall_quic(initial: &[u8], ip: Ipv4Addr, to: SocketAddr) -> tokio::net::UdpSocket {
    let s = tokio::net::UdpSocket::bind(SocketAddr::new(ip.into(), 0))
        .await
        .expect("bind");
    s.send_to(initial, to).await.expect("send");
    s
}

/// QUIC handshakes give way oldest first (no socket of their own to
/// watch). A stalled one here lives `libp2p::quic::Config`'s handshake
/// timeout (5 s) at the member: the flood is sent at once and the counts
/// asserted are the least it makes.
#[tokio::test]
async fn a_flood_of_stalled_quic_handshakes_sheds_its_own_and_an_honest_peer_completes() {
    let Flooded {
        m,
        member,
        driver,
        addr,
        to,
    } = flooded(true).await;

    let mut client = libp2p::quic::tokio::Transport::new(libp2p::quic::Config::new(
        &Keypair::generate_ed25519(),
    ));
    let mut initials = Vec::new();
    for _ in 0..4 {
        initials.push(client_initial(&mut client).await);
    }
    // One host floods twice its share, each handshake from its own port.
    let mut flood = Vec::new();
    for initial in &initials {
        flood.push(stall_quic(initial, A, to).await);
    }
    until("the flood sheds its own", &m, |m| {
        refused(m, SOURCE_FULL) >= 1
    })
    .await;

    // An honest peer behind the flood's address still completes.
    honest(A, addr, member, true).await;
    until("the honest handshake counted", &m, |m| {
        refused(m, HONEST_DONE) == 1
    })
    .await;
    assert_eq!(refused(&m, "pending_full"), 0);
    drop(flood);
    driver.abort();
}
