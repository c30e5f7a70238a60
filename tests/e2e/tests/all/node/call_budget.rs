//! A call returns within its budget (connect + call timeout) however many
//! providers it tries: a real control plane, a real router and real nodes
//! on loopback; the providers expose a backend whose connects hang, so none
//! of them answers a call before the caller gives up on it.

use super::support;

use std::time::Duration;

use agentmesh_node::CallError;
use agentmesh_proto::pb::credential::Role;
use support::*;

/// Providers that never answer, and providers the caller may try per call.
const SILENT_PROVIDERS: usize = 6;
/// The caller's per-step timeouts: its budget is their sum (7 s), and
/// trying every provider with its full call timeout would take 24 s. The
/// connect timeout leaves room for a loaded CI machine: a circuit whose
/// connect runs past it fails as a route failure, not a timeout (a warm
/// CI run saw one at 1 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const CALL_TIMEOUT: Duration = Duration::from_secs(4);

/// `call()` through several providers that never answer gives up when its
/// budget is spent, with a timeout error, instead of giving each provider
/// its full call timeout in turn. (Before the fix the first round had no
/// overall deadline: six silent providers held this call for 24 s.) The
/// outer wait is a hang detector three budgets long, not a measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_silent_providers_returns_within_its_budget() {
    let cp = start_cp().await;
    let router = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = hanging_backend().await;
    let mut providers = Vec::new();
    for i in 0..SILENT_PROVIDERS {
        let (p, dir) = spawn_node(&cp, &member, "spawn provider", |mut base| {
            // The provider waits for the backend far longer than the caller waits for it.
            base.connect_timeout = Duration::from_secs(600);
            base.services.expose = vec![("slow".into(), backend.addr)];
            base
        })
        .await;
        ready(&p, &format!("provider {i}")).await;
        providers.push((p, dir));
    }
    let (caller, _cdir) = spawn_node(&cp, &member, "spawn caller", |mut base| {
        base.connect_timeout = CONNECT_TIMEOUT;
        base.call_timeout = CALL_TIMEOUT;
        base.calls.attempts = SILENT_PROVIDERS;
        base
    })
    .await;
    ready(&caller, "caller").await;

    let budget = CONNECT_TIMEOUT + CALL_TIMEOUT;
    for n in 1..=2 {
        let r = tokio::time::timeout(budget * 3, caller.call("slow")).await;
        let e = match r {
            Err(_) => panic!("call {n} had not returned after three budgets"),
            Ok(Ok(s)) => panic!("call {n} to a silent provider was accepted: {s:?}"),
            Ok(Err(e)) => e,
        };
        assert!(
            matches!(
                e,
                CallError::Failed {
                    timed_out: true,
                    refused: false,
                    ..
                }
            ),
            "call {n}: {e}"
        );
        assert_eq!(e.result_label(), "timeout", "call {n}: {e}");
    }
    let (_, m) = http_get(caller.metrics_addr().expect("metrics"), "/metrics").await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_node_calls_total{direction="outbound",result="timeout"}"#
        ),
        2.0,
        "{m}"
    );
    caller.shutdown().await;
    // The providers still wait for the backend (their connect timeout is
    // long): dropping them aborts those waits.
    drop(providers);
    router.handle.shutdown().await;
}

/// A relay that denies every circuit to the provider at once (here
/// `--circuits-per-destination 0`; in a storm, the router's cap on STOP
/// handshakes in flight) makes the call retry on fresh routes, a bounded
/// number of times (3, the node's `MAX_ROUTE_RETRIES`) with pauses, and then fail
/// with the route's error, well inside its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_denying_circuits_is_retried_three_times_then_the_call_fails() {
    let cp = start_cp().await;
    let router = start_router_tweaked(
        &cp,
        "r1",
        Duration::from_secs(1),
        "/ip4/127.0.0.1/tcp/0",
        |c| c.resources.circuits_per_destination = 0,
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
    let (caller, _cdir) = spawn_node(&cp, &member, "spawn caller", |mut base| {
        base.connect_timeout = CONNECT_TIMEOUT;
        base.call_timeout = CALL_TIMEOUT;
        base
    })
    .await;
    ready(&caller, "caller").await;

    let budget = CONNECT_TIMEOUT + CALL_TIMEOUT;
    // The provider's record may take a moment to reach the catalog.
    let e = loop {
        let r = tokio::time::timeout(budget * 3, caller.call("echo")).await;
        match r {
            Err(_) => panic!("the call had not returned after three budgets"),
            Ok(Ok(s)) => panic!("a circuit the relay denies carried a call: {s:?}"),
            Ok(Err(CallError::NoProviders(_))) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Err(e)) => break e,
        }
    };
    assert!(
        matches!(
            e,
            CallError::Failed {
                refused: false,
                timed_out: false,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.result_label(), "connect_failed", "{e}");
    let (_, m) = http_get(caller.metrics_addr().expect("metrics"), "/metrics").await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_node_call_retries_total{reason="connect_failed"}"#
        ),
        3.0,
        "{m}"
    );
    assert!(
        router.refused("circuit", "peer", "relay_stop") >= 4.0,
        "every attempt reached the relay"
    );
    caller.shutdown().await;
    provider.shutdown().await;
    router.handle.shutdown().await;
}
