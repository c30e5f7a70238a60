//! The attack on a member's listening port, TCP and QUIC: a stranger (any
//! libp2p peer with a key of its own, holding no relayed connection to the
//! member) dials it, completes the handshake (noise, or QUIC's TLS), and is
//! closed at once and counted in
//! `agentmesh_node_inbound_refused_total{reason="no_relayed_connection"}`.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;
use libp2p::core::muxing::{StreamMuxerBox, StreamMuxerExt as _};
use libp2p::core::transport::{DialOpts, PortUse};
use libp2p::core::upgrade::Version;
use libp2p::core::{Endpoint, Transport};
use libp2p::identity::Keypair;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, Swarm, noise, ping, yamux};
use prometheus_client::metrics::counter::Counter;

use super::{Behaviour, Dialing, WindowLimits, build_swarm, reuse};
use crate::metrics::{DirectMetrics, ReasonLabel};

pub(super) const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_stranger_dialing_the_listening_port_is_closed_and_counted() {
    stranger_dials_the_listening_port(false).await;
}

#[tokio::test]
async fn a_stranger_dialing_the_listening_quic_socket_is_closed_and_counted() {
    stranger_dials_the_listening_port(true).await;
}

/// A stranger's libp2p transport: TCP + noise + yamux, or QUIC.
pub(super) fn stranger_transport(
    key: &Keypair,
    quic: bool,
) -> libp2p::core::transport::Boxed<(libp2p::PeerId, StreamMuxerBox)> {
    if quic {
        return libp2p::quic::tokio::Transport::new(libp2p::quic::Config::new(key))
            .map(|(p, c), _| (p, StreamMuxerBox::new(c)))
            .boxed();
    }
    libp2p::tcp::tokio::Transport::new(libp2p::tcp::Config::default())
        .upgrade(Version::V1)
        .authenticate(noise::Config::new(key).expect("noise"))
        .multiplex(yamux::Config::default())
        .map(|(p, m), _| (p, StreamMuxerBox::new(m)))
        .boxed()
}

/// A member listening on 127.0.0.1 (TCP, or QUIC with `quic`) with
/// `max_pending_inbound` handshakes (in all, from one source) and
/// `connect_timeout` (every handshake's deadline), counting in `metrics`;
/// and the address it listens on.
pub(super) async fn listening_member(
    member: &Keypair,
    quic: bool,
    metrics: DirectMetrics,
    max_pending_inbound: (usize, usize),
    connect_timeout: Duration,
) -> (Swarm<Behaviour>, Multiaddr) {
    let at: SocketAddr = "127.0.0.1:0".parse().expect("sa");
    let dialing = Dialing {
        source_ip: None,
        listen: Some((at, reuse::ReuseLog::default())),
        metrics,
        punch_backoff: Default::default(),
        max_pending_inbound,
        tcp_user_timeout: None,
        quic_idle_timeout: Duration::ZERO,
        auth_timeout: Duration::from_secs(5),
        loopback_targets: false,
        quic,
        max_connections: 1024,
    };
    let mut swarm = build_swarm(
        member,
        dialing,
        connect_timeout,
        Duration::from_secs(60),
        ping::Config::new(),
        agentmesh_streams::Config::default(),
        agentmesh_streams::PendingOpenLimits::default(),
        WindowLimits {
            max_streams: 16,
            connection_window_bytes: 16 * super::muxer::STREAM_CREDIT_BYTES,
        },
        Counter::default(),
    )
    .await
    .expect("swarm");
    let addr = tokio::time::timeout(DEADLINE, async {
        loop {
            if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                break address;
            }
        }
    })
    .await
    .expect("the member listens");
    (swarm, addr)
}

async fn stranger_dials_the_listening_port(quic: bool) {
    let metrics = DirectMetrics::default();
    let member = Keypair::generate_ed25519();
    let (mut swarm, addr) = listening_member(
        &member,
        quic,
        metrics.clone(),
        (64, 8),
        Duration::from_secs(10),
    )
    .await;
    let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
    let driver = tokio::spawn(async move {
        loop {
            let e = swarm.select_next_some().await;
            let closed = matches!(e, SwarmEvent::ConnectionClosed { .. });
            let established = matches!(e, SwarmEvent::ConnectionEstablished { .. });
            if (closed || established) && events_tx.send(established).await.is_err() {
                return;
            }
        }
    });

    let stranger = Keypair::generate_ed25519();
    let mut t = stranger_transport(&stranger, quic);
    let dial = t
        .dial(
            addr,
            DialOpts {
                role: Endpoint::Dialer,
                port_use: PortUse::New,
            },
        )
        .expect("dial");
    let (peer, mut muxer) = tokio::time::timeout(DEADLINE, dial)
        .await
        .expect("handshake in time")
        .expect("the handshake itself completes");
    assert_eq!(peer, member.public().to_peer_id());
    // The member closes the connection: the stranger's muxer ends.
    let ended = tokio::time::timeout(DEADLINE, async {
        loop {
            if futures::future::poll_fn(|cx| muxer.poll_inbound_unpin(cx))
                .await
                .is_err()
            {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the member kept the stranger's connection");
    let refused = metrics
        .inbound_refused
        .get_or_create(&ReasonLabel {
            reason: "no_relayed_connection",
        })
        .get();
    assert_eq!(refused, 1);
    // Denied before it was established: no behaviour ever saw it.
    assert!(events.try_recv().is_err(), "the connection was established");
    driver.abort();
}
