//! A member's streams carry their first bytes before the other side has
//! answered the protocol negotiation (see `swarm_config`).
//!
//! The other side here is TCP, noise and yamux with no swarm on top: it
//! reads its inbound streams raw and never answers multistream-select. A
//! member waiting for the confirmation (plain `V1`) would never hand the
//! stream out, and its bytes would never arrive.

use std::time::Duration;

use futures::{AsyncReadExt as _, AsyncWriteExt as _, StreamExt as _};
use libp2p::core::muxing::StreamMuxerExt as _;
use libp2p::core::transport::{ListenerId, TransportEvent};
use libp2p::core::upgrade::Version;
use libp2p::core::{Multiaddr, Transport};
use libp2p::identity::Keypair;
use libp2p::{StreamProtocol, noise, ping, yamux};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use super::muxer::STREAM_CREDIT_BYTES;
use super::{WindowLimits, build_swarm};

const PROTOCOL: StreamProtocol = StreamProtocol::new("/agentmesh/test-optimistic/1");
const REQUEST: &[u8] = b"the request, sent with the stream";
const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_members_stream_carries_its_request_before_any_answer() {
    // The silent listener: accepts one connection and forwards every
    // inbound stream's bytes as they come.
    let key = Keypair::generate_ed25519();
    let listener_peer = key.public().to_peer_id();
    let mut transport = libp2p::tcp::tokio::Transport::new(libp2p::tcp::Config::default())
        .upgrade(Version::V1)
        .authenticate(noise::Config::new(&key).expect("noise"))
        .multiplex(yamux::Config::default())
        .boxed();
    transport
        .listen_on(
            ListenerId::next(),
            "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
        )
        .expect("listen");
    let addr: Multiaddr = loop {
        match transport.select_next_some().await {
            TransportEvent::NewAddress { listen_addr, .. } => break listen_addr,
            other => tracing::debug!(?other, "listener event"),
        }
    };
    let (bytes_tx, mut bytes_rx) = mpsc::channel::<Vec<u8>>(64);
    let listener = tokio::spawn(async move {
        let upgrade = loop {
            if let TransportEvent::Incoming { upgrade, .. } = transport.select_next_some().await {
                break upgrade;
            }
        };
        let (_peer, mut muxer) = upgrade.await.expect("upgrade");
        // Polling for inbound streams drives the connection; each stream
        // is read by a task of its own and never written to.
        while let Ok(mut s) = futures::future::poll_fn(|cx| muxer.poll_inbound_unpin(cx)).await {
            let tx = bytes_tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || tx.send(buf[..n].to_vec()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });

    let member = Keypair::generate_ed25519();
    let mut swarm = build_swarm(
        &member,
        super::Dialing::default(),
        Duration::from_secs(10),
        Duration::from_secs(60),
        ping::Config::new(),
        agentmesh_streams::Config::default(),
        agentmesh_streams::PendingOpenLimits::default(),
        WindowLimits {
            max_streams: 16,
            connection_window_bytes: 16 * STREAM_CREDIT_BYTES,
        },
        Counter::default(),
    )
    .await
    .expect("swarm");
    let mut control = swarm.behaviour().stream.new_control();
    swarm
        .dial(addr.with(libp2p::multiaddr::Protocol::P2p(listener_peer)))
        .expect("dial");
    let driver = tokio::spawn(async move {
        loop {
            let _ = swarm.select_next_some().await;
        }
    });

    let writer = tokio::spawn(async move {
        let mut s = control
            .open_stream(listener_peer, PROTOCOL)
            .await
            .expect("the stream is handed out without a confirmation");
        s.write_all(REQUEST).await.expect("write");
        s.flush().await.expect("flush");
        s // kept open: the listener must not see an end instead
    });

    // Every stream's bytes together (ping's too): the protocol's name and
    // the request must both arrive, though nothing was ever answered.
    let mut seen = Vec::new();
    let found = tokio::time::timeout(DEADLINE, async {
        while let Some(b) = bytes_rx.recv().await {
            seen.extend_from_slice(&b);
            if find(&seen, PROTOCOL.as_ref().as_bytes()).is_some() && find(&seen, REQUEST).is_some()
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        found,
        Ok(true),
        "the request did not arrive unanswered; bytes seen: {:?}",
        String::from_utf8_lossy(&seen)
    );
    let name_at = find(&seen, PROTOCOL.as_ref().as_bytes()).expect("name");
    let request_at = find(&seen, REQUEST).expect("request");
    assert!(name_at < request_at, "the name goes first");
    writer.abort();
    driver.abort();
    listener.abort();
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
