//! Direct connections across NATs (`docs/direct.md`): two routers and the
//! control plane on public hosts, a caller and a provider each behind a
//! NAT of its own, both with `--direct=true` on a fixed `--listen-port`
//! and attached to both routers (two observations of each member's
//! mapping).
//!
//! - Both behind endpoint-independent NATs: warm calls end up on a direct
//!   connection (the caller's `calls_by_path_total{path="direct"}`, its
//!   `status` naming the provider as a direct peer, a punch counted as
//!   `direct`), a call open across the upgrade ends whole (it started
//!   relayed and stays there); and a SYN to a member's public port from a
//!   public host is dropped by its NAT (the connect times out), never
//!   answered with a reset.
//! - A stranger (a libp2p peer with a key of its own, holding no relayed
//!   connection to the member) dials a public member's listening port: it
//!   completes the handshake and is closed at once, counted in
//!   `agentmesh_node_inbound_refused_total{reason="no_relayed_connection"}`.
//! - TIME_WAIT: a punch right after the last direct connection between
//!   the same two ports closed (its tuple seen in TIME_WAIT) succeeds.
//! - The provider behind a symmetric NAT: its routers see two ports, its
//!   `status` says `endpoint_dependent`, it skips every punch (counted)
//!   and every call stays relayed and succeeds.

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_netns::NatKind;
use rand::RngCore as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_calls_between_members_behind_eim_nats_go_direct() {
    let Some(mut net) = Net::start("direct_eim", &[]).await else {
        return;
    };
    let EimPair {
        provider,
        caller,
        provider_nat: pgw,
        ..
    } = net.eim_pair(&[], &[]).await;
    assert_eq!(nat_kind(&provider).await, "endpoint_independent");
    assert_eq!(nat_kind(&caller).await, "endpoint_independent");

    // Calls until one is carried by a direct connection: the first goes
    // relayed (it never waits for a punch), the punch runs on that
    // relayed connection, and a later call opens its stream on the
    // direct connection once it is up. One call stays open across the
    // upgrade: it started relayed and must end whole.
    let mut payload = vec![0u8; 16 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    let forward = caller.forwards["echo-prov"];
    let mut in_flight = caller.host.connect(forward).await.expect("connect");
    in_flight
        .write_all(&payload[..8 * 1024])
        .await
        .expect("first half");
    let mut echoed = vec![0u8; 8 * 1024];
    tokio::time::timeout(DEADLINE, in_flight.read_exact(&mut echoed))
        .await
        .expect("first half echoed in time")
        .expect("first half echoed");
    assert_eq!(echoed, payload[..8 * 1024]);
    let direct = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    let relayed = r#"agentmesh_node_calls_by_path_total{path="relayed"}"#;
    let calls = call_until_direct(&caller, "echo-prov", &payload).await;
    assert!(
        caller.metric(relayed).await >= 1.0,
        "the first call went relayed"
    );
    // The call that started before the upgrade still works, to its end.
    in_flight
        .write_all(&payload[8 * 1024..])
        .await
        .expect("second half");
    in_flight.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, in_flight.read_to_end(&mut rest))
        .await
        .expect("the rest echoed in time")
        .expect("the rest echoed");
    assert_eq!(
        rest,
        payload[8 * 1024..],
        "the call in flight was not broken"
    );
    // Once up, the direct connection carries the next call too.
    let before = caller.metric(direct).await;
    caller.call_until_echoed("echo-prov", &payload).await;
    assert_eq!(caller.metric(direct).await, before + 1.0);
    // Its bytes are counted on the direct path, on both sides; the first
    // call's on the relayed one.
    let bytes = |path: &str, direction: &str| {
        format!(
            r#"agentmesh_node_call_bytes_by_path_total{{path="{path}",direction="{direction}"}}"#
        )
    };
    let n = payload.len() as f64;
    assert!(caller.metric(&bytes("direct", "sent")).await >= n);
    assert!(caller.metric(&bytes("direct", "received")).await >= n);
    assert!(caller.metric(&bytes("relayed", "sent")).await >= 8.0 * 1024.0);
    // The provider counts a call's bytes when its splice ends, a moment
    // after the caller read the last byte.
    eventually("the provider counted the direct call's bytes", || {
        let (provider, bytes) = (&provider, &bytes);
        async move {
            let received = provider.metric(&bytes("direct", "received")).await;
            let sent = provider.metric(&bytes("direct", "sent")).await;
            (received >= n && sent >= n).then_some(())
        }
    })
    .await;
    // And `agentmesh-node ping` says so: the path is direct, no router.
    let pinged = caller.ping("echo-prov").await.expect("a ping answer");
    let route = pinged.route.expect("a granted ping names its route");
    assert_eq!(route.path, "direct", "{route:?}");
    assert_eq!(route.router, None, "{route:?}");
    let punched = caller
        .metric(r#"agentmesh_node_upgrade_attempts_total{result="direct"}"#)
        .await
        + provider
            .metric(r#"agentmesh_node_upgrade_attempts_total{result="direct"}"#)
            .await;
    assert!(punched >= 1.0, "a punch counted as direct");
    let status = caller.status().await.expect("caller status");
    let peers = status.direct.expect("direct section").direct_peers;
    eprintln!("{calls} calls until one went direct; caller's direct peers {peers:?}");
    // No call failed on the way.
    let failed_out = caller
        .metric(r#"agentmesh_node_calls_total{direction="outbound",result="connect_failed"}"#)
        .await;
    assert_eq!(failed_out, 0.0);

    // Unsolicited inbound to the provider's public mapping is dropped by
    // its NAT: the connect neither completes nor is refused.
    let outsider = net.tb.public_host("outsider").await.expect("host");
    let target = SocketAddr::new(pgw.public_addr().into(), LISTEN_PORT);
    let attempt = tokio::time::timeout(Duration::from_secs(3), outsider.connect(target)).await;
    match attempt {
        Err(_elapsed) => {}
        Ok(Ok(_)) => panic!("an unsolicited connection got through the NAT"),
        Ok(Err(e)) => panic!("the NAT answered an unsolicited SYN ({e}): it must drop it"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_symmetric_nat_calls_stay_relayed_and_succeed() {
    let Some(mut net) = Net::start("direct_sym", &[]).await else {
        return;
    };
    net.add_router("r1").await;
    net.add_router("r2").await;
    let (ph, _pgw) = net
        .member_host("prov", Some(NatKind::EndpointDependent))
        .await;
    let (ch, _cgw) = net
        .member_host("caller", Some(NatKind::EndpointIndependent))
        .await;
    let mut provider = net
        .member("prov", ph, &direct_spec(Some("echo-prov"), &[]))
        .await;
    let mut caller = net
        .member("caller", ch, &direct_spec(None, &["echo-prov"]))
        .await;
    provider.wait_ready().await;
    caller.wait_ready().await;
    assert_eq!(nat_kind(&provider).await, "endpoint_dependent");
    let text = provider.status().await.expect("status").render();
    assert!(text.contains("NAT endpoint_dependent"), "{text}");

    let mut payload = vec![0u8; 16 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    // The provider never punches; it asks the caller to take its dial
    // instead (connection reversal), which the caller agrees to, and the
    // caller's `eim` NAT drops that unsolicited dial. Calls until the
    // caller has agreed, then more on that warm connection.
    let agreed = r#"agentmesh_node_upgrade_attempts_total{result="reversal_agreed"}"#;
    eventually("the provider asks for a reversal", || {
        let (caller, payload) = (&caller, &payload);
        async move {
            caller.call_until_echoed("echo-prov", payload).await;
            (caller.metric(agreed).await >= 1.0).then_some(())
        }
    })
    .await;
    for _ in 0..5 {
        let back = caller.call("echo-prov", &payload).await.expect("a call");
        assert_eq!(back, payload);
    }
    let direct = caller
        .metric(r#"agentmesh_node_calls_by_path_total{path="direct"}"#)
        .await;
    let relayed = caller
        .metric(r#"agentmesh_node_calls_by_path_total{path="relayed"}"#)
        .await;
    assert_eq!(direct, 0.0, "no call went direct");
    assert!(relayed >= 6.0, "{relayed} relayed calls");
    let punched = provider
        .metric(r#"agentmesh_node_upgrade_attempts_total{result="direct"}"#)
        .await;
    assert_eq!(punched, 0.0);
    let reversed = provider
        .metric(r#"agentmesh_node_upgrade_attempts_total{result="reversed"}"#)
        .await;
    assert_eq!(reversed, 0.0, "the eim NAT let a reversed dial in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_dialing_a_members_listening_port_is_closed_and_counted() {
    use libp2p::core::muxing::StreamMuxerExt as _;
    use libp2p::core::transport::{DialOpts, PortUse};
    use libp2p::core::upgrade::Version;
    use libp2p::core::{Endpoint, Transport as _};

    let Some(mut net) = Net::start("direct_stranger", &[]).await else {
        return;
    };
    net.add_router("r1").await;
    let (host, _) = net.member_host("m", None).await;
    let member_ip = host.addr();
    let mut m = net.member("m", host, &direct_spec(None, &[])).await;
    m.wait_ready().await;
    let refused = r#"agentmesh_node_inbound_refused_total{reason="no_relayed_connection"}"#;
    assert_eq!(m.metric(refused).await, 0.0);

    let stranger = net.tb.public_host("stranger").await.expect("host");
    let target: libp2p::Multiaddr = format!("/ip4/{member_ip}/tcp/{LISTEN_PORT}")
        .parse()
        .expect("addr");
    let outcome = stranger
        .spawn(async move {
            let key = libp2p::identity::Keypair::generate_ed25519();
            let mut t = libp2p::tcp::tokio::Transport::new(libp2p::tcp::Config::default())
                .upgrade(Version::V1)
                .authenticate(libp2p::noise::Config::new(&key).expect("noise"))
                .multiplex(libp2p::yamux::Config::default())
                .boxed();
            let opts = DialOpts {
                role: Endpoint::Dialer,
                port_use: PortUse::New,
            };
            let (_peer, mut muxer) =
                tokio::time::timeout(DEADLINE, t.dial(target, opts).expect("dial"))
                    .await
                    .map_err(|_| "no handshake in time".to_string())?
                    .map_err(|e| format!("handshake: {e}"))?;
            // The member closes it: the stranger's muxer ends.
            tokio::time::timeout(DEADLINE, async {
                while futures::future::poll_fn(|cx| muxer.poll_inbound_unpin(cx))
                    .await
                    .is_ok()
                {}
            })
            .await
            .map_err(|_| "the member kept the connection".to_string())
        })
        .await
        .expect("stranger task");
    outcome.expect("the stranger is closed");
    eventually("the refusal counted", || async {
        (m.metric(refused).await == 1.0).then_some(())
    })
    .await;
    assert!(m.is_ready().await, "the member is unharmed");
}

/// TIME_WAIT: with fixed ports on both ends, the side that closed the
/// direct connection first holds its 4-tuple in TIME_WAIT for 60 s. The
/// test makes that happen (the direct connection closed for idleness,
/// the TIME_WAIT socket seen with `ss`), then calls again well within
/// the 60 s: the call succeeds and the new punch brings a direct
/// connection up again on the same ports. Linux lets a `connect` from an
/// explicitly bound port take over a TIME_WAIT tuple when that connection
/// used TCP timestamps (the default), so the dial leaves from the
/// listening port; where it cannot (timestamps off, a live socket on the
/// tuple) the dial falls back to a fresh port (unit-tested in
/// `node/src/transport/reuse/tests.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_punch_within_time_wait_of_the_last_direct_connection_succeeds() {
    let Some(mut net) = Net::start("direct_tw", &[]).await else {
        return;
    };
    let idle = ["--idle-connection-secs=2"];
    let EimPair {
        provider, caller, ..
    } = net.eim_pair(&idle, &idle).await;
    assert_eq!(nat_kind(&caller).await, "endpoint_independent");
    let mut payload = vec![0u8; 4 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    let direct = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    let punched = r#"agentmesh_node_upgrade_attempts_total{result="direct"}"#;
    call_until_direct(&caller, "echo-prov", &payload).await;
    let punches = caller.metric(punched).await;
    // Both connections to the provider gone: the direct one closed for
    // idleness, the relayed one after `--relayed-idle-secs`, so the next
    // call makes a new relayed connection and a new punch.
    let relayed_closed = r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"}"#;
    eventually(
        "the direct and relayed connections closed for idleness",
        || async {
            let d = caller.status().await?.direct?;
            let relayed_gone = caller.metric(relayed_closed).await >= 1.0;
            (d.direct_peers.is_empty() && relayed_gone).then_some(())
        },
    )
    .await;
    let closed_at = tokio::time::Instant::now();
    let mut time_wait = false;
    for m in [&caller, &provider] {
        let out = m
            .host
            .command("ss")
            .args(["-tanH", "state", "time-wait"])
            .output()
            .await
            .expect("ss");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        time_wait |= text.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 4
                && cols[cols.len() - 2].ends_with(&format!(":{LISTEN_PORT}"))
                && cols[cols.len() - 1].ends_with(&format!(":{LISTEN_PORT}"))
        });
        eprintln!("{} TIME_WAIT sockets:\n{text}", m.name);
    }
    assert!(
        time_wait,
        "the direct connection's tuple is in TIME_WAIT on one side"
    );
    // Within TIME_WAIT: the call goes through, and a new punch brings the
    // direct path back.
    let before = caller.metric(direct).await;
    eventually("a direct call again", || {
        let (caller, payload) = (&caller, &payload);
        async move {
            caller.call_until_echoed("echo-prov", payload).await;
            (caller.metric(direct).await > before).then_some(())
        }
    })
    .await;
    assert!(caller.metric(punched).await > punches, "a second punch");
    assert!(
        closed_at.elapsed() < Duration::from_secs(60),
        "the second punch came too late to test TIME_WAIT"
    );
    eprintln!(
        "port reuse fallbacks: caller {}, provider {}",
        caller
            .metric("agentmesh_node_port_reuse_fallbacks_total")
            .await,
        provider
            .metric("agentmesh_node_port_reuse_fallbacks_total")
            .await
    );
    // Nothing made either side misread its NAT.
    assert_eq!(nat_kind(&caller).await, "endpoint_independent");
    assert_eq!(nat_kind(&provider).await, "endpoint_independent");
}

/// The direct path between two members behind EIM NATs dies silently in
/// the middle of a stream of calls (the caller's NAT starts dropping every
/// packet to and from the provider's NAT; the routers stay reachable):
/// every call after the cut still succeeds, on the relay, within its
/// budget. The first one's stream opens on the dead direct connection;
/// its bytes stay unacknowledged until the socket's `TCP_USER_TIMEOUT`
/// (2 s here) drops the connection (counted `timed_out`), and the call's
/// retry backs punches off and goes relayed, leaving the relayed
/// connections (the fallback) alone. The call in flight at the cut is the
/// only one allowed to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_continue_on_the_relay_when_the_direct_path_is_cut() {
    direct_path_cut(false).await;
}

/// The same over QUIC (`--direct-transport=quic`): the dead path is
/// noticed at the first call's timeout (4 s; QUIC's own idle timeout is
/// 10 s), whose retry closes the direct connection and goes relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_continue_on_the_relay_when_the_quic_direct_path_is_cut() {
    direct_path_cut(true).await;
}

async fn direct_path_cut(quic: bool) {
    let name = if quic {
        "direct_cut_quic"
    } else {
        "direct_cut"
    };
    let Some(mut net) = Net::start(name, &[]).await else {
        return;
    };
    // A dead direct path is noticed when bytes written on it stay
    // unacknowledged (TCP_USER_TIMEOUT), or at the call's timeout: keep
    // both short.
    let over: &[&str] = if quic {
        &["--direct-transport=quic"]
    } else {
        &[]
    };
    let caller_args: Vec<&str> = DEAD_PATH_NOTICED_FAST.iter().chain(over).copied().collect();
    let EimPair {
        provider: _provider,
        caller,
        provider_nat: pgw,
        caller_nat: cgw,
    } = net.eim_pair(over, &caller_args).await;
    let mut payload = vec![0u8; 8 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    let direct = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    let relayed = r#"agentmesh_node_calls_by_path_total{path="relayed"}"#;
    let fallbacks = "agentmesh_node_direct_fallbacks_total";
    call_until_direct(&caller, "echo-prov", &payload).await;
    assert_eq!(caller.metric(fallbacks).await, 0.0);

    // A call in flight on the direct connection when the path dies.
    let before = caller.metric(direct).await;
    let forward = caller.forwards["echo-prov"];
    let mut in_flight = caller.host.connect(forward).await.expect("connect");
    in_flight.write_all(&payload).await.expect("first bytes");
    let mut echoed = vec![0u8; payload.len()];
    tokio::time::timeout(DEADLINE, in_flight.read_exact(&mut echoed))
        .await
        .expect("echoed in time")
        .expect("echoed");
    assert_eq!(
        caller.metric(direct).await,
        before + 1.0,
        "the call in flight is on the direct connection"
    );

    cgw.cut_to(pgw.public_addr(), true).await.expect("cut");
    let ok = r#"agentmesh_node_calls_total{direction="outbound",result="ok"}"#;
    let ok_before = caller.metric(ok).await;
    let relayed_before = caller.metric(relayed).await;
    const CALLS: usize = 4;
    for i in 0..CALLS {
        let back = caller
            .call("echo-prov", &payload)
            .await
            .unwrap_or_else(|e| panic!("call {i} after the cut failed: {e}"));
        assert_eq!(back, payload, "call {i} after the cut echoed whole");
    }
    assert!(
        caller.metric(fallbacks).await >= 1.0,
        "a call's retry left the dead direct connection"
    );
    if !quic {
        // The kernel gave up on the bytes the first call wrote on it.
        assert_eq!(
            caller
                .metric(r#"agentmesh_node_direct_closed_total{reason="timed_out"}"#)
                .await,
            1.0,
            "the direct connection closed as timed out"
        );
    }
    assert!(
        caller.metric(relayed).await >= relayed_before + CALLS as f64,
        "every call after the cut went relayed"
    );
    assert_eq!(
        caller.metric(ok).await,
        ok_before + CALLS as f64,
        "each call after the cut counted ok once"
    );
    let status = caller.status().await.expect("status");
    assert!(
        status
            .direct
            .expect("direct section")
            .direct_peers
            .is_empty(),
        "no direct peer left"
    );
    // The call in flight died with its path (or ends now): it may fail,
    // it must not hang past its own bound.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(DEADLINE, in_flight.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the call in flight ended");
}
