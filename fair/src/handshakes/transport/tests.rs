//! The wrappers on real sockets: a listener guarded with a room of 4 per
//! source, silent connections from its own address, and a real noise +
//! yamux dial from the same address.

use super::*;
use crate::handshakes::{Events, Gate, Limits, RefuseReason, Shed, ShedReason};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use libp2p::core::Endpoint;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::{Boxed, PortUse};
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::{PeerId, noise, tcp, yamux};
use tokio::io::AsyncReadExt as _;

const ROOM: usize = 4;
const DEADLINE: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Counts {
    shed_silent: AtomicUsize,
    shed_partial: AtomicUsize,
    refused: AtomicUsize,
}

#[derive(Clone, Default)]
struct Counted(Arc<Counts>);

impl Events for Counted {
    fn shed(&self, s: Shed) {
        assert_eq!(s.reason, ShedReason::SourceFull);
        let c = match s.progressed {
            crate::handshakes::Progressed::None => &self.0.shed_silent,
            crate::handshakes::Progressed::Partial => &self.0.shed_partial,
        };
        c.fetch_add(1, Ordering::SeqCst);
    }
    fn refused(&self, _: RefuseReason) {
        self.0.refused.fetch_add(1, Ordering::SeqCst);
    }
    fn in_progress(&self, _: usize) {}
}

/// Refuses 127.0.0.66 outright.
struct Gated;

impl Gate for Gated {
    fn room(&self, ip: IpAddr) -> Option<usize> {
        (ip != IpAddr::from([127, 0, 0, 66])).then_some(ROOM)
    }
}

/// `t` with noise and yamux; `version` of multistream-select (a test's
/// dialer uses `V1`: a lazy dialer's muxer proposal waits for its first
/// frame, and these dialers send none).
fn upgraded<T>(t: T, key: &Keypair, version: Version) -> Boxed<(PeerId, StreamMuxerBox)>
where
    T: Transport + Unpin + Send + 'static,
    T::Output: futures::AsyncRead + futures::AsyncWrite + Unpin + Send + 'static,
    T::Error: Send + Sync + 'static,
    T::Dial: Send + 'static,
    T::ListenerUpgrade: Send + 'static,
{
    t.upgrade(version)
        .authenticate(noise::Config::new(key).expect("noise"))
        .multiplex(yamux::Config::default())
        .timeout(DEADLINE)
        .map(|(peer, m), _| (peer, StreamMuxerBox::new(m)))
        .boxed()
}

/// Waits (with the deadline) until `cond` holds.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {DEADLINE:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A connection from `from` to `to` that sends multistream-select's header
/// (a handshake's first bytes) and stalls.
async fn raw_from(to: std::net::SocketAddr, from: IpAddr) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind(std::net::SocketAddr::new(from, 0)).expect("bind");
    let mut c = s.connect(to).await.expect("connect");
    c.write_all(b"\x13/multistream/1.0.0\n")
        .await
        .expect("write");
    c
}

/// A silent TCP connection from `from` to `to`: sends nothing, returns
/// once the listener closes it.
async fn silent(to: std::net::SocketAddr, from: IpAddr) -> bool {
    let s = tokio::net::TcpSocket::new_v4().expect("socket");
    s.bind(std::net::SocketAddr::new(from, 0)).expect("bind");
    let Ok(mut c) = s.connect(to).await else {
        return true;
    };
    let mut b = [0u8; 16];
    matches!(
        tokio::time::timeout(DEADLINE, c.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_dialing_through_a_flood_from_its_own_address_completes() {
    let counts = Counted::default();
    let limits = Limits {
        max_pending: 64,
        ipv6_prefix_len: 64,
    };
    let handshakes = Handshakes::new(limits, Gated, counts.clone());
    let key = Keypair::generate_ed25519();
    let raw = tcp::tokio::Transport::new(tcp::Config::default());
    let mut listener = handshakes.tcp(raw, |w| upgraded(w, &key, Version::V1Lazy));
    listener
        .listen_on(
            ListenerId::next(),
            "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
        )
        .expect("listen");
    // Drive the listener: every admitted upgrade runs on its own task.
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel(1024);
    let driver = tokio::spawn(async move {
        let mut addr_tx = Some(addr_tx);
        let mut listener = listener;
        loop {
            let ev = futures::future::poll_fn(|cx| Pin::new(&mut listener).poll(cx)).await;
            match ev {
                TransportEvent::NewAddress { listen_addr, .. } => {
                    if let Some(tx) = addr_tx.take() {
                        let _ = tx.send(listen_addr);
                    }
                }
                TransportEvent::Incoming { upgrade, .. } => {
                    let done = done_tx.clone();
                    tokio::spawn(async move {
                        let r = upgrade.await.map(|(peer, _)| peer);
                        let _ = done
                            .send(r.map_err(|e| matches!(e, HandshakeError::Shed)))
                            .await;
                    });
                }
                _ => {}
            }
        }
    });
    let addr = addr_rx.await.expect("listening");
    let to = match (addr.iter().next(), addr.iter().nth(1)) {
        (Some(Protocol::Ip4(ip)), Some(Protocol::Tcp(port))) => {
            std::net::SocketAddr::new(ip.into(), port)
        }
        _ => panic!("{addr}"),
    };
    let here = IpAddr::from([127, 0, 0, 1]);

    // The flood fills the source's room with silent connections.
    let flood: Vec<_> = (0..ROOM).map(|_| tokio::spawn(silent(to, here))).collect();
    wait_until("the room full", || handshakes.held_by(here) == ROOM).await;
    // A member dials from the same address: it takes the oldest silent
    // one's place and its handshake completes.
    let member_key = Keypair::generate_ed25519();
    let mut member = upgraded(
        tcp::tokio::Transport::new(tcp::Config::default()),
        &member_key,
        Version::V1,
    );
    let opts = DialOpts {
        role: Endpoint::Dialer,
        port_use: PortUse::New,
    };
    let dial = member.dial(addr.clone(), opts).expect("dial");
    let (peer, _muxer) = tokio::time::timeout(DEADLINE, dial)
        .await
        .expect("the member's handshake within the deadline")
        .expect("the member's handshake");
    assert_eq!(peer, PeerId::from(key.public()));
    loop {
        match tokio::time::timeout(DEADLINE, done_rx.recv()).await {
            Ok(Some(Ok(p))) => break assert_eq!(p, member_key.public().to_peer_id()),
            Ok(Some(Err(_))) => {}
            _ => panic!("no end of the member's handshake"),
        }
    }
    let mut flood = flood.into_iter();
    let oldest = flood.next().expect("one");
    assert!(
        oldest.await.expect("join"),
        "the oldest silent one was closed"
    );
    assert_eq!(counts.0.shed_silent.load(Ordering::SeqCst), 1);

    // A member whose handshake has started but is not done (its first
    // bytes sent) keeps its place while the flood renews: 3 * ROOM more
    // silent ones each take an older silent one's place, never its own.
    let started = raw_from(to, here).await;
    wait_until("the started one in", || handshakes.started_by(here) == 1).await;
    let renewals: Vec<_> = (0..3 * ROOM)
        .map(|_| tokio::spawn(silent(to, here)))
        .collect();
    // It found a place free (the member's); each renewal then took a
    // silent one's: the ROOM - 1 older ones first, then each other's.
    let sheds = 1 + 3 * ROOM;
    wait_until("the renewals shed", || {
        counts.0.shed_silent.load(Ordering::SeqCst) == sheds
    })
    .await;
    assert_eq!(
        counts.0.shed_partial.load(Ordering::SeqCst),
        0,
        "never the started one"
    );
    assert_eq!(handshakes.started_by(here), 1);
    assert_eq!(handshakes.held_by(here), ROOM);
    for t in flood {
        assert!(t.await.expect("join"), "the older silent ones were closed");
    }
    drop((started, renewals));

    // A refused source's connection is closed at once and never reported.
    assert!(silent(to, IpAddr::from([127, 0, 0, 66])).await);
    assert_eq!(
        counts.0.refused.load(Ordering::SeqCst),
        0,
        "the gate counts its own"
    );
    driver.abort();
}
