//! QUIC's idle timeout (`--direct-quic-idle-timeout-secs`) on a real path:
//! two libp2p QUIC endpoints with the member's config, joined through a
//! UDP forwarder that can stop carrying datagrams. A path that stops is
//! closed within the timeout and its close reads `timed_out`
//! (`direct::close_reason`, which reads libp2p-quic's words for it); a
//! close by the peer does not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use libp2p::core::Endpoint;
use libp2p::core::muxing::{StreamMuxerBox, StreamMuxerExt as _};
use libp2p::core::transport::{DialOpts, ListenerId, PortUse, Transport, TransportEvent};
use libp2p::identity::Keypair;
use libp2p::swarm::ConnectionError;

use super::quic_config;
use super::tests_direct::DEADLINE;
use crate::direct::close_reason;

const IDLE: Duration = Duration::from_secs(1);

/// Forwards datagrams between the first client that sends and `to`, until
/// `cut` is set: from then on it drops everything (a path that stopped
/// carrying bytes, as a NAT rebinding or a dead link makes one).
async fn forwarder(to: SocketAddr, cut: Arc<AtomicBool>) -> SocketAddr {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = s.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut client = None;
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            if cut.load(Ordering::Relaxed) {
                continue;
            }
            let dest = if from == to {
                match client {
                    Some(c) => c,
                    None => continue,
                }
            } else {
                client = Some(from);
                to
            };
            let _ = s.send_to(&buf[..n], dest).await;
        }
    });
    at
}

/// A QUIC connection from a dialer to a listener through a forwarder,
/// both with the member's config: (dialer's muxer, listener's muxer, cut).
async fn connected() -> (StreamMuxerBox, StreamMuxerBox, Arc<AtomicBool>) {
    let mut listener =
        libp2p::quic::tokio::Transport::new(quic_config(&Keypair::generate_ed25519(), IDLE));
    listener
        .listen_on(
            ListenerId::next(),
            "/ip4/127.0.0.1/udp/0/quic-v1".parse().expect("addr"),
        )
        .expect("listen");
    let to = match next_event(&mut listener).await {
        TransportEvent::NewAddress { listen_addr, .. } => udp_port(&listen_addr),
        e => panic!("unexpected {e:?}"),
    };
    let cut = Arc::new(AtomicBool::new(false));
    let via = forwarder(SocketAddr::from(([127, 0, 0, 1], to)), cut.clone()).await;
    let mut dialer =
        libp2p::quic::tokio::Transport::new(quic_config(&Keypair::generate_ed25519(), IDLE));
    let dial = dialer
        .dial(
            format!("/ip4/127.0.0.1/udp/{}/quic-v1", via.port())
                .parse()
                .expect("addr"),
            DialOpts {
                role: Endpoint::Dialer,
                port_use: PortUse::New,
            },
        )
        .expect("dial");
    let accept = async {
        loop {
            if let TransportEvent::Incoming { upgrade, .. } = next_event(&mut listener).await {
                return upgrade.await.expect("inbound handshake");
            }
        }
    };
    let (dialed, accepted) = tokio::time::timeout(DEADLINE, async {
        futures::future::join(dial, accept).await
    })
    .await
    .expect("handshakes within the deadline");
    let (_, dialed) = dialed.expect("outbound handshake");
    // The listener's transport is not needed past the handshake: quinn's
    // endpoint runs on its own task.
    tokio::spawn(async move {
        loop {
            next_event(&mut listener).await;
        }
    });
    (
        StreamMuxerBox::new(dialed),
        StreamMuxerBox::new(accepted.1),
        cut,
    )
}

type Quic = libp2p::quic::tokio::Transport;

/// The next event of a QUIC transport.
async fn next_event(
    t: &mut Quic,
) -> TransportEvent<<Quic as Transport>::ListenerUpgrade, <Quic as Transport>::Error> {
    futures::future::poll_fn(|cx| std::pin::Pin::new(&mut *t).poll(cx)).await
}

/// The UDP port of `/ip4/…/udp/PORT/quic-v1`.
fn udp_port(a: &libp2p::Multiaddr) -> u16 {
    a.iter()
        .find_map(|p| match p {
            libp2p::multiaddr::Protocol::Udp(port) => Some(port),
            _ => None,
        })
        .expect("a UDP port")
}

/// Accepts `m`'s inbound streams until the connection fails, as the
/// swarm's connection task does (libp2p-quic reports a closed connection
/// there); the error as the swarm reports it.
async fn until_closed(m: &mut StreamMuxerBox) -> ConnectionError {
    let closed = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Err(e) = futures::future::poll_fn(|cx| m.poll_inbound_unpin(cx)).await {
                return e;
            }
        }
    })
    .await
    .expect("the connection closes within the deadline");
    ConnectionError::IO(closed)
}

#[tokio::test]
async fn a_quic_path_that_stops_carrying_datagrams_closes_as_timed_out() {
    let (mut dialer, _listener, cut) = connected().await;
    cut.store(true, Ordering::Relaxed);
    let e = until_closed(&mut dialer).await;
    assert_eq!(close_reason(Some(&e)), "timed_out", "{e:?}");
}

#[tokio::test]
async fn a_quic_connection_the_peer_closes_is_not_timed_out() {
    let (mut dialer, mut listener, _cut) = connected().await;
    futures::future::poll_fn(|cx| listener.poll_close_unpin(cx))
        .await
        .expect("close");
    let e = until_closed(&mut dialer).await;
    assert_eq!(close_reason(Some(&e)), "error", "{e:?}");
}

#[test]
fn the_flag_sets_the_idle_timeout_and_keep_alives_at_half_of_it() {
    let key = Keypair::generate_ed25519();
    let c = quic_config(&key, Duration::from_secs(3));
    assert_eq!(
        (c.max_idle_timeout, c.keep_alive_interval),
        (3000, Duration::from_millis(1500))
    );
    // Under a second acts as one.
    assert_eq!(
        quic_config(&key, Duration::from_millis(10)).max_idle_timeout,
        1000
    );
    // Zero: libp2p's own.
    let libp2p = libp2p::quic::Config::new(&key);
    let zero = quic_config(&key, Duration::ZERO);
    assert_eq!(
        (zero.max_idle_timeout, zero.keep_alive_interval),
        (libp2p.max_idle_timeout, libp2p.keep_alive_interval)
    );
}
