//! A member does not take a provider from other callers, neither with
//! silent call streams nor with circuits: a real control plane, a real
//! router, a real provider node and two real caller nodes on loopback, and
//! the hostile harness's attacks by an enrolled member admitted for transit:
//! `provider_calls` (320 call streams through a relayed circuit that never
//! send a byte, renewed as the provider closes them) and
//! `provider_circuits` (every circuit to the provider the router lets it
//! hold, renewed as they close).

use super::support;

use std::sync::Arc;
use std::time::Duration;

use agentmesh_hostile::provider_calls::{self, Attack, Progress};
use agentmesh_hostile::provider_circuits::{self, CircuitAttack, CircuitProgress};
use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::eventually;
use libp2p::identity::Keypair;
use support::*;

/// Silent call streams the attacker holds at once: the provider's global
/// bound of calls in any phase before per-caller shares (256 calls + 64).
const SILENT_STREAMS: usize = 320;
/// Calls each real caller makes while the attack runs; every one must work.
const CALLS_PER_CALLER: usize = 5;

/// Makes `CALLS_PER_CALLER` calls one after another, each echoing a small
/// payload; panics naming the first that fails.
async fn calls(node: &NodeHandle, who: &str) {
    for n in 1..=CALLS_PER_CALLER {
        let mut s = node
            .call("echo")
            .await
            .unwrap_or_else(|e| panic!("{who}'s call {n} during the attack failed: {e}"));
        let payload = format!("{who} call {n}");
        let back = tokio::time::timeout(DEADLINE, exchange(&mut s, payload.as_bytes()))
            .await
            .unwrap_or_else(|_| panic!("{who}'s call {n}: no echo in time"))
            .unwrap_or_else(|e| panic!("{who}'s call {n}: {e}"));
        assert_eq!(back, payload.as_bytes(), "{who}'s call {n}");
    }
}

/// While one member holds 320 silent call streams to a provider, every
/// call of two other members to it succeeds; the provider closes the
/// silent streams at its first-byte deadline and counts them, and counts
/// what it refused the attacker with its reason. (Before per-caller shares
/// the attacker's 320 streams filled the provider's bound and every other
/// caller's stream was dropped as `overflow`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_call_streams_of_one_member_leave_the_provider_to_the_others() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut base| {
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    ready(&provider, "provider").await;
    let (a, _adir) = spawn_node(&cp, &member, "spawn a", |base| base).await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |base| base).await;
    ready(&a, "a").await;
    ready(&b, "b").await;
    // Both callers find the provider before the attack starts.
    for n in [&a, &b] {
        let mut s = call_until_found(n, "echo").await;
        assert_eq!(exchange(&mut s, b"before").await.expect("echo"), b"before");
    }

    let key = Keypair::generate_ed25519();
    let credential = cp.member_credential(&key).await;
    let attack = Attack {
        router: r.id(),
        router_addr: r.addr.clone(),
        provider: provider.peer_id(),
        streams: SILENT_STREAMS,
        // A bound, not the plan: the test stops it once the calls are done.
        duration: Duration::from_secs(300),
        renew_pause: Duration::from_millis(100),
        opening: 8,
    };
    let progress = Arc::new(Progress::default());
    let running = {
        let progress = progress.clone();
        tokio::spawn(async move { provider_calls::run(&attack, key, credential, progress).await })
    };
    eventually("the attacker opened all its silent streams", || async {
        assert!(!running.is_finished(), "the attack ended early");
        (progress.report().opened >= SILENT_STREAMS as u64).then_some(())
    })
    .await;

    tokio::join!(calls(&a, "a"), calls(&b, "b"));
    assert!(
        !running.is_finished(),
        "the attack still runs after the calls"
    );

    let metrics = provider.metrics_addr().expect("metrics");
    let inbound = |m: &str, result: &str| {
        metric(
            m,
            &format!(r#"agentmesh_node_calls_total{{direction="inbound",result="{result}"}}"#),
        )
    };
    // The first-byte deadline (2 s) closes silent streams while the attack
    // runs; wait for some rather than for a time.
    let m = eventually("silent streams closed and counted", || async {
        let (_, m) = http_get(metrics, "/metrics").await;
        (inbound(&m, "silent") >= 1.0).then_some(m)
    })
    .await;
    progress.stop();
    let report = running.await.expect("attack task").expect("attack set-up");

    // What happened, for the log of a failing run.
    let counts: Vec<String> = [
        "accepted",
        "overflow",
        "caller_share",
        "preempted",
        "silent",
        "malformed",
    ]
    .iter()
    .map(|r| format!("{r}={}", inbound(&m, r)))
    .collect();
    let queue_full = metric(
        &m,
        r#"agentmesh_streams_inbound_dropped_total{protocol="/agentmesh/call/1",reason="queue_full"}"#,
    );
    eprintln!(
        "attack: {report:?}; provider inbound: {} queue_full={queue_full}",
        counts.join(" ")
    );
    // The attacker was refused for its share, never served, and every real
    // call was.
    assert!(inbound(&m, "caller_share") >= 1.0, "{m}");
    assert!(
        inbound(&m, "accepted") >= (2 + 2 * CALLS_PER_CALLER) as f64,
        "{m}"
    );
    assert!(report.opened >= SILENT_STREAMS as u64, "{report:?}");
    assert!(report.closed_by_provider >= 1, "{report:?}");
    assert_eq!(
        report.circuits, 1,
        "one circuit held throughout: {report:?}"
    );

    a.shutdown().await;
    b.shutdown().await;
    provider.shutdown().await;
    r.handle.shutdown().await;
}

/// The router's cap of circuits to one destination in the circuits test.
const CIRCUITS_PER_DESTINATION: u32 = 16;

/// Circuits the router refused for lack of room, for a share or at the cap.
fn refused(r: &Router) -> f64 {
    r.refused("circuit", "source", "relay_stop") + r.refused("circuit", "peer", "relay_stop")
}

/// While one member holds every circuit to a provider it can get through
/// their router, other members still reach the provider through it: the
/// router shares the circuits to one destination among the members that ask
/// for them (a member holding some gets another only while it holds fewer
/// than remain free), and counts what it refused the attacker. (Without the
/// share the attacker took all 16 and the others' circuits were denied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_cannot_take_every_circuit_to_a_provider() {
    let cp = start_cp().await;
    let r = start_router_tweaked(
        &cp,
        "r1",
        Duration::from_secs(1),
        "/ip4/127.0.0.1/tcp/0",
        |c| c.resources.circuits_per_destination = CIRCUITS_PER_DESTINATION,
    )
    .await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut base| {
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    ready(&provider, "provider").await;
    let (a, _adir) = spawn_node(&cp, &member, "spawn a", |base| base).await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |base| base).await;
    ready(&a, "a").await;
    ready(&b, "b").await;
    for n in [&a, &b] {
        let mut s = call_until_found(n, "echo").await;
        assert_eq!(exchange(&mut s, b"before").await.expect("echo"), b"before");
    }

    let key = Keypair::generate_ed25519();
    let credential = cp.member_credential(&key).await;
    let attack = CircuitAttack {
        router: r.id(),
        router_addr: r.addr.clone(),
        provider: provider.peer_id(),
        circuits: 2 * CIRCUITS_PER_DESTINATION as usize,
        dials_in_flight: 8,
        renew_pause: Duration::from_millis(100),
        duration: Duration::from_secs(300),
    };
    let progress = Arc::new(CircuitProgress::default());
    let running = {
        let progress = progress.clone();
        tokio::spawn(
            async move { provider_circuits::run(&attack, key, credential, progress).await },
        )
    };
    // The attack bites once the router refuses it a circuit (for its share,
    // or at the cap), and the callers' own circuits from before are gone
    // (closed when idle), so every call below needs a new one.
    eventually("the attacker refused a circuit", || async {
        assert!(!running.is_finished(), "the attack ended early");
        (refused(&r) >= 1.0 && progress.report().held >= 8).then_some(())
    })
    .await;
    for (n, who) in [(&a, "a"), (&b, "b")] {
        let metrics = n.metrics_addr().expect("metrics");
        eventually(&format!("{who}'s circuit from before closed"), || async {
            let (_, m) = http_get(metrics, "/metrics").await;
            let closed = metric(
                &m,
                r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"}"#,
            );
            (closed >= 1.0).then_some(())
        })
        .await;
    }
    // The places those circuits held are the attacker's to take now: wait
    // until it has been refused several more rounds, so it holds all it
    // can get before the calls start.
    let refused_before = refused(&r);
    eventually(
        "the attacker refused again after the callers left",
        || async { (refused(&r) >= refused_before + 20.0).then_some(()) },
    )
    .await;
    eprintln!(
        "circuits through the router before the calls: {}",
        r.metric("agentmesh_router_circuits")
    );

    tokio::join!(calls(&a, "a"), calls(&b, "b"));
    assert!(
        !running.is_finished(),
        "the attack still runs after the calls"
    );
    progress.stop();
    let report = running.await.expect("attack task").expect("attack set-up");
    eprintln!(
        "circuit attack: {report:?}; router refused circuits: source={} peer={}",
        r.refused("circuit", "source", "relay_stop"),
        r.refused("circuit", "peer", "relay_stop")
    );
    assert!(r.refused("circuit", "source", "relay_stop") >= 1.0);
    assert!(report.established >= 8, "{report:?}");

    a.shutdown().await;
    b.shutdown().await;
    provider.shutdown().await;
    r.handle.shutdown().await;
}
