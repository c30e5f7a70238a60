//! How a policy change reaches members (issue 18, "Distribution"), with a
//! real control plane, real routers and real nodes:
//!
//! - a member on K = 2 routers is pushed each version by one of them (its
//!   primary); the other only probes it after its fallback delay and sends
//!   no body, since the member holds the version already;
//! - when the primary is gone, the fallback's probe finds the member
//!   lacking the next version and pushes it;
//! - a member that was offline during a change holds the new version as
//!   soon as it is ready again.
//!
//! The nodes poll the directory once an hour here, so every version they
//! learn after starting comes through a router: the counts say which way.
//! The mixed-version step (members that predate the push slot or policies)
//! is `router::policy_push`.

use super::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::controlplane::ApplyPolicyRequest;
use agentmesh_proto::pb::credential::Role;
use support::*;

/// Version 1 and the changes applied after it: each grants a different
/// service, so each is a new version.
fn policy(granted: &str) -> String {
    format!(
        r#"format = 1
[groups]
members = {{ role = "member" }}
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["members"]
to = ["{granted}"]
"#
    )
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("start.toml");
    std::fs::write(&p, text).expect("write policy");
    p
}

/// A control plane started with `policy("v1")`.
async fn cp(dir: &Path) -> Cp {
    let file = write(dir, &policy("v1"));
    start_cp_with(|c| {
        c.policy = Some(file);
        c.policy_allow_all = false;
    })
    .await
}

async fn apply(cp: &Cp, granted: &str) {
    cp.client
        .apply_policy(
            ADMIN,
            ApplyPolicyRequest {
                text: policy(granted),
                dry_run: false,
                author: "policy push test".into(),
            },
        )
        .await
        .expect("policy applied");
}

/// A router whose fallback probes come `FALLBACK` after a change.
const FALLBACK: Duration = Duration::from_millis(1_000);

async fn router(cp: &Cp, name: &str) -> Router {
    start_router_tweaked(
        cp,
        name,
        Duration::from_secs(1),
        "/ip4/127.0.0.1/tcp/0",
        |c| c.policy.push_fallback_delay = FALLBACK,
    )
    .await
}

/// A member on `k` routers that polls the directory only at start.
async fn member(cp: &Cp, k: usize) -> (NodeHandle, tempfile::TempDir) {
    let token = cp.token(Role::Member).await;
    spawn_node(cp, &token, "spawn member", |mut c| {
        c.routers.count = k;
        c.control_plane.directory_interval = Duration::from_secs(3600);
        c
    })
    .await
}

async fn node_metric(node: &NodeHandle, series: &str) -> f64 {
    let text = http_get(node.metrics_addr().expect("metrics addr"), "/metrics")
        .await
        .1;
    metric(&text, series)
}

fn pushes(result: &str) -> String {
    format!("agentmesh_node_policy_pushes_total{{result=\"{result}\"}}")
}

fn decisions(r: &Router, decision: &str) -> f64 {
    r.metric(&format!(
        "agentmesh_router_policy_push_decisions_total{{decision=\"{decision}\"}}"
    ))
}

async fn holds(node: &NodeHandle, version: u64) {
    agentmesh_testkit::eventually(&format!("the member holds version {version}"), || async {
        (node.policy_version().1 >= version).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_two_routers_gets_each_version_once_and_the_fallback_covers_a_dead_primary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp(dir.path()).await;
    let (r1, r2) = (router(&cp, "r1").await, router(&cp, "r2").await);
    let (node, _ndir) = member(&cp, 2).await;
    agentmesh_testkit::eventually("reserved on both routers", || async {
        on_k(&node, &Default::default()).then_some(())
    })
    .await;
    let v1 = node.policy_version().1;
    assert!(v1 >= 1, "the directory or an admission brought version 1");

    // The normal case: one body, from the primary; the fallback's probe
    // finds the version held.
    apply(&cp, "v2").await;
    holds(&node, v1 + 1).await;
    agentmesh_testkit::eventually("the fallback probed", || async {
        (decisions(&r1, "probe_held") + decisions(&r2, "probe_held") >= 1.0).then_some(())
    })
    .await;
    let both = |d: &str| decisions(&r1, d) + decisions(&r2, d);
    assert_eq!(both("pushed"), 1.0, "one router pushed the body");
    assert_eq!(both("probed"), 1.0, "the other probed");
    assert_eq!(both("probe_held"), 1.0);
    assert_eq!(both("fallback"), 0.0, "no second body");
    assert_eq!(node_metric(&node, &pushes("accepted")).await, 1.0);
    assert_eq!(node_metric(&node, &pushes("probe")).await, 1.0);
    assert_eq!(
        node_metric(&node, &pushes("held")).await,
        0.0,
        "no body the member already held"
    );

    // The primary dies: the survivor's probe finds the next version
    // missing and pushes it.
    let (primary, survivor) = if decisions(&r1, "pushed") == 1.0 {
        (r1, r2)
    } else {
        (r2, r1)
    };
    primary.handle.shutdown().await;
    apply(&cp, "v3").await;
    holds(&node, v1 + 2).await;
    assert_eq!(
        decisions(&survivor, "fallback"),
        1.0,
        "pushed as the fallback"
    );
    assert_eq!(decisions(&survivor, "pushed"), 0.0);
    assert_eq!(node_metric(&node, &pushes("accepted")).await, 2.0);
    node.shutdown().await;
    survivor.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_offline_during_a_change_is_current_as_soon_as_it_is_ready_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp(dir.path()).await;
    let r = router(&cp, "r1").await;
    let token = cp.token(Role::Member).await;
    let ndir = tempfile::tempdir().expect("tempdir");
    let config = || {
        let mut c = node_config(&cp, &token, ndir.path());
        c.control_plane.directory_interval = Duration::from_secs(3600);
        c
    };
    let node = agentmesh_node::spawn(config(), None).await.expect("spawn");
    ready(&node, "member").await;
    let before = node.policy_version();
    node.shutdown().await;

    apply(&cp, "while-offline").await;
    agentmesh_testkit::eventually("the router holds the change", || async {
        (r.metric("agentmesh_router_policy_version") > before.1 as f64).then_some(())
    })
    .await;

    // Same identity and data dir, started again: current at readiness.
    let node = agentmesh_node::spawn(config(), None)
        .await
        .expect("respawn");
    ready(&node, "member again").await;
    assert_eq!(
        node.policy_version(),
        (before.0, before.1 + 1),
        "current at once after readiness"
    );
    assert_eq!(
        node_metric(&node, "agentmesh_node_policy_version").await,
        (before.1 + 1) as f64
    );
    node.shutdown().await;
    r.handle.shutdown().await;
}
