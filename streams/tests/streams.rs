//! Real swarms (TCP on 127.0.0.1, noise, yamux) exercising the behaviour.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentmesh_streams::{Behaviour, Config, Control, DebugSizes, DropReason, OpenStreamError};
use futures::{AsyncReadExt, AsyncWriteExt, FutureExt, StreamExt};
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::swarm::{Swarm, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, SwarmBuilder, noise, tcp, yamux};
use tokio::sync::{mpsc, oneshot};

/// Generous bound of every wait in these tests (never an assertion on time).
const DEADLINE: Duration = Duration::from_secs(30);

type Cmd = Box<dyn FnOnce(&mut Swarm<Behaviour>) + Send>;

/// A swarm driven by its own task, poked with closures.
struct Peer {
    id: PeerId,
    addr: Multiaddr,
    control: Control,
    cmd: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
    /// Outgoing connections that failed (the swarm's own count of them).
    dial_failures: Arc<AtomicUsize>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Peer {
    async fn new(config: Config) -> Self {
        let mut swarm = SwarmBuilder::with_new_identity()
            .with_tokio()
            .with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                yamux::Config::default,
            )
            .expect("tcp")
            .with_behaviour(|_| Behaviour::with_config(config))
            .expect("behaviour")
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        swarm
            .listen_on("/ip4/127.0.0.1/tcp/0".parse().expect("addr"))
            .expect("listen");
        let addr = loop {
            if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                break address;
            }
        };
        let id = *swarm.local_peer_id();
        let control = swarm.behaviour().new_control();
        let (cmd, mut rx) = mpsc::channel::<Cmd>(64);
        let dial_failures = Arc::new(AtomicUsize::new(0));
        let failures = dial_failures.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = swarm.select_next_some() => match ev {
                        SwarmEvent::OutgoingConnectionError { error, .. } => {
                            eprintln!("{id}: dial failed: {error}");
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                        SwarmEvent::IncomingConnectionError { error, .. } => {
                            eprintln!("{id}: incoming connection failed: {error}");
                        }
                        _ => {}
                    },
                    c = rx.recv() => match c {
                        Some(c) => c(&mut swarm),
                        None => break,
                    },
                }
            }
        });
        Self {
            id,
            addr,
            control,
            cmd,
            task,
            dial_failures,
        }
    }

    async fn with_swarm<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Swarm<Behaviour>) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Box::new(move |s| {
                let _ = tx.send(f(s));
            }))
            .await
            .expect("peer task alive");
        rx.await.expect("peer task answered")
    }

    async fn connections(&self) -> usize {
        self.with_swarm(|s| s.network_info().connection_counters().num_established() as usize)
            .await
    }

    /// Waits (bounded) until `cond` holds for this peer's connection count.
    async fn wait_connections(&self, what: &str, cond: impl Fn(usize) -> bool) {
        let until = tokio::time::Instant::now() + DEADLINE;
        loop {
            let n = self.connections().await;
            if cond(n) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "{what}: still {n} connections"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn wait_sizes(control: &Control, want: DebugSizes) {
    let until = tokio::time::Instant::now() + DEADLINE;
    loop {
        let got = control.debug_sizes();
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "sizes {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Dial options for `addr` from a fresh local port: both peers listen on
/// 127.0.0.1, and reusing the listening port as the source fails now and
/// then with "address already in use".
fn new_port(addr: Multiaddr) -> DialOpts {
    DialOpts::unknown_peer_id()
        .address(addr)
        .allocate_new_port()
        .build()
}

fn proto(s: &'static str) -> StreamProtocol {
    StreamProtocol::new(s)
}

/// Echoes every stream of `protocol` accepted on `peer`.
fn serve_echo(peer: &Peer, protocol: &'static str) -> tokio::task::JoinHandle<()> {
    let mut incoming = peer
        .control
        .clone()
        .accept(proto(protocol))
        .expect("accept");
    tokio::spawn(async move {
        while let Some((_, mut s)) = incoming.next().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf).await;
                let _ = s.write_all(&buf).await;
                let _ = s.close().await;
            });
        }
    })
}

async fn echo(control: &mut Control, peer: PeerId, protocol: &'static str, msg: &[u8]) -> Vec<u8> {
    let mut s = tokio::time::timeout(DEADLINE, control.open_stream(peer, proto(protocol)))
        .await
        .expect("open within deadline")
        .expect("open");
    s.write_all(msg).await.expect("write");
    s.close().await.expect("half-close");
    let mut back = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut back))
        .await
        .expect("read within deadline")
        .expect("read");
    back
}

#[tokio::test]
async fn open_accept_round_trip_over_an_existing_connection_and_by_dialing() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let server = serve_echo(&a, "/test/echo/1");
    let mut control = b.control.clone();

    // Not connected and no address known: the dial fails, the error says so,
    // and nothing waits behind.
    let err = control
        .open_stream(a.id, proto("/test/echo/1"))
        .await
        .expect_err("no address to dial");
    assert!(
        matches!(&err, OpenStreamError::Io(e) if e.kind() == std::io::ErrorKind::NotConnected),
        "{err}"
    );
    assert_eq!(control.debug_sizes().pending_dials, 0);

    // A request made while the swarm is dialing the peer waits for that
    // connection (its own dial is refused as "already dialing") and is
    // served on it.
    let (id, addr) = (a.id, a.addr.clone());
    b.with_swarm(move |s| {
        s.dial(
            DialOpts::peer_id(id)
                .addresses(vec![addr])
                .allocate_new_port()
                .build(),
        )
    })
    .await
    .expect("dial");
    assert_eq!(
        echo(&mut control, a.id, "/test/echo/1", b"hello").await,
        b"hello"
    );
    assert_eq!(b.connections().await, 1);
    // Over the existing connection.
    assert_eq!(
        echo(&mut control, a.id, "/test/echo/1", b"again").await,
        b"again"
    );
    assert_eq!(b.connections().await, 1);
    let sizes = control.debug_sizes();
    assert_eq!(
        (sizes.connections, sizes.peers, sizes.pending_dials),
        (1, 1, 0)
    );
    server.abort();
}

#[tokio::test]
async fn unsupported_protocol_is_a_typed_error() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let _server = serve_echo(&a, "/test/echo/1");
    let (id, addr) = (a.id, a.addr.clone());
    b.with_swarm(move |s| s.dial(new_port(addr)).map(|_| id))
        .await
        .expect("dial");
    b.wait_connections("connect", |n| n == 1).await;
    let err = tokio::time::timeout(
        DEADLINE,
        b.control.clone().open_stream(a.id, proto("/test/nope/1")),
    )
    .await
    .expect("answer within deadline")
    .expect_err("a does not accept /test/nope/1");
    assert!(
        matches!(&err, OpenStreamError::UnsupportedProtocol(p) if p.as_ref() == "/test/nope/1"),
        "{err}"
    );
    // The connection still serves the supported protocol.
    let mut control = b.control.clone();
    assert_eq!(echo(&mut control, a.id, "/test/echo/1", b"ok").await, b"ok");
}

#[tokio::test]
async fn every_map_is_empty_after_200_connections_close() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let server = serve_echo(&a, "/test/echo/1");
    let mut control = b.control.clone();
    const ROUNDS: usize = 10;
    const PER_ROUND: usize = 20;
    for round in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            let addr = a.addr.clone();
            b.with_swarm(move |s| s.dial(new_port(addr)))
                .await
                .expect("dial");
        }
        b.wait_connections("connect", |n| n == PER_ROUND).await;
        a.wait_connections("accept", |n| n == PER_ROUND).await;
        // Both sides track every live connection (so the test can fail).
        assert_eq!(control.debug_sizes().connections, PER_ROUND);
        assert_eq!(a.control.debug_sizes().connections, PER_ROUND);
        let msg = format!("round {round}");
        assert_eq!(
            echo(&mut control, a.id, "/test/echo/1", msg.as_bytes()).await,
            msg.as_bytes()
        );
        let id = a.id;
        b.with_swarm(move |s| s.disconnect_peer_id(id))
            .await
            .expect("disconnect");
        b.wait_connections("close", |n| n == 0).await;
        a.wait_connections("close", |n| n == 0).await;
    }
    let empty = DebugSizes::default();
    wait_sizes(&control, empty).await;
    // `a` still accepts the echo protocol: that registration is all it holds.
    wait_sizes(
        &a.control,
        DebugSizes {
            protocols: 1,
            ..empty
        },
    )
    .await;
    server.abort();
    let _ = server.await;
    wait_sizes(&a.control, empty).await;
}

#[tokio::test]
async fn inbound_streams_beyond_the_queue_are_dropped_and_counted() {
    let a = Peer::new(Config {
        inbound_queue_per_protocol: 2,
    })
    .await;
    let b = Peer::new(Config::default()).await;
    let p = proto("/test/slow/1");
    let registry = a
        .with_swarm(|s| {
            let mut registry = prometheus_client::registry::Registry::default();
            s.behaviour().register_metrics(&mut registry);
            registry
        })
        .await;
    // Registered but not drained.
    let mut incoming = a.control.clone().accept(p.clone()).expect("accept");
    assert_eq!(a.control.dropped_inbound(&p, DropReason::QueueFull), 0);
    let addr = a.addr.clone();
    b.with_swarm(move |s| s.dial(new_port(addr)))
        .await
        .expect("dial");
    b.wait_connections("connect", |n| n == 1).await;
    let mut open = Vec::new();
    for _ in 0..5 {
        let mut s = tokio::time::timeout(DEADLINE, b.control.clone().open_stream(a.id, p.clone()))
            .await
            .expect("open within deadline")
            .expect("open");
        // Writing makes sure the listener side completes its negotiation.
        // (A stream the listener dropped is reset, so errors are expected.)
        let _ = s.write_all(b"x").await;
        let _ = s.flush().await;
        open.push(s);
    }
    let until = tokio::time::Instant::now() + DEADLINE;
    while a.control.dropped_inbound(&p, DropReason::QueueFull) < 3 {
        assert!(tokio::time::Instant::now() < until, "drops not counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.control.dropped_inbound(&p, DropReason::QueueFull), 3);
    // Exactly the bound waited for the accept loop.
    for _ in 0..2 {
        let (info, _) = incoming
            .next()
            .now_or_never()
            .flatten()
            .expect("queued stream");
        assert_eq!(info.peer, b.id);
    }
    assert!(
        incoming.next().now_or_never().is_none(),
        "nothing beyond the bound"
    );
    assert_eq!(a.control.dropped_inbound(&p, DropReason::NotAccepted), 0);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        "agentmesh_streams_inbound_dropped_total{protocol=\"/test/slow/1\",reason=\"queue_full\"} 3",
        "agentmesh_streams_inbound_dropped_total{protocol=\"/test/slow/1\",reason=\"not_accepted\"} 0",
        "agentmesh_streams_inbound_dropped_total{protocol=\"/test/slow/1\",reason=\"preempted\"} 0",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

/// Opens `n` streams of `p` from `from` to `to`, writing a byte on each so
/// the listener finishes negotiating it; keeps them open.
async fn open_many(from: &Peer, to: PeerId, p: &StreamProtocol, n: usize) -> Vec<libp2p::Stream> {
    let mut open = Vec::new();
    for _ in 0..n {
        let mut s = tokio::time::timeout(DEADLINE, from.control.clone().open_stream(to, p.clone()))
            .await
            .expect("open within deadline")
            .expect("open");
        // A stream the listener dropped is reset, so errors are expected.
        let _ = s.write_all(b"x").await;
        let _ = s.flush().await;
        open.push(s);
    }
    open
}

async fn wait_dropped(c: &Control, p: &StreamProtocol, reason: DropReason, n: u64) {
    let until = tokio::time::Instant::now() + DEADLINE;
    while c.dropped_inbound(p, reason) < n {
        assert!(
            tokio::time::Instant::now() < until,
            "{reason:?}: {} of {n}",
            c.dropped_inbound(p, reason)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The attack: one peer opens streams faster than the accept loop takes
/// them and keeps the protocol's queue full. Another peer's stream still
/// gets a place (the flooder's oldest is dropped as `preempted`), so the
/// accept loop sees it; before the fair share it was dropped as
/// `queue_full` and never seen.
#[tokio::test]
async fn a_peer_filling_the_queue_cannot_keep_another_peers_stream_out() {
    let a = Peer::new(Config {
        inbound_queue_per_protocol: 4,
    })
    .await;
    let (flooder, member) = (
        Peer::new(Config::default()).await,
        Peer::new(Config::default()).await,
    );
    let p = proto("/test/flooded/1");
    let mut incoming = a.control.clone().accept(p.clone()).expect("accept");
    for peer in [&flooder, &member] {
        let addr = a.addr.clone();
        peer.with_swarm(move |s| s.dial(new_port(addr)))
            .await
            .expect("dial");
        peer.wait_connections("connect", |n| n == 1).await;
    }
    // 12 streams into a queue of 4 nobody drains: 8 refused, the queue full
    // of the flooder's.
    let _flood = open_many(&flooder, a.id, &p, 12).await;
    wait_dropped(&a.control, &p, DropReason::QueueFull, 8).await;
    assert_eq!(a.control.dropped_inbound(&p, DropReason::Preempted), 0);
    // The member's one stream takes the flooder's oldest place.
    let _mine = open_many(&member, a.id, &p, 1).await;
    wait_dropped(&a.control, &p, DropReason::Preempted, 1).await;
    // More from the flooder (it holds 3, the member 1) cannot push the
    // member out: refused, not preempting.
    let _more = open_many(&flooder, a.id, &p, 3).await;
    wait_dropped(&a.control, &p, DropReason::QueueFull, 11).await;
    assert_eq!(a.control.dropped_inbound(&p, DropReason::Preempted), 1);
    let mut from = Vec::new();
    while let Some((info, _)) = incoming.next().now_or_never().flatten() {
        from.push(info.peer);
    }
    assert_eq!(from.len(), 4, "{from:?}");
    assert_eq!(
        from.iter().filter(|p| **p == member.id).count(),
        1,
        "{from:?}"
    );
    assert_eq!(
        from.iter().filter(|p| **p == flooder.id).count(),
        3,
        "{from:?}"
    );
}

#[tokio::test]
async fn dropping_incoming_streams_unregisters_the_protocol() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let p = proto("/test/gone/1");
    let mut ctl = a.control.clone();
    let first = ctl.accept(p.clone()).expect("accept");
    assert!(
        ctl.accept(p.clone()).is_err(),
        "second registration refused"
    );
    assert_eq!(a.control.debug_sizes().protocols, 1);
    drop(first);
    assert_eq!(a.control.debug_sizes().protocols, 0);

    let addr = a.addr.clone();
    b.with_swarm(move |s| s.dial(new_port(addr)))
        .await
        .expect("dial");
    b.wait_connections("connect", |n| n == 1).await;
    let err = tokio::time::timeout(DEADLINE, b.control.clone().open_stream(a.id, p.clone()))
        .await
        .expect("answer within deadline")
        .expect_err("no longer accepted");
    assert!(
        matches!(err, OpenStreamError::UnsupportedProtocol(_)),
        "{err}"
    );

    // Registering again works and serves.
    let _again = ctl.accept(p.clone()).expect("accept again");
    let s = tokio::time::timeout(DEADLINE, b.control.clone().open_stream(a.id, p))
        .await
        .expect("answer within deadline");
    assert!(s.is_ok(), "accepted again: {:?}", s.err());
}

#[tokio::test]
async fn every_stream_comes_with_its_connection() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let p = proto("/test/info/1");
    let mut incoming = a.control.clone().accept(p.clone()).expect("accept");
    let addr = a.addr.clone();
    b.with_swarm(move |s| s.dial(new_port(addr)))
        .await
        .expect("dial");
    b.wait_connections("connect", |n| n == 1).await;

    let mut opened = Vec::new();
    let mut accepted = Vec::new();
    for _ in 0..2 {
        let (info, mut s) = tokio::time::timeout(
            DEADLINE,
            b.control.clone().open_stream_with_info(a.id, p.clone()),
        )
        .await
        .expect("open within deadline")
        .expect("open");
        s.write_all(b"x").await.expect("write");
        s.flush().await.expect("flush");
        opened.push((info, s));
        let (info, s) = tokio::time::timeout(DEADLINE, incoming.next())
            .await
            .expect("accepted within deadline")
            .expect("stream");
        accepted.push((info, s));
    }
    for (info, _) in &opened {
        assert_eq!(info.peer, a.id);
        assert_eq!(
            info.remote_addr, a.addr,
            "the dialer sees the address it dialed"
        );
        assert!(!info.relayed);
    }
    for (info, _) in &accepted {
        assert_eq!(info.peer, b.id);
        assert!(!info.relayed);
        let text = info.remote_addr.to_string();
        assert!(
            text.starts_with("/ip4/127.0.0.1/tcp/") && text != a.addr.to_string(),
            "the listener sees where the dialer came from: {text}"
        );
    }
    assert_eq!(
        opened[0].0.connection, opened[1].0.connection,
        "both streams ride the one connection"
    );
    assert_eq!(accepted[0].0.connection, accepted[1].0.connection);
    assert_eq!(accepted[0].0.remote_addr, accepted[1].0.remote_addr);
}

#[tokio::test]
async fn a_connection_whose_refusals_are_counted_can_be_closed_from_a_control() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let p = proto("/test/refuse/1");
    let mut incoming = a.control.clone().accept(p.clone()).expect("accept");
    let addr = a.addr.clone();
    b.with_swarm(move |s| s.dial(new_port(addr)))
        .await
        .expect("dial");
    b.wait_connections("connect", |n| n == 1).await;
    let mut last = None;
    for want in 1..=3u32 {
        let (_, mut s) = tokio::time::timeout(
            DEADLINE,
            b.control.clone().open_stream_with_info(a.id, p.clone()),
        )
        .await
        .expect("open within deadline")
        .expect("open");
        s.write_all(b"x").await.expect("write");
        s.flush().await.expect("flush");
        let (info, refused) = tokio::time::timeout(DEADLINE, incoming.next())
            .await
            .expect("accepted within deadline")
            .expect("stream");
        drop(refused);
        assert_eq!(a.control.count_refused(&info), Some(want));
        last = Some(info);
    }
    let info = last.expect("a stream");
    assert!(
        a.control.close_connection(&info),
        "first ask queues a close"
    );
    assert!(!a.control.close_connection(&info), "queued once");
    a.wait_connections("closed by a", |n| n == 0).await;
    b.wait_connections("closed for b", |n| n == 0).await;
    assert_eq!(a.control.count_refused(&info), None, "gone with it");
    assert_eq!(a.control.debug_sizes().queued_closes, 0);
}

/// A TCP forwarder to `to` that accepts one connection and holds it until
/// `go` fires, then splices it through: a dial through it stays in flight
/// for exactly as long as the test wants.
async fn held_forwarder(to: Multiaddr, go: oneshot::Receiver<()>) -> Multiaddr {
    use libp2p::multiaddr::Protocol;
    let mut it = to.iter();
    let (Some(Protocol::Ip4(ip)), Some(Protocol::Tcp(port))) = (it.next(), it.next()) else {
        panic!("not a tcp address: {to}");
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind forwarder");
    let at = listener.local_addr().expect("forwarder address");
    tokio::spawn(async move {
        let (mut inbound, _) = listener.accept().await.expect("accept");
        let _ = go.await;
        let mut outbound = tokio::net::TcpStream::connect((ip, port))
            .await
            .expect("connect through");
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    });
    format!("/ip4/127.0.0.1/tcp/{}", at.port())
        .parse()
        .expect("addr")
}

#[tokio::test]
async fn a_failed_dial_beside_another_dial_to_the_peer_fails_no_waiting_open() {
    let a = Peer::new(Config::default()).await;
    let b = Peer::new(Config::default()).await;
    let _server = serve_echo(&a, "/test/echo/1");
    let (go, held) = oneshot::channel();
    let through = held_forwarder(a.addr.clone(), held).await;
    // A port nothing listens on: a dial there is refused at once.
    let refused_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let nowhere: Multiaddr = format!("/ip4/127.0.0.1/tcp/{refused_port}")
        .parse()
        .expect("addr");

    // The dial that will succeed, held at the forwarder.
    let id = a.id;
    b.with_swarm(move |s| {
        s.dial(
            DialOpts::peer_id(id)
                .addresses(vec![through])
                .allocate_new_port()
                .build(),
        )
    })
    .await
    .expect("dial through the forwarder");
    // An open waiting for that connection (its own dial: "already dialing").
    let mut control = b.control.clone();
    let open = tokio::spawn(async move { echo(&mut control, id, "/test/echo/1", b"kept").await });
    let until = tokio::time::Instant::now() + DEADLINE;
    while b.control.debug_sizes().pending_opens == 0 {
        assert!(tokio::time::Instant::now() < until, "the open never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A second dial to the same peer (as a hole punch would be) fails.
    b.with_swarm(move |s| {
        s.dial(
            DialOpts::peer_id(id)
                .addresses(vec![nowhere])
                .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
                .allocate_new_port()
                .build(),
        )
    })
    .await
    .expect("second dial started");
    while b.dial_failures.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "the second dial never failed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The open still waits (it was not failed with the other dial) ...
    assert_eq!(b.control.debug_sizes().pending_opens, 1);
    // ... and is served once the first dial's connection is up.
    go.send(()).expect("forwarder waiting");
    let back = tokio::time::timeout(DEADLINE, open)
        .await
        .expect("open served in time")
        .expect("open task");
    assert_eq!(back, b"kept");
}
