//! The router's control-plane Watch across two control-plane replicas on
//! one database (in process, one SQLite file, one logical public URL
//! that resolves nowhere: the router dials the replicas' own addresses).
//! The replica holding the watch stops as SIGTERM stops it
//! (`Handle::shutdown`): the router watches again on the other one at
//! once, counting one `stopping` end and no failure of any kind
//! (`agentmesh_router_policy_watch_ends_total{reason}`), stays ready, and
//! a policy applied afterwards reaches it through the moved watch.

use crate::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_router::Config;
use support::cp::{Cp, start_cp_with};
use support::{eventually, http_get, metric, spawn_ready};

const LOGICAL: &str = "http://agentmesh-control-plane.invalid:7400";

/// A replica on the SQLite file in `dir`, serving the logical URL.
async fn replica(dir: &std::path::Path) -> Cp {
    let db = format!("sqlite://{}", dir.join("cp.db").display());
    start_cp_with(|c| {
        c.db = db;
        c.public_url = Some(LOGICAL.into());
    })
    .await
}

/// Watch streams `cp` holds open now.
async fn watchers(cp: &Cp) -> f64 {
    let (_, body) = http_get(cp.handle.http_addr(), "/metrics").await;
    metric(&body, "agentmesh_control_plane_watchers")
}

fn watch_ends(router: &agentmesh_router::RouterHandle, reason: &str) -> f64 {
    metric(
        &router.metrics_text(),
        &format!("agentmesh_router_policy_watch_ends_total{{reason=\"{reason}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_moves_the_routers_watch_without_an_error() {
    let db_dir = tempfile::tempdir().expect("tempdir");
    let mut replicas = vec![replica(db_dir.path()).await, replica(db_dir.path()).await];
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config {
        key_path: dir.path().join("router.key"),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
        control_plane: agentmesh_router::config::ControlPlaneConfig {
            url: LOGICAL.into(),
            endpoints: replicas.iter().map(Cp::endpoint).collect(),
            token: replicas[0].token(Role::Router).await,
            // No directory poll during the test: a policy can only come
            // through the watch.
            lease_interval: Duration::from_secs(600),
            clock_skew: Duration::ZERO,
            retry_budget: Duration::from_secs(10),
            ..Default::default()
        },
        ..Default::default()
    };
    let router = spawn_ready(config).await;
    // The router's rotation starts at a random replica: find the holder.
    let held = eventually("the router's watch on a replica", || async {
        let on: Vec<f64> = vec![watchers(&replicas[0]).await, watchers(&replicas[1]).await];
        let up = metric(&router.metrics_text(), "agentmesh_router_policy_watch_up") == 1.0;
        match on.as_slice() {
            [a, b] if up && a + b == 1.0 => Some(if *a == 1.0 { 0 } else { 1 }),
            _ => None,
        }
    })
    .await;
    let stopping = replicas.remove(held);
    let other = replicas.pop().expect("the other replica");
    stopping.handle.shutdown().await;

    eventually("the watch moved to the other replica", || async {
        let moved = watch_ends(&router, "stopping") == 1.0
            && metric(&router.metrics_text(), "agentmesh_router_policy_watch_up") == 1.0
            && watchers(&other).await == 1.0;
        moved.then_some(())
    })
    .await;
    let taken = |source: &str| {
        metric(
            &router.metrics_text(),
            &format!("agentmesh_router_policy_applied_total{{source=\"{source}\"}}"),
        )
    };
    let (by_watch, by_directory) = (taken("watch"), taken("directory"));
    let applied = other
        .handle
        .apply_policy(&format!(
            "# after the move\n{}",
            agentmesh_policy::ALLOW_ALL
        ))
        .await
        .expect("applies")
        .version();
    eventually("the policy through the moved watch", || async {
        (metric(&router.metrics_text(), "agentmesh_router_policy_version") == applied as f64)
            .then_some(())
    })
    .await;
    assert_eq!(taken("watch"), by_watch + 1.0, "taken from the moved watch");
    assert_eq!(taken("directory"), by_directory);
    for reason in [
        "max_age",
        "connection_lost",
        "refused",
        "ended",
        "open_failed",
    ] {
        assert_eq!(watch_ends(&router, reason), 0.0, "{reason}");
    }
    assert_eq!(watch_ends(&router, "stopping"), 1.0);
    assert!(*router.ready().borrow(), "the router stays ready");
    router.shutdown().await;
    other.handle.shutdown().await;
}
