//! Three control-plane replicas on one PostgreSQL database, a router and
//! members that know them only as endpoints of one logical URL; each
//! replica is SIGKILLed in turn (and started again) while a load enrolls
//! and refreshes without pause, the members poll the directory every
//! second and refresh their short credentials, and the router leases and
//! watches. Nothing any of them sees is an error: every call a killed
//! replica dropped was retried on another (the router's and members'
//! failure counters stay at 0, the load counts no error, calls keep
//! going). Then a policy applied through one replica the router does not
//! watch, and a token revoked through the other, reach the router through
//! its watch, with no directory poll in between to carry them; and the
//! signing key rotated on its deadlines while replicas died, one key per
//! deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::controlplane::ApplyPolicyRequest;
use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{ADMIN, DEADLINE, echo_backend, eventually, http_get, metric, spawn_ready};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use super::load::Load;
use super::set::{LOGICAL_URL, Replicas};

/// Credentials live 24 s, so members and the router refresh (at two
/// thirds of that) while replicas are killed.
const CREDENTIAL_TTL_SECS: &str = "24";

/// A key rotation deadline every 15 s, checked every second by each replica.
const ROTATION_SECS: i64 = 15;

/// The router leases (and reads the directory) every 30 s: long enough
/// that a change it takes between two rounds can only have come by its
/// watch.
const ROUTER_LEASE: Duration = Duration::from_secs(30);

fn replica_args() -> Vec<String> {
    let rotation = ROTATION_SECS.to_string();
    [
        "--policy-allow-all",
        "--credential-ttl-secs",
        CREDENTIAL_TTL_SECS,
        "--key-rotation-interval-secs",
        &rotation,
        "--key-publish-ahead-secs",
        "5",
        "--key-check-interval-secs",
        "1",
        "--lease-ttl-secs",
        "90",
        // The load enrolls about 4 a second: well within this, shared by three.
        "--enroll-rate-per-sec",
        "30",
        "--enroll-burst",
        "30",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A policy other than the allow-all the replicas started with: members
/// provide anything and call `echo`.
const POLICY: &str = r#"format = 1
[groups]
members = { role = "member" }
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["members"]
to = ["echo"]
"#;

const WATCHERS: &str = "agentmesh_control_plane_watchers";
const LEASE_OK: &str = "agentmesh_router_lease_total{result=\"ok\"}";
const DIRECTORY_OK: &str = "agentmesh_router_directory_sync_total{result=\"ok\"}";
const ATTACHED: &str = "agentmesh_router_attached_members";
const POLICY_VERSION: &str = "agentmesh_router_policy_version";
const DIRECTORY_READ: &str = "agentmesh_node_control_plane_total{op=\"directory\",result=\"ok\"}";
const APPLIED_BY_WATCH: &str = "agentmesh_router_policy_applied_total{source=\"watch\"}";

/// A member of `token` that knows the replicas as endpoints (K = 1, a
/// directory poll every second), exposing `echo` on `backend` if given.
async fn member(
    set: &Replicas,
    token: &str,
    backend: Option<std::net::SocketAddr>,
) -> (NodeHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = agentmesh_node::Config {
        data_dir: dir.path().to_path_buf(),
        metrics_addr: Some("127.0.0.1:0".parse().expect("addr")),
        control_plane: agentmesh_node::config::ControlPlaneConfig {
            url: LOGICAL_URL.to_string(),
            endpoints: set.endpoints(),
            token: token.to_string(),
            directory_interval: Duration::from_secs(1),
            ..Default::default()
        },
        routers: agentmesh_node::config::RoutersConfig {
            count: 1,
            ..Default::default()
        },
        services: agentmesh_node::config::ServicesConfig {
            expose: backend
                .map(|b| ("echo".to_string(), b))
                .into_iter()
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let node = agentmesh_node::spawn(config, None).await.expect("member");
    eventually("the member is ready", || async {
        node.is_ready().then_some(())
    })
    .await;
    (node, dir)
}

/// One echo call from `caller` (retried until the provider is found).
async fn echo(caller: &NodeHandle) {
    let mut s = eventually("a call to echo", || async {
        caller.call("echo").await.ok()
    })
    .await;
    s.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut buf))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&buf, b"ping");
}

/// `series` in a member's metrics.
async fn node_metric(node: &NodeHandle, series: &str) -> f64 {
    let (_, text) = http_get(node.metrics_addr().expect("metrics"), "/metrics").await;
    metric(&text, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_killed_in_turn_costs_members_and_the_router_only_retries() {
    let args = replica_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let Some(mut set) = Replicas::start(3, &args).await else {
        return;
    };
    let name: BTreeMap<String, String> = [("name".to_string(), "r1".to_string())].into();
    let (router_token, _) = set.token(Role::Router, &name, 10).await;
    let (members_token, _) = set.token(Role::Member, &BTreeMap::new(), 1000).await;
    let (victim_token, victim_token_id) = set.token(Role::Member, &BTreeMap::new(), 10).await;
    let router_dir = tempfile::tempdir().expect("tempdir");
    let router = spawn_ready(agentmesh_router::Config {
        control_plane: agentmesh_router::config::ControlPlaneConfig {
            url: LOGICAL_URL.to_string(),
            endpoints: set.endpoints(),
            token: router_token,
            lease_interval: ROUTER_LEASE,
            clock_skew: Duration::ZERO,
            ..Default::default()
        },
        key_path: router_dir.path().join("router.key"),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
        labels: name,
        ..Default::default()
    })
    .await;
    let rmetric = |series: &str| metric(&router.metrics_text(), series);
    let backend = echo_backend().await;
    let (provider, _pdir) = member(&set, &members_token, Some(backend)).await;
    let (caller, _cdir) = member(&set, &members_token, None).await;
    let (victim, _vdir) = member(&set, &victim_token, None).await;
    echo(&caller).await;

    // Each replica SIGKILLed in turn under the load, then started again.
    let load = Load::start(set.client(), members_token.clone());
    let members = [
        (&provider, "provider"),
        (&caller, "caller"),
        (&victim, "victim"),
    ];
    for i in 0..set.all.len() {
        set.kill(i).await;
        // While it is down: the load enrolls, every member reads the
        // directory (each second) through the others, calls go on.
        let before = load.enrolled();
        eventually(
            &format!("enrollments go on without replica {i}"),
            || async { (load.enrolled() >= before + 5).then_some(()) },
        )
        .await;
        for (node, what) in members {
            let read = node_metric(node, DIRECTORY_READ).await;
            eventually(
                &format!("{what} reads the directory without replica {i}"),
                || async { (node_metric(node, DIRECTORY_READ).await >= read + 3.0).then_some(()) },
            )
            .await;
        }
        echo(&caller).await;
        set.restart(i).await;
    }
    let enrolled = load.enrolled();
    let errors = load.stop().await.errors;
    assert!(errors.is_empty(), "the load saw errors: {errors:?}");
    assert!(enrolled >= 15, "{enrolled} enrollments");

    // Members: every control-plane call they made succeeded (retries
    // aside), and each refreshed its credential while replicas died.
    for (node, what) in members {
        for op in ["enroll", "refresh", "directory"] {
            let series =
                format!("agentmesh_node_control_plane_total{{op=\"{op}\",result=\"error\"}}");
            assert_eq!(node_metric(node, &series).await, 0.0, "{what}: {series}");
        }
        let refreshed = "agentmesh_node_control_plane_total{op=\"refresh\",result=\"ok\"}";
        eventually(&format!("{what} refreshed"), || async {
            (node_metric(node, refreshed).await >= 1.0).then_some(())
        })
        .await;
        assert!(node.is_ready(), "{what} is not ready");
    }
    // The router: no lease, directory read or key fetch failed.
    for series in ["lease", "directory_sync", "key_fetch"] {
        let series = format!("agentmesh_router_{series}_total{{result=\"error\"}}");
        assert_eq!(rmetric(&series), 0.0, "router: {series}");
    }

    // A policy and a revocation through replicas the router does not
    // watch, sent right after a lease round (the next one, and its
    // directory read, are ~30 s away).
    let watched = eventually("the router's watch is open on one replica", || async {
        let mut on = Vec::new();
        for i in 0..set.all.len() {
            if set.metric(i, WATCHERS).await == 1.0 {
                on.push(i);
            }
        }
        (on.len() == 1).then(|| on[0])
    })
    .await;
    let (other, third) = ((watched + 1) % 3, (watched + 2) % 3);
    let leases = rmetric(LEASE_OK);
    eventually("a lease round", || async {
        (rmetric(LEASE_OK) > leases).then_some(())
    })
    .await;
    let (directory_reads, by_watch) = (rmetric(DIRECTORY_OK), rmetric(APPLIED_BY_WATCH));
    let applied = set
        .client_of(&[set.all[other].endpoint()])
        .apply_policy(
            ADMIN,
            ApplyPolicyRequest {
                text: POLICY.to_string(),
                dry_run: false,
                author: "replica test".into(),
            },
        )
        .await
        .expect("policy applied through an unwatched replica");
    assert!(applied.applied, "{applied:?}");
    let sent = Instant::now();
    eventually("the router holds the new policy", || async {
        (rmetric(POLICY_VERSION) == applied.version as f64).then_some(())
    })
    .await;
    let policy_took = sent.elapsed();
    assert_eq!(
        rmetric(APPLIED_BY_WATCH),
        by_watch + 1.0,
        "taken by the watch"
    );
    set.client_of(&[set.all[third].endpoint()])
        .revoke_token(ADMIN, &victim_token_id, "leaked")
        .await
        .expect("token revoked through another unwatched replica");
    let sent = Instant::now();
    eventually("the router drops the revoked member", || async {
        (rmetric(ATTACHED) == 2.0).then_some(())
    })
    .await;
    let revocation_took = sent.elapsed();
    assert_eq!(
        rmetric(DIRECTORY_OK),
        directory_reads,
        "no directory read carried the policy or the revocation"
    );
    eprintln!(
        "watched replica {watched}; policy through {other} taken in {policy_took:?}, \
         revocation through {third} in {revocation_took:?}"
    );
    echo(&caller).await;

    // One key per rotation deadline: keys made for the same deadline by
    // two replicas would be published seconds apart, not a period.
    let keys = set.client().get_keys().await.expect("keys");
    let mut from: Vec<i64> = keys.keys.iter().map(|k| k.active_from_unix_secs).collect();
    from.sort_unstable();
    eprintln!("signing keys active from {from:?}");
    assert!(from.len() >= 2, "no rotation during the test: {from:?}");
    for pair in from.windows(2) {
        assert!(
            pair[1] - pair[0] > ROTATION_SECS / 2,
            "two keys for one rotation deadline: {from:?}"
        );
    }
    drop(victim);
}
