//! Resource manager tests on loopback (issue 4): a real control plane, the
//! router started with `spawn`, raw libp2p peers over TCP and QUIC.
//!
//! - a stream flood on one protocol from one peer is refused for that
//!   protocol and peer only; auth and catalog keep serving; counters move;
//! - members behind one source IP are not limited once admitted;
//! - a memory budget refuses connections and counts, and frees on close;
//! - one peer's streams are refused past its share of the memory budget
//!   while other peers are served;
//! - the QUIC listener admits and accounts like TCP.

use crate::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::{Credential, Role};
use agentmesh_proto::pb::mesh::{
    AuthRequest, AuthResponse, CatalogRequest, CatalogResponse, Lookup, Purpose, auth_response,
    catalog_request,
};
use agentmesh_proto::protocols::{AUTH, CATALOG, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_router::Config;
use agentmesh_wire::frame::{read_frame, write_frame};
use futures::{AsyncWriteExt, StreamExt};
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, Stream, StreamProtocol, Swarm, SwarmBuilder, noise, tcp, yamux};
use support::cp::{Cp, start_cp};
use support::{TestRouter, eventually};
use tokio::sync::{mpsc, oneshot};

type Router = TestRouter;

/// A router on loopback TCP and QUIC with 60 s auth and stream deadlines
/// and a 10 s control-plane retry budget; `f` changes anything else.
async fn start_router(cp: &Cp, f: impl FnOnce(&mut Config)) -> Router {
    TestRouter::start(cp, &[], |c| {
        c.listen = vec![
            "/ip4/127.0.0.1/tcp/0".parse().expect("addr"),
            "/ip4/127.0.0.1/udp/0/quic-v1".parse().expect("addr"),
        ];
        c.auth.deadline = Duration::from_secs(60);
        c.connections.stream_timeout = Duration::from_secs(60);
        c.control_plane.retry_budget = Duration::from_secs(10);
        f(c);
    })
    .await
}

/// The router's listen address of one transport.
fn listen_addr(r: &Router, quic: bool) -> Multiaddr {
    r.handle
        .listen_addrs()
        .into_iter()
        .find(|a| a.iter().any(|p| matches!(p, Protocol::QuicV1)) == quic)
        .expect("listen address")
}

type Cmd = Box<dyn FnOnce(&mut Swarm<agentmesh_streams::Behaviour>) + Send>;

/// A raw peer (TCP + QUIC, streams) driven from the test.
struct Peer {
    key: Keypair,
    control: agentmesh_streams::Control,
    cmd: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Peer {
    fn new() -> Self {
        let key = Keypair::generate_ed25519();
        let mut swarm = SwarmBuilder::with_existing_identity(key.clone())
            .with_tokio()
            .with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                yamux::Config::default,
            )
            .expect("tcp")
            .with_quic()
            .with_behaviour(|_| agentmesh_streams::Behaviour::new())
            .expect("behaviour")
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        let control = swarm.behaviour().new_control();
        let (cmd, mut rx) = mpsc::channel::<Cmd>(64);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = swarm.select_next_some() => {
                        if let SwarmEvent::OutgoingConnectionError { error, .. } = ev {
                            tracing::debug!(%error, "dial failed");
                        }
                    }
                    c = rx.recv() => match c {
                        Some(c) => c(&mut swarm),
                        None => break,
                    },
                }
            }
        });
        Self {
            key,
            control,
            cmd,
            task,
        }
    }

    fn id(&self) -> PeerId {
        self.key.public().to_peer_id()
    }

    async fn with_swarm<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Swarm<agentmesh_streams::Behaviour>) -> T + Send + 'static,
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

    /// Dials `addr` (a new connection even if one exists).
    async fn dial(&self, peer: PeerId, addr: Multiaddr) {
        self.with_swarm(move |s| {
            s.dial(
                DialOpts::peer_id(peer)
                    .addresses(vec![addr])
                    .condition(PeerCondition::Always)
                    .build(),
            )
            .expect("dial")
        })
        .await;
    }

    /// Established connections (a test peer only connects to the router).
    async fn connections(&self, _router: PeerId) -> usize {
        self.with_swarm(|s| s.network_info().connection_counters().num_established() as usize)
            .await
    }

    async fn connect(&self, peer: PeerId, addr: Multiaddr) {
        self.dial(peer, addr).await;
        eventually("connected", || async {
            (self.connections(peer).await > 0).then_some(())
        })
        .await;
    }

    async fn open(&self, peer: PeerId, protocol: &'static str) -> Result<Stream, String> {
        self.control
            .clone()
            .open_stream(peer, StreamProtocol::new(protocol))
            .await
            .map_err(|e| e.to_string())
    }

    async fn auth(&self, router: PeerId, credential: Credential) -> AuthResponse {
        let req = AuthRequest {
            credential: Some(credential),
            purpose: Purpose::Attach as i32,
            attached_routers: vec![],
            ..Default::default()
        };
        let mut s = self.open(router, AUTH).await.expect("open auth stream");
        write_frame(&mut s, &req).await.expect("write auth");
        let resp = read_frame(&mut s, MAX_FRAME_BYTES)
            .await
            .expect("read auth");
        let _ = s.close().await;
        resp
    }

    async fn lookup(&self, router: PeerId) -> CatalogResponse {
        let req = CatalogRequest {
            op: Some(catalog_request::Op::Lookup(Lookup {
                service: "nothing-here".into(),
                limit: 10,
            })),
        };
        let mut s = self.open(router, CATALOG).await.expect("open catalog");
        write_frame(&mut s, &req).await.expect("write catalog");
        let resp = read_frame(&mut s, MAX_CATALOG_FRAME_BYTES)
            .await
            .expect("read catalog");
        let _ = s.close().await;
        resp
    }
}

fn admitted(resp: &AuthResponse) -> bool {
    matches!(resp.result, Some(auth_response::Result::Admitted(_)))
}

async fn admitted_peer(cp: &Cp, r: &Router, token: &str, quic: bool) -> Peer {
    let p = Peer::new();
    p.connect(r.id(), listen_addr(r, quic)).await;
    let cred = cp.enroll(token, &p.key).await;
    assert!(admitted(&p.auth(r.id(), cred).await), "admitted");
    p
}

/// The catalog streams the router holds open inbound.
const LIVE_CATALOG: &str = "agentmesh_router_streams{protocol=\"catalog\",direction=\"inbound\"}";

/// Opens catalog streams from `peer` and holds them until 10 are refused,
/// asserting after each that the router holds at most `cap` (`cap_name`
/// says what it is); returns the held streams and the refusals seen. The
/// router's catalog accept loop may drop a stream it cannot take at once
/// (the stream behaviour's bounded per-protocol queue), which frees budget,
/// so this floods until refusals show rather than opening `cap` and one.
async fn flood_catalog(peer: &Peer, r: &Router, cap: f64, cap_name: &str) -> (Vec<Stream>, u32) {
    let mut held = Vec::new();
    let mut refused = 0u32;
    let end = tokio::time::Instant::now() + support::DEADLINE;
    while refused < 10 {
        assert!(
            tokio::time::Instant::now() < end,
            "no refusals within the deadline"
        );
        match peer.open(r.id(), CATALOG).await {
            Ok(s) => held.push(s),
            Err(_) => refused += 1,
        }
        assert!(r.metric(LIVE_CATALOG) <= cap, "{cap_name} is exceeded");
    }
    (held, refused)
}

/// Closes `held` and waits (`what` names the wait) until the router's
/// `live` gauge of them reads 0.
async fn close_all(held: Vec<Stream>, r: &Router, live: &str, what: &str) {
    for mut s in held {
        let _ = s.close().await;
    }
    eventually(what, || async { (r.metric(live) == 0.0).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_flood_on_one_protocol_is_refused_for_that_peer_only() {
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources
            .peer_stream_budgets
            .insert("catalog".to_string(), 4);
    })
    .await;
    // The stream behaviour's drop counter is on /metrics, its label values
    // created with the catalog registration so rates read 0.
    let text = r.handle.metrics_text();
    for reason in ["queue_full", "not_accepted"] {
        let series = format!(
            "agentmesh_streams_inbound_dropped_total{{protocol=\"{CATALOG}\",reason=\"{reason}\"}} 0"
        );
        assert!(text.contains(&series), "{series} missing from /metrics");
    }
    let token = cp.token(Role::Member).await;
    let flooder = admitted_peer(&cp, &r, &token, false).await;
    let other = admitted_peer(&cp, &r, &token, false).await;

    // The flooder opens catalog streams and holds them; every refusal it
    // sees is counted, and the live count never exceeds the budget.
    let (held, refused) = flood_catalog(&flooder, &r, 4.0, "the per-peer budget").await;
    assert_eq!(r.refused("stream", "peer", "catalog"), f64::from(refused));
    assert_eq!(r.refused("stream", "protocol", "catalog"), 0.0);
    assert_eq!(r.refused("stream", "peer", "auth"), 0.0);

    // Its connection lives on; auth still serves it, and the other member
    // gets catalog answers.
    assert_eq!(flooder.connections(r.id()).await, 1);
    let cred = cp.enroll(&token, &flooder.key).await;
    assert!(admitted(&flooder.auth(r.id(), cred).await));
    let resp = other.lookup(r.id()).await;
    assert!(resp.result.is_some(), "catalog answered: {resp:?}");

    // Closing the held streams gives the budget back.
    close_all(held, &r, LIVE_CATALOG, "catalog budget released").await;
    let resp = flooder.lookup(r.id()).await;
    assert!(resp.result.is_some(), "catalog answers the flooder again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peers_streams_are_refused_past_its_memory_share() {
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        // 1% of 64 MiB is below the 1 MiB floor: the share is 1 MiB, 16
        // catalog streams (64 KiB each), less what the peer holds besides.
        c.resources.memory_limit_bytes = Some(64 << 20);
        c.resources.memory_budget_percent = 100;
        c.resources.memory_per_peer_max_percent = 1;
        // The stream budgets must not bite first.
        c.resources
            .peer_stream_budgets
            .insert("catalog".to_string(), 64);
    })
    .await;
    assert_eq!(
        r.metric("agentmesh_router_memory_per_peer_max_bytes"),
        f64::from(1 << 20)
    );
    let token = cp.token(Role::Member).await;
    let busy = admitted_peer(&cp, &r, &token, false).await;
    let other = admitted_peer(&cp, &r, &token, false).await;

    // The busy peer opens catalog streams and holds them.
    let (held, refused) = flood_catalog(&busy, &r, 16.0, "the peer's share").await;
    assert_eq!(r.refused("memory", "peer", "catalog"), f64::from(refused));
    assert_eq!(r.refused("memory", "system", "catalog"), 0.0);
    assert_eq!(r.refused("stream", "peer", "catalog"), 0.0);
    // The other member is served; the busy one keeps its connection.
    let resp = other.lookup(r.id()).await;
    assert!(resp.result.is_some(), "catalog answered: {resp:?}");
    assert_eq!(busy.connections(r.id()).await, 1);

    // Closing the held streams gives the share back.
    close_all(held, &r, LIVE_CATALOG, "the share released").await;
    let resp = busy.lookup(r.id()).await;
    assert!(resp.result.is_some(), "catalog answers the busy peer again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_behind_one_ip_are_not_limited_once_admitted() {
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources.unauthenticated_connections_per_ip = 2;
    })
    .await;
    let token = cp.token(Role::Member).await;

    // Two unauthenticated connections from 127.0.0.1 use the source's budget.
    // Each is up at the router before the next dials: a dialer counts its
    // connection up before the router has taken its last handshake
    // message, so on a loaded machine b's could otherwise be the older.
    let charged = "agentmesh_router_connections_charged";
    let before = r.metric(charged);
    let a = Peer::new();
    a.connect(r.id(), listen_addr(&r, false)).await;
    eventually("a's connection up at the router", || async {
        (r.metric(charged) >= before + 1.0).then_some(())
    })
    .await;
    let b = Peer::new();
    b.connect(r.id(), listen_addr(&r, false)).await;
    eventually("b's connection up at the router", || async {
        (r.metric(charged) >= before + 2.0).then_some(())
    })
    .await;
    // A newcomer at the cap is let in and the source's oldest
    // unauthenticated connection (a's) is closed: an attacker holding a
    // source's slots cannot keep a real member from that address out.
    let c = Peer::new();
    c.connect(r.id(), listen_addr(&r, false)).await;
    let evicted = r#"agentmesh_router_connections_closed_total{reason="evicted_by_newcomer"}"#;
    eventually("the oldest unauthenticated connection evicted", || async {
        (r.metric(evicted) >= 1.0).then_some(())
    })
    .await;
    eventually("the evicted peer disconnected", || async {
        (a.connections(r.id()).await == 0).then_some(())
    })
    .await;
    assert_eq!(r.metric(evicted), 1.0, "only the oldest is evicted");

    // Once admitted, they no longer count: many more members behind the
    // same IP get in, one after the other, and none is evicted or refused.
    for p in [&b, &c] {
        let cred = cp.enroll(&token, &p.key).await;
        assert!(admitted(&p.auth(r.id(), cred).await));
    }
    let mut members = Vec::new();
    for _ in 0..6 {
        members.push(admitted_peer(&cp, &r, &token, false).await);
    }
    assert_eq!(r.refused("connection", "source", "none"), 0.0);
    assert_eq!(r.metric(evicted), 1.0);
    for m in members.iter().chain([&b, &c]) {
        assert_eq!(m.connections(r.id()).await, 1, "{} stays", m.id());
    }
    // The gauge is refreshed by the router's periodic tick.
    eventually("eight members behind one IP attached", || async {
        (r.metric("agentmesh_router_attached_members") >= 8.0).then_some(())
    })
    .await;
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_budget_refuses_and_counts() {
    let cp = start_cp().await;
    let charge: u64 = 1 << 20;
    let r = start_router(&cp, |c| {
        c.resources.connection_charge_bytes = charge;
        c.resources.memory_budget_percent = 100;
        // The memory budget, not the watermark (sized to 1 here), refuses.
        c.watermarks.high = Some(10);
        // Two connections and a few control streams fit; a third connection does not.
        c.resources.memory_limit_bytes = Some(2 * charge + 512 * 1024);
    })
    .await;
    assert_eq!(
        r.metric("agentmesh_router_memory_budget_bytes"),
        (2 * charge + 512 * 1024) as f64
    );
    let token = cp.token(Role::Member).await;
    let a = admitted_peer(&cp, &r, &token, false).await;
    let b = admitted_peer(&cp, &r, &token, false).await;
    assert!(r.metric("agentmesh_router_memory_in_use_bytes") >= (2 * charge) as f64);

    let c = Peer::new();
    c.dial(r.id(), listen_addr(&r, false)).await;
    eventually("connection over the memory budget refused", || async {
        (r.refused("memory", "system", "none") >= 1.0).then_some(())
    })
    .await;
    eventually("refused peer disconnected", || async {
        (c.connections(r.id()).await == 0).then_some(())
    })
    .await;
    assert_eq!(b.connections(r.id()).await, 1, "admitted members stay");

    // A member leaving frees its charge; the next connection fits.
    drop(a);
    eventually("charge released", || async {
        (r.metric("agentmesh_router_memory_in_use_bytes") <= (charge + 512 * 1024) as f64)
            .then_some(())
    })
    .await;
    let d = admitted_peer(&cp, &r, &token, false).await;
    assert_eq!(d.connections(r.id()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_listener_admits_and_accounts_like_tcp() {
    const HOP: &str = "/libp2p/circuit/relay/0.2.0/hop";
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources
            .peer_stream_budgets
            .insert("relay_hop".to_string(), 2);
    })
    .await;
    let token = cp.token(Role::Member).await;
    let p = admitted_peer(&cp, &r, &token, true).await;
    assert_eq!(r.metric("agentmesh_router_connections_charged"), 1.0);
    let mut s1 = p.open(r.id(), HOP).await.expect("1");
    let _s2 = p.open(r.id(), HOP).await.expect("2");
    assert!(p.open(r.id(), HOP).await.is_err(), "3rd refused");
    assert_eq!(r.refused("stream", "peer", "relay_hop"), 1.0);
    assert_eq!(p.connections(r.id()).await, 1, "the connection survives");
    let resp = p.lookup(r.id()).await;
    assert!(resp.result.is_some(), "catalog answers over QUIC: {resp:?}");
    let _ = s1.close().await;
    drop(s1);
    eventually("one relay_hop stream released", || async {
        (r.metric("agentmesh_router_streams{protocol=\"relay_hop\",direction=\"inbound\"}") == 1.0)
            .then_some(())
    })
    .await;
    assert!(p.open(r.id(), HOP).await.is_ok(), "budget is back");
}

/// A, attached with a reservation at `r` and serving echo, and B, admitted
/// for transit; with the circuit address through `r`.
async fn destination_and_source(
    cp: &Cp,
    r: &Router,
) -> (support::TestPeer, support::TestPeer, Multiaddr) {
    use support::{Ev, TestPeer};
    let token = cp.token(Role::Member).await;
    let relay_addr = listen_addr(r, false);
    let circuit = relay_addr
        .clone()
        .with(Protocol::P2p(r.id()))
        .with(Protocol::P2pCircuit);
    let mut a = TestPeer::new();
    a.connect(r.id(), relay_addr.clone()).await;
    let cred = cp.enroll(&token, &a.key).await;
    assert!(admitted(&a.auth(r.id(), Some(cred), Purpose::Attach).await));
    let c = circuit.clone();
    a.with_swarm(move |s| s.listen_on(c).expect("listen on circuit"))
        .await;
    a.wait(
        "reservation accepted",
        |e| matches!(e, Ev::ListenAddr(addr) if addr.iter().any(|p| p == Protocol::P2pCircuit)),
    )
    .await;
    let mut b = TestPeer::new();
    b.connect(r.id(), relay_addr).await;
    let cred = cp.enroll(&token, &b.key).await;
    assert!(admitted(
        &b.auth(r.id(), Some(cred), Purpose::Transit).await
    ));
    (a, b, circuit)
}

/// Circuits to one destination are capped, and shared by the members that
/// ask for them: a member holding some gets another only while it holds
/// fewer than remain free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuits_per_destination_are_capped_at_the_relay_and_shared_by_source() {
    use support::{Ev, TestPeer};
    let cp = start_cp().await;
    let r = start_router(&cp, |c| c.resources.circuits_per_destination = 2).await;
    let (a, mut b, circuit) = destination_and_source(&cp, &r).await;
    let _echo = a.serve_echo("/test/echo/1");
    let aid = a.peer_id;
    let connected = |e: &Ev| matches!(e, Ev::Connected { peer, relayed: true } if *peer == aid);

    // B's first circuit fits; its second would leave nothing free (it holds
    // 1, 1 is free): refused for B's share.
    b.dial_through(&circuit, aid).await;
    b.wait("B's relayed connection to A", connected).await;
    b.dial_through(&circuit, aid).await;
    eventually("B's second circuit refused for its share", || async {
        (r.refused("circuit", "source", "relay_stop") >= 1.0).then_some(())
    })
    .await;
    // C, holding none, gets the last place; its second is over the cap.
    let mut c = TestPeer::new();
    c.connect(r.id(), listen_addr(&r, false)).await;
    let cred = cp.member_credential(&c.key).await;
    assert!(admitted(
        &c.auth(r.id(), Some(cred), Purpose::Transit).await
    ));
    c.dial_through(&circuit, aid).await;
    c.wait("C's relayed connection to A", connected).await;
    c.dial_through(&circuit, aid).await;
    eventually("C's second circuit refused at the cap", || async {
        (r.refused("circuit", "peer", "relay_stop") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(r.refused("circuit", "source", "relay_stop"), 1.0);
    assert_eq!(r.refused("circuit", "peer", "relay_stop"), 1.0);
    assert_eq!(
        r.metric("agentmesh_router_streams{protocol=\"relay_stop\",direction=\"outbound\"}"),
        2.0
    );
    // The two circuits still carry calls.
    let data = vec![7u8; 64 * 1024];
    assert_eq!(b.echo(aid, "/test/echo/1", &data).await, data);
    assert_eq!(c.echo(aid, "/test/echo/1", &data).await, data);
}

/// libp2p-relay runs 10 STOP handshakes per connection and drops the 11th
/// stream silently (its source times out, and its relay client drops its
/// reservation). The router caps handshakes in flight below that: with the
/// destination not answering (frozen), the circuit past the cap is denied
/// to its source at once, while the ones in flight complete when the
/// destination answers, and their places free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_handshakes_in_flight_are_capped_per_connection_and_refused_at_once() {
    use support::Ev;
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources.relay_stop_handshakes_per_connection = 2
    })
    .await;
    let (a, mut b, circuit) = destination_and_source(&cp, &r).await;
    let _echo = a.serve_echo("/test/echo/1");
    let aid = a.peer_id;
    let in_flight = "agentmesh_router_relay_stop_handshakes";
    assert_eq!(r.metric(in_flight), 0.0);

    let frozen = a.freeze().await;
    for _ in 0..2 {
        b.dial_through(&circuit, aid).await;
    }
    eventually("two handshakes in flight", || async {
        (r.metric(in_flight) >= 2.0).then_some(())
    })
    .await;
    b.dial_through(&circuit, aid).await;
    // Denied while A still answers nothing: not a timeout.
    let failed = b
        .wait(
            "third circuit denied",
            |e| matches!(e, Ev::DialFailed { peer: Some(p), .. } if *p == aid),
        )
        .await;
    tracing::info!(?failed, "denied");
    assert_eq!(r.refused("circuit", "connection", "relay_stop"), 1.0);
    assert_eq!(r.refused("circuit", "peer", "relay_stop"), 0.0);
    assert_eq!(r.metric(in_flight), 2.0);

    // A answers: both circuits in flight open, and their places are free.
    drop(frozen);
    for _ in 0..2 {
        b.wait(
            "relayed connection to A",
            |e| matches!(e, Ev::Connected { peer, relayed: true } if *peer == aid),
        )
        .await;
    }
    eventually("no handshake in flight", || async {
        (r.metric(in_flight) == 0.0).then_some(())
    })
    .await;
    assert_eq!(
        r.metric("agentmesh_router_streams{protocol=\"relay_stop\",direction=\"outbound\"}"),
        2.0
    );
    b.dial_through(&circuit, aid).await;
    b.wait(
        "a third circuit once places are free",
        |e| matches!(e, Ev::Connected { peer, relayed: true } if *peer == aid),
    )
    .await;
    assert_eq!(r.refused("circuit", "connection", "relay_stop"), 1.0);
    let data = vec![7u8; 64 * 1024];
    assert_eq!(b.echo(aid, "/test/echo/1", &data).await, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_a_built_in_protocol_is_accounted_and_released() {
    const HOP: &str = "/libp2p/circuit/relay/0.2.0/hop";
    let cp = start_cp().await;
    let r = start_router(&cp, |c| {
        c.resources
            .peer_stream_budgets
            .insert("relay_hop".to_string(), 3);
    })
    .await;
    let token = cp.token(Role::Member).await;
    let flooder = admitted_peer(&cp, &r, &token, false).await;

    // HOP streams held open (no request written) sit in the relay's own
    // handler; the muxer counts them all the same.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(flooder.open(r.id(), HOP).await.expect("within budget"));
    }
    for _ in 0..5 {
        assert!(flooder.open(r.id(), HOP).await.is_err(), "over budget");
    }
    assert_eq!(r.refused("stream", "peer", "relay_hop"), 5.0);
    assert_eq!(
        r.metric("agentmesh_router_streams{protocol=\"relay_hop\",direction=\"inbound\"}"),
        3.0
    );
    // Auth and catalog keep serving the same peer.
    let cred = cp.enroll(&token, &flooder.key).await;
    assert!(admitted(&flooder.auth(r.id(), cred).await));
    assert!(flooder.lookup(r.id()).await.result.is_some());

    // When the relay's handler lets go of the streams, the budget comes back.
    let live = "agentmesh_router_streams{protocol=\"relay_hop\",direction=\"inbound\"}";
    close_all(held, &r, live, "relay_hop streams released").await;
    assert!(flooder.open(r.id(), HOP).await.is_ok(), "budget is back");
}
