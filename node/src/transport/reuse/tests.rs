//! [`ReuseTcp`] on loopback: dials leave from the listening port, fall
//! back to a fresh one when the tuple is taken (counted and logged; a
//! punch's dial, in either role, fails instead), and the listener
//! accepts.

use std::net::SocketAddr;

use libp2p::core::Endpoint;
use libp2p::core::transport::{DialOpts, ListenerId, PortUse, Transport, TransportEvent};

use super::*;

fn opts(port_use: PortUse) -> DialOpts {
    DialOpts {
        role: Endpoint::Dialer,
        port_use,
    }
}

/// A transport listening on 127.0.0.1 (any port), with its port.
async fn listening() -> (ReuseTcp, ReuseLog, Counter, u16) {
    let (log, fallbacks) = (ReuseLog::default(), Counter::default());
    let mut t = ReuseTcp::new(None, log.clone(), fallbacks.clone());
    t.listen_on(
        ListenerId::next(),
        "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
    )
    .expect("listen");
    let port = (*t.bound.lock()).expect("bound").port();
    (t, log, fallbacks, port)
}

/// A plain TCP listener on 127.0.0.1 (any port), with its address.
async fn plain_listener() -> (tokio::net::TcpListener, SocketAddr) {
    let server = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let at = server.local_addr().expect("addr");
    (server, at)
}

async fn dial_from(
    t: &mut ReuseTcp,
    to: SocketAddr,
    port_use: PortUse,
) -> libp2p::tcp::tokio::TcpStream {
    t.dial(tcp_multiaddr(to), opts(port_use))
        .expect("ours")
        .await
        .expect("connected")
}

#[test]
fn a_reusing_dial_binds_the_listening_port_on_the_source_ip() {
    let to: SocketAddr = "10.0.0.9:4001".parse().expect("sa");
    let any: SocketAddr = "0.0.0.0:5555".parse().expect("sa");
    let lan: SocketAddr = "10.1.0.2:5555".parse().expect("sa");
    let src: IpAddr = "10.1.0.3".parse().expect("ip");
    assert_eq!(bind_for(&to, PortUse::Reuse, Some(any), None), Some(any));
    assert_eq!(bind_for(&to, PortUse::Reuse, Some(lan), None), Some(lan));
    assert_eq!(
        bind_for(&to, PortUse::Reuse, Some(any), Some(src)),
        Some(SocketAddr::new(src, 5555))
    );
    // No reuse asked, or no listener: the source IP, any port.
    assert_eq!(
        bind_for(&to, PortUse::New, Some(any), Some(src)),
        Some(SocketAddr::new(src, 0))
    );
    assert_eq!(bind_for(&to, PortUse::Reuse, None, None), None);
    // Another family's listener is no use.
    let v6: SocketAddr = "[::]:5555".parse().expect("sa");
    assert_eq!(bind_for(&to, PortUse::Reuse, Some(v6), None), None);
}

#[tokio::test]
async fn dials_leave_from_the_listening_port_unless_a_new_one_is_asked() {
    let (mut t, log, fallbacks, port) = listening().await;
    let (server, to) = plain_listener().await;
    let (_a, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    assert_eq!(accepted.expect("accept").1.port(), port);
    let (_b, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::New), server.accept());
    assert_ne!(accepted.expect("accept").1.port(), port);
    assert_eq!(fallbacks.get(), 0);
    assert!(!log.dialled_from_fresh_port(&to));
}

#[tokio::test]
async fn a_taken_tuple_falls_back_to_a_fresh_port_counted_and_noted() {
    let (mut t, log, fallbacks, port) = listening().await;
    let (server, to) = plain_listener().await;
    // The first connection holds (listening port → to) open: a second
    // dial of the same tuple fails as one in TIME_WAIT does.
    let (_held, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    assert_eq!(accepted.expect("accept").1.port(), port);
    let (_second, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    assert_ne!(accepted.expect("accept").1.port(), port, "a fresh port");
    assert_eq!(fallbacks.get(), 1);
    assert!(log.dialled_from_fresh_port(&to));
    // Another destination still leaves from the listening port, and a
    // reusing dial that succeeds clears the note.
    let (other, to2) = plain_listener().await;
    let (_c, accepted) = tokio::join!(dial_from(&mut t, to2, PortUse::Reuse), other.accept());
    assert_eq!(accepted.expect("accept").1.port(), port);
    assert!(!log.dialled_from_fresh_port(&to2));
    drop(_held);
}

#[tokio::test]
async fn a_punch_dial_in_the_listeners_role_never_falls_back_to_a_fresh_port() {
    let (mut t, log, fallbacks, _port) = listening().await;
    let (server, to) = plain_listener().await;
    let (_held, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    accepted.expect("accept");
    let listener_role = DialOpts {
        role: Endpoint::Listener,
        port_use: PortUse::Reuse,
    };
    fails_from_no_fresh_port(&mut t, to, &server, listener_role, &fallbacks).await;
    assert!(!log.dialled_from_fresh_port(&to));
}

/// Dials `to` with `opts` while `t`'s first connection to it holds the
/// tuple: the dial fails as taken, no fresh port is used, and nothing
/// else reaches `server`.
async fn fails_from_no_fresh_port(
    t: &mut ReuseTcp,
    to: SocketAddr,
    server: &tokio::net::TcpListener,
    opts: DialOpts,
    fallbacks: &Counter,
) {
    let e = t
        .dial(tcp_multiaddr(to), opts)
        .expect("ours")
        .await
        .expect_err("the tuple is taken and nothing was held from it");
    assert!(tuple_taken(&e), "{e}");
    assert_eq!(fallbacks.get(), 0, "no fresh port");
    let more = tokio::time::timeout(std::time::Duration::from_millis(300), server.accept()).await;
    assert!(more.is_err(), "a second connection arrived: {more:?}");
}

#[tokio::test]
async fn a_punch_dial_in_the_dialers_role_never_falls_back_to_a_fresh_port() {
    // The retry of a punch whose first attempt connected: from a fresh
    // port it would reach a peer that can be reached unsolicited as a
    // second direct connection.
    let (mut t, log, fallbacks, _port) = listening().await;
    let (server, to) = plain_listener().await;
    let (_held, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    accepted.expect("accept");
    log.mark_punch(to);
    fails_from_no_fresh_port(&mut t, to, &server, opts(PortUse::Reuse), &fallbacks).await;
    assert!(!log.take_punch(&to), "the dial took the mark");
    // The next, unmarked dial to it (a router's, say) falls back as before.
    let (_third, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    accepted.expect("accept");
    assert_eq!(fallbacks.get(), 1);
}

#[tokio::test]
async fn the_listener_reports_its_address_and_accepts() {
    let (mut t, _log, _fallbacks, port) = listening().await;
    let first = futures::future::poll_fn(|cx| Pin::new(&mut t).poll(cx)).await;
    match first {
        TransportEvent::NewAddress { listen_addr, .. } => {
            assert_eq!(
                listen_addr,
                tcp_multiaddr(SocketAddr::from(([127, 0, 0, 1], port)))
            );
        }
        _ => panic!("expected NewAddress first"),
    }
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let client = tokio::net::TcpStream::connect(to);
    let incoming = futures::future::poll_fn(|cx| Pin::new(&mut t).poll(cx));
    let (c, ev) = tokio::join!(client, incoming);
    let c = c.expect("connect");
    match ev {
        TransportEvent::Incoming { send_back_addr, .. } => {
            assert_eq!(send_back_addr, tcp_multiaddr(c.local_addr().expect("addr")));
        }
        _ => panic!("expected Incoming"),
    }
    // A second listener is refused: one port per member.
    let mut t2 = ReuseTcp::new(None, ReuseLog::default(), Counter::default());
    t2.listen_on(
        ListenerId::next(),
        "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
    )
    .expect("first");
    assert!(
        t2.listen_on(
            ListenerId::next(),
            "/ip4/127.0.0.1/tcp/0".parse().expect("addr")
        )
        .is_err()
    );
}

#[tokio::test]
async fn with_a_source_ip_dials_leave_from_it_on_the_listening_port() {
    // Listening on every address; dials bound to 127.0.0.2 on that port.
    let (log, fallbacks) = (ReuseLog::default(), Counter::default());
    let source: IpAddr = "127.0.0.2".parse().expect("ip");
    let mut t = ReuseTcp::new(Some(source), log, fallbacks.clone());
    t.listen_on(
        ListenerId::next(),
        "/ip4/0.0.0.0/tcp/0".parse().expect("addr"),
    )
    .expect("listen");
    let port = (*t.bound.lock()).expect("bound").port();
    let (server, to) = plain_listener().await;
    let (_s, accepted) = tokio::join!(dial_from(&mut t, to, PortUse::Reuse), server.accept());
    let from = accepted.expect("accept").1;
    assert_eq!(from, SocketAddr::new(source, port));
    assert_eq!(fallbacks.get(), 0);
}

#[tokio::test]
async fn every_socket_dialed_or_accepted_carries_the_user_timeout() {
    let bound = std::time::Duration::from_millis(2_500);
    let user_timeout = |s: &tokio::net::TcpStream| {
        socket2::SockRef::from(s)
            .tcp_user_timeout()
            .expect("read TCP_USER_TIMEOUT")
    };
    let (t, _log, _fallbacks, port) = listening().await;
    let mut t = t.with_user_timeout(Some(bound));
    // Dialed, from the listening port and from a fresh one.
    let (server, to) = plain_listener().await;
    for port_use in [PortUse::Reuse, PortUse::New] {
        let (dialed, accepted) = tokio::join!(dial_from(&mut t, to, port_use), server.accept());
        assert_eq!(user_timeout(&dialed.0), Some(bound), "{port_use:?}");
        // The other end is not ours: the kernel's default.
        assert_eq!(user_timeout(&accepted.expect("accept").0), None);
    }
    // Accepted on the listening port.
    let _ = futures::future::poll_fn(|cx| Pin::new(&mut t).poll(cx)).await;
    let client = tokio::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port)));
    let incoming = futures::future::poll_fn(|cx| Pin::new(&mut t).poll(cx));
    let (_c, ev) = tokio::join!(client, incoming);
    match ev {
        TransportEvent::Incoming { upgrade, .. } => {
            let accepted = upgrade.await.expect("accepted");
            assert_eq!(user_timeout(&accepted.0), Some(bound));
        }
        _ => panic!("expected Incoming"),
    }
    // Without a bound, the kernel's default.
    let (plain, _log, _fallbacks, _port) = listening().await;
    let mut plain = plain.with_user_timeout(None);
    let (dialed, _accepted) =
        tokio::join!(dial_from(&mut plain, to, PortUse::New), server.accept());
    assert_eq!(user_timeout(&dialed.0), None);
}

/// The listener's next `Incoming`: the held upgrade and its source.
async fn next_incoming(t: &mut ReuseTcp) -> (<ReuseTcp as Transport>::ListenerUpgrade, SocketAddr) {
    loop {
        match futures::future::poll_fn(|cx| Pin::new(&mut *t).poll(cx)).await {
            TransportEvent::NewAddress { .. } => continue,
            TransportEvent::Incoming {
                upgrade,
                send_back_addr,
                ..
            } => {
                let from = listen_target(&send_back_addr).expect("an IP and port");
                return (upgrade, from);
            }
            _ => panic!("expected Incoming"),
        }
    }
}

/// A punch in the listener's role: a socket on a port of its own connects
/// to the listening port and says nothing.
async fn silent_peer(port: u16) -> tokio::net::TcpStream {
    let s = reusable_socket(&SocketAddr::from(([127, 0, 0, 1], 0))).expect("socket");
    s.bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    s.connect(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("connect")
}

#[tokio::test]
async fn a_dial_whose_destination_connected_to_the_listening_port_first_takes_that_connection() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (log, fallbacks, adopted) = (ReuseLog::default(), Counter::default(), Counter::default());
    let mut t = ReuseTcp::new(None, log.clone(), fallbacks.clone()).with_adopted(adopted.clone());
    t.listen_on(
        ListenerId::next(),
        "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
    )
    .expect("listen");
    let port = (*t.bound.lock()).expect("bound").port();
    let mut peer = silent_peer(port).await;
    let peer_addr = peer.local_addr().expect("addr");
    let (upgrade, from) = next_incoming(&mut t).await;
    assert_eq!(from, peer_addr);
    // Our dial to the peer's port from the listening port: the tuple is
    // the accepted connection's, and the dial takes it over. The swarm
    // polls the inbound upgrade meanwhile; it fails.
    let dial = t
        .dial(tcp_multiaddr(peer_addr), opts(PortUse::Reuse))
        .expect("ours");
    let (dialed, inbound) = tokio::join!(dial, upgrade);
    let mut dialed = dialed.expect("the dial has a connection").0;
    let inbound = inbound.expect_err("the inbound upgrade fails");
    assert!(inbound.to_string().contains("taken over"), "{inbound}");
    assert_eq!(
        dialed.local_addr().expect("addr"),
        SocketAddr::from(([127, 0, 0, 1], port))
    );
    dialed.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    peer.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"ping");
    assert_eq!((adopted.get(), fallbacks.get()), (1, 0));
    assert!(!log.dialled_from_fresh_port(&peer_addr));
}

#[tokio::test]
async fn an_accepted_connection_goes_to_the_swarm_when_it_speaks_or_after_the_hold() {
    use tokio::io::AsyncWriteExt as _;
    let (mut t, _log, _fallbacks, port) = listening().await;
    // A dialer speaks first: released at once.
    let mut talker = silent_peer(port).await;
    talker
        .write_all(b"/multistream/1.0.0\n")
        .await
        .expect("write");
    let (upgrade, _) = next_incoming(&mut t).await;
    let started = tokio::time::Instant::now();
    upgrade.await.expect("released to the swarm");
    assert!(
        started.elapsed() < held::HOLD / 2,
        "{:?}",
        started.elapsed()
    );
    // A silent one nobody dials: released after the hold.
    let _silent = silent_peer(port).await;
    let (upgrade, _) = next_incoming(&mut t).await;
    let started = tokio::time::Instant::now();
    upgrade.await.expect("released to the swarm");
    assert!(started.elapsed() >= held::HOLD, "{:?}", started.elapsed());
}
