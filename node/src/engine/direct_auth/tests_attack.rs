//! The attack on authentication right after the punch: a peer that may
//! open a direct connection to a member (it holds a relayed connection and
//! a punch with it is under way: set on the member's behaviour, as that
//! part needs a router) opens one with real TCP, noise and yamux
//! handshakes, then stays silent, or sends a forged or a revoked
//! credential in its hello. Each is closed and counted under its reason;
//! an honest peer's connection, beside them, stays past the deadline.
//!
//! The member is the node's own swarm (`transport::build_swarm`) driven as
//! the engine drives it: each hello verified with [`verify_hello`] and
//! [`judge`], the deadline checked on a tick.

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{Trust, sign};
use agentmesh_proto::pb::credential::{Claims, Credential, Revocation};
use agentmesh_proto::protocols::DIRECT_HELLO;
use agentmesh_proto::testing::{TestCp, member_claims};
use agentmesh_proto::unix_now;
use futures::StreamExt as _;
use libp2p::identity::{Keypair, ed25519};
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::DialOpts;
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, ping};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use super::{HelloRefused, judge, verify_hello};
use crate::direct::Event;
use crate::metrics::{DirectMetrics, ReasonLabel};
use crate::transport::{Behaviour, BehaviourEvent, Dialing, build_swarm, reuse, window_limits};

const DEADLINE: Duration = Duration::from_secs(20);
const AUTH_TIMEOUT: Duration = Duration::from_millis(500);

async fn swarm(
    key: &Keypair,
    listen: Option<SocketAddr>,
    metrics: DirectMetrics,
) -> Swarm<Behaviour> {
    let dialing = Dialing {
        source_ip: None,
        listen: listen.map(|at| (at, reuse::ReuseLog::default())),
        metrics,
        punch_backoff: Default::default(),
        max_pending_inbound: (64, 8),
        tcp_user_timeout: None,
        quic_idle_timeout: Duration::ZERO,
        auth_timeout: AUTH_TIMEOUT,
        loopback_targets: false,
        quic: false,
        max_connections: 1024,
    };
    build_swarm(
        key,
        dialing,
        Duration::from_secs(10),
        Duration::from_secs(60),
        ping::Config::new(),
        agentmesh_streams::Config::default(),
        agentmesh_streams::PendingOpenLimits::default(),
        window_limits(&crate::config::ConnectionConfig::default()),
        Counter::default(),
    )
    .await
    .expect("swarm")
}

/// Member claims for `peer` from `token`, valid for the next hour.
fn claims(peer: &PeerId, token: &str) -> Claims {
    let now = unix_now();
    member_claims(peer, "a", token, now - 10..now + 3600)
}

/// What the member did with a direct connection.
#[derive(Debug, PartialEq)]
enum Seen {
    Authenticated(PeerId),
    Closed(PeerId),
}

/// Drives the member as the engine does: hellos verified, the deadline
/// checked every 100 ms; reports what became of each connection.
fn drive(
    mut member: Swarm<Behaviour>,
    trust: Trust,
    policy: Policy,
    mut peers: mpsc::Receiver<PeerId>,
    seen: mpsc::Sender<Seen>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                biased;
                Some(peer) = peers.recv() => member.behaviour_mut().direct.as_if_punching(peer),
                _ = tick.tick() => {
                    member
                        .behaviour_mut()
                        .direct
                        .expire_unauthenticated(tokio::time::Instant::now());
                }
                e = member.select_next_some() => match e {
                    SwarmEvent::Behaviour(BehaviourEvent::Direct(Event::Hello {
                        peer,
                        connection,
                        heard,
                    })) => {
                        let direct = &mut member.behaviour_mut().direct;
                        let verdict = match heard {
                            crate::direct::hello::Heard::Credential(cred) => {
                                verify_hello(&cred, &trust, &peer, unix_now(), 0)
                            }
                            crate::direct::hello::Heard::Unreadable(why) => {
                                Err(HelloRefused::Closed("unauthenticated", why))
                            }
                        }
                        .and_then(|v| {
                                judge(&trust, &policy, None, &v, unix_now())
                                    .map(|()| v)
                                    .map_err(|r| HelloRefused::Closed(r, String::new()))
                            });
                        match verdict {
                            Ok(v) => {
                                assert!(direct.authenticated(connection, v));
                                let _ = seen.send(Seen::Authenticated(peer)).await;
                            }
                            Err(HelloRefused::Closed(reason, _)) => {
                                direct.close_direct(connection, reason);
                            }
                            Err(HelloRefused::UnknownKey) => {
                                direct.close_direct(connection, "unauthenticated");
                            }
                        }
                    }
                    SwarmEvent::ConnectionClosed { peer_id, .. } => {
                        let _ = seen.send(Seen::Closed(peer_id)).await;
                    }
                    _ => {}
                },
            }
        }
    })
}

/// A peer that connects to `at` and, with `hello`, sends it on the hello
/// protocol; its swarm runs until dropped.
async fn attacker(
    member: PeerId,
    at: Multiaddr,
    hello: Option<fn(&PeerId) -> Credential>,
    peers: &mpsc::Sender<PeerId>,
) -> (PeerId, tokio::task::JoinHandle<()>) {
    let key = Keypair::generate_ed25519();
    let me = key.public().to_peer_id();
    peers.send(me).await.expect("driver");
    let mut s = swarm(&key, None, DirectMetrics::default()).await;
    let mut control = s.behaviour().stream.new_control();
    s.dial(DialOpts::peer_id(member).addresses(vec![at]).build())
        .expect("dial");
    let cred = hello.map(|f| f(&me));
    let task = tokio::spawn(async move {
        let send = async move {
            let Some(cred) = cred else {
                return std::future::pending().await;
            };
            let mut stream = control
                .open_stream(member, StreamProtocol::new(DIRECT_HELLO))
                .await
                .expect("hello stream");
            agentmesh_wire::frame::write_frame(&mut stream, &cred)
                .await
                .expect("hello written");
            // Held open: the member, not the attacker, ends it.
            std::future::pending::<()>().await
        };
        tokio::pin!(send);
        loop {
            tokio::select! {
                _ = s.select_next_some() => {}
                () = &mut send => {}
            }
        }
    });
    (me, task)
}

async fn next_about(seen: &mut mpsc::Receiver<Seen>, peer: PeerId) -> Seen {
    tokio::time::timeout(DEADLINE, async {
        loop {
            let s = seen.recv().await.expect("driver runs");
            if matches!(&s, Seen::Authenticated(p) | Seen::Closed(p) if *p == peer) {
                return s;
            }
        }
    })
    .await
    .expect("the member decided in time")
}

#[tokio::test]
async fn a_peer_that_never_authenticates_or_lies_in_its_hello_is_closed_and_counted() {
    // The control plane's key, and a revocation of one token.
    static CP: std::sync::OnceLock<TestCp> = std::sync::OnceLock::new();
    let mut trust = CP.get_or_init(TestCp::new).trust.clone();
    trust.set_revocations(&[Revocation {
        peer_id: vec![],
        until_unix_secs: unix_now() + 3600,
        reason: "leaked".into(),
        token_id: "t-revoked".into(),
    }]);
    let metrics = DirectMetrics::default();
    let key = Keypair::generate_ed25519();
    let member_id = key.public().to_peer_id();
    let mut member = swarm(
        &key,
        Some("127.0.0.1:0".parse().expect("sa")),
        metrics.clone(),
    )
    .await;
    let at = tokio::time::timeout(DEADLINE, async {
        loop {
            if let SwarmEvent::NewListenAddr { address, .. } = member.select_next_some().await {
                break address;
            }
        }
    })
    .await
    .expect("the member listens")
    .with(Protocol::P2p(member_id));
    let (peers_tx, peers) = mpsc::channel(8);
    let (seen_tx, mut seen) = mpsc::channel(64);
    let driver = drive(member, trust, Policy::allow_all(), peers, seen_tx);
    let closed = |reason: &'static str| {
        metrics
            .direct_closed
            .get_or_create(&ReasonLabel { reason })
            .get()
    };

    // An honest peer first: authenticated, and still open past the deadline.
    let honest: fn(&PeerId) -> Credential =
        |me| sign(&claims(me, "t-ok"), &CP.get().expect("cp").key);
    let (good, good_task) = attacker(member_id, at.clone(), Some(honest), &peers_tx).await;
    assert_eq!(next_about(&mut seen, good).await, Seen::Authenticated(good));

    // Silent: connects and never says hello.
    let (silent, t1) = attacker(member_id, at.clone(), None, &peers_tx).await;
    assert_eq!(next_about(&mut seen, silent).await, Seen::Closed(silent));
    assert_eq!(closed("unauthenticated"), 1);

    // Forged: claims signed by a key of its own.
    let forged: fn(&PeerId) -> Credential =
        |me| sign(&claims(me, "t-ok"), &ed25519::Keypair::generate());
    let (liar, t2) = attacker(member_id, at.clone(), Some(forged), &peers_tx).await;
    assert_eq!(next_about(&mut seen, liar).await, Seen::Closed(liar));
    assert_eq!(closed("unauthenticated"), 2);

    // Revoked: a real credential of a revoked token.
    let revoked: fn(&PeerId) -> Credential =
        |me| sign(&claims(me, "t-revoked"), &CP.get().expect("cp").key);
    let (gone, t3) = attacker(member_id, at.clone(), Some(revoked), &peers_tx).await;
    assert_eq!(next_about(&mut seen, gone).await, Seen::Closed(gone));
    assert_eq!(closed("revoked"), 1);

    // The honest peer's connection outlived every deadline above.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), next_about(&mut seen, good))
            .await
            .is_err(),
        "the honest connection was closed"
    );
    assert_eq!(closed("closed") + closed("error") + closed("policy"), 0);
    for t in [good_task, t1, t2, t3, driver] {
        t.abort();
    }
}
