//! A member that holds silent call streams does not take a provider from
//! other callers: a real control plane, a real router, a real provider
//! node and two real caller nodes on loopback, and the hostile harness's
//! `provider_calls` attack (an enrolled member, admitted for transit,
//! holding 320 call streams through a relayed circuit that never send a
//! byte, renewing them as the provider closes them).

use super::support;

use std::sync::Arc;
use std::time::Duration;

use agentmesh_hostile::provider_calls::{self, Attack, Progress};
use agentmesh_node::{Config, NodeHandle};
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
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |base| Config {
        expose: vec![("echo".into(), backend)],
        ..base
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
