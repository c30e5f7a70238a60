//! Relayed connections to a provider close soon after the last call on
//! them (`--relayed-idle-secs`), on the caller's side and, as a backstop,
//! on the provider's: a real control plane, a real router and two real
//! nodes on loopback. The nodes' general idle timeout is set far beyond the
//! deadline, so only the relayed-idle close can empty the router's circuits.
//! Waits are on conditions with a generous deadline.

use super::support;

use std::time::Duration;

use agentmesh_node::{Config, NodeHandle};
use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{
    Cp, DEADLINE, TestRouter, echo_backend, eventually, http_get, metric, start_cp,
};

const CIRCUITS: &str = "agentmesh_router_circuits";

async fn node(cp: &Cp, adjust: impl FnOnce(Config) -> Config) -> (NodeHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = adjust(Config {
        data_dir: dir.path().to_path_buf(),
        metrics_addr: Some("127.0.0.1:0".parse().expect("addr")),
        control_plane: agentmesh_node::config::ControlPlaneConfig {
            url: cp.url.clone(),
            token: cp.token(Role::Member).await,
            directory_interval: Duration::from_secs(1),
            ..Default::default()
        },
        routers: agentmesh_node::config::RoutersConfig {
            count: 1,
            ..Default::default()
        },
        connections: agentmesh_node::config::ConnectionConfig {
            // Far beyond the deadline: only the relayed-idle close can act.
            idle: Duration::from_secs(3600),
            ..Default::default()
        },
        ..Config::default()
    });
    let n = agentmesh_node::spawn(config, None).await.expect("spawn");
    assert!(
        n.wait_ready(DEADLINE).await,
        "not ready: {:?}",
        n.status().borrow()
    );
    (n, dir)
}

async fn metrics(n: &NodeHandle) -> String {
    http_get(n.metrics_addr().expect("metrics"), "/metrics")
        .await
        .1
}

/// A provider behind one router and a caller attached to it.
type Setup = (
    Cp,
    TestRouter,
    NodeHandle,
    NodeHandle,
    Vec<tempfile::TempDir>,
);

async fn setup(caller_idle_secs: u64, provider_idle_secs: u64) -> Setup {
    setup_with(caller_idle_secs, provider_idle_secs, |_| {}).await
}

/// As [`setup`], the router's config changed by `router` first.
async fn setup_with(
    caller_idle_secs: u64,
    provider_idle_secs: u64,
    router: impl FnOnce(&mut agentmesh_router::Config),
) -> Setup {
    let cp = start_cp().await;
    let r = TestRouter::start(&cp, &[("name", "r")], router).await;
    let backend = echo_backend().await;
    let (p, pd) = node(&cp, |mut c| {
        c.services.expose = vec![("echo".into(), backend)];
        c.connections.relayed_idle = Duration::from_secs(provider_idle_secs);
        c
    })
    .await;
    let (c, cd) = node(&cp, |mut c| {
        c.connections.relayed_idle = Duration::from_secs(caller_idle_secs);
        c
    })
    .await;
    (cp, r, p, c, vec![pd, cd])
}

async fn call(c: &NodeHandle) -> agentmesh_node::CallStream {
    eventually("a call to echo succeeds", || async {
        c.call("echo").await.ok()
    })
    .await
}

/// The caller closes its circuit to the provider once the last call on it
/// ended and the relayed idle time passed; while a call is open the
/// circuit is reused by the next calls, and after the close a new call
/// opens a new circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_closes_its_circuit_after_the_last_call() {
    // Provider side off: only the caller can close.
    let (_cp, r, p, c, _dirs) = setup(1, 0).await;
    let accepted_before = r.metric(r#"agentmesh_router_circuit_requests_total{result="accepted"}"#);
    let mut first = call(&c).await;
    support::round_trip(&mut first, 4096).await;
    // Two more calls while the first is still held: same circuit.
    for _ in 0..2 {
        let mut s = c
            .call("echo")
            .await
            .expect("call while the circuit is open");
        support::round_trip(&mut s, 4096).await;
    }
    assert_eq!(
        r.metric(CIRCUITS),
        1.0,
        "one circuit carries all three calls"
    );
    let accepted = r.metric(r#"agentmesh_router_circuit_requests_total{result="accepted"}"#);
    assert_eq!(accepted - accepted_before, 1.0, "calls reused the circuit");
    drop(first);
    eventually("the router has no circuit left", || async {
        (r.metric(CIRCUITS) == 0.0).then_some(())
    })
    .await;
    let m = metrics(&c).await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"}"#
        ),
        1.0,
        "{m}"
    );
    let pm = metrics(&p).await;
    assert_eq!(
        metric(
            &pm,
            r#"agentmesh_node_relayed_idle_closed_total{direction="inbound"}"#
        ),
        0.0,
        "{pm}"
    );
    // A later call works on a new circuit, which closes again after it.
    let mut again = c.call("echo").await.expect("call after the close");
    support::round_trip(&mut again, 4096).await;
    drop(again);
    eventually("the second circuit closes too", || async {
        let m = metrics(&c).await;
        (r.metric(CIRCUITS) == 0.0
            && metric(
                &m,
                r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"}"#,
            ) == 2.0)
            .then_some(())
    })
    .await;
    c.shutdown().await;
    p.shutdown().await;
    r.handle.shutdown().await;
}

/// A caller that never closes (relayed idle off, idle timeout an hour)
/// cannot hold the provider's circuit: the provider closes it after twice
/// its relayed idle time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_closes_a_circuit_its_caller_keeps() {
    let (_cp, r, p, c, _dirs) = setup(0, 1).await;
    let mut s = call(&c).await;
    support::round_trip(&mut s, 4096).await;
    drop(s);
    eventually("the router has no circuit left", || async {
        (r.metric(CIRCUITS) == 0.0).then_some(())
    })
    .await;
    let pm = metrics(&p).await;
    assert_eq!(
        metric(
            &pm,
            r#"agentmesh_node_relayed_idle_closed_total{direction="inbound"}"#
        ),
        1.0,
        "{pm}"
    );
    // The caller still calls fine afterwards.
    let mut s = tokio::time::timeout(Duration::from_secs(60), call(&c))
        .await
        .expect("call after the provider closed");
    support::round_trip(&mut s, 4096).await;
    c.shutdown().await;
    p.shutdown().await;
    r.handle.shutdown().await;
}

/// A router at its circuits-per-destination cap refuses a second caller's
/// circuit: that caller gets an error naming the router, the provider and
/// the reason. Once the first caller's call ends and its circuit closes
/// after the relayed idle time, the second caller gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_circuit_is_a_clear_error_and_frees_up_after_the_idle_close() {
    let (cp, r, p, a, mut dirs) = setup_with(1, 0, |c| {
        c.resources.circuits_per_destination = 1;
    })
    .await;
    let (b, bd) = node(&cp, |mut c| {
        c.connections.relayed_idle = Duration::from_secs(1);
        c
    })
    .await;
    dirs.push(bd);
    let mut held = call(&a).await;
    support::round_trip(&mut held, 4096).await;
    assert_eq!(r.metric(CIRCUITS), 1.0);
    let err = b
        .call("echo")
        .await
        .expect_err("a second circuit to the provider is over the cap");
    let text = err.to_string();
    eprintln!("second caller: {text}");
    assert_eq!(err.result_label(), "connect_failed", "{text}");
    assert!(
        text.contains("could not carry a call to provider")
            && text.contains(&r.id().to_string())
            && text.contains(&p.peer_id().to_string()),
        "unclear error: {text}"
    );
    drop(held);
    // A's circuit closes after its relayed idle time; then B gets through.
    let mut s = call(&b).await;
    support::round_trip(&mut s, 4096).await;
    drop(s);
    for n in [a, b, p] {
        n.shutdown().await;
    }
    r.handle.shutdown().await;
}
