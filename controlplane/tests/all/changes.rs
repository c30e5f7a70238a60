//! Change fan-out between two control planes on one PostgreSQL database:
//! a policy applied and a key rotated through one reach the other as they
//! commit (LISTEN/NOTIFY), with both polls set far beyond the test's
//! deadline so only the notifications can carry them; and after the
//! listeners' connections are killed on the server they reconnect and the
//! next change still arrives.

use std::time::Duration;

use agentmesh_controlplane::{Handle, spawn};
use agentmesh_policy::ALLOW_ALL;
use agentmesh_proto::pb::controlplane::ApplyPolicyRequest;

use crate::common::{self, ADMIN, Backend, TestDb, client};

/// Far below both polls (an hour, a minute).
const WAIT: Duration = Duration::from_secs(20);

fn revision(n: u32) -> ApplyPolicyRequest {
    ApplyPolicyRequest {
        text: format!("# revision {n}\n{ALLOW_ALL}"),
        dry_run: false,
        author: "tester".into(),
    }
}

async fn metric(h: &Handle, name: &str) -> Option<f64> {
    common::metric(&common::metrics(h).await, name)
}

/// Waits (bounded) until `h`'s metric `name` reads `want`.
async fn until_metric(h: &Handle, name: &str, want: f64, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(h, name).await != Some(want) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_changes_reach_the_other_replica_as_they_commit() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let mut cfg = db.config();
    cfg.policy_check_interval_ms = 3_600_000;
    cfg.key_check_interval_secs = 60;
    let a = spawn(cfg.clone()).await.expect("first");
    let b = spawn(cfg).await.expect("second");
    for h in [&a, &b] {
        until_metric(
            h,
            "agentmesh_control_plane_change_listener_up",
            1.0,
            "listening",
        )
        .await;
    }
    let (ca, cb) = (client(&a), client(&b));

    // A policy applied through a reaches b.
    let r = ca
        .apply_policy(ADMIN, revision(1))
        .await
        .expect("applies on a");
    until_metric(
        &b,
        "agentmesh_control_plane_policy_version ",
        r.version as f64,
        "the policy on b",
    )
    .await;

    // A key rotated through a is served by b.
    let rotated = ca.rotate_key_now(ADMIN).await.expect("rotates on a");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let keys = cb.get_keys().await.expect("b's keys");
        if keys.keys.iter().any(|k| k.key_id == rotated.key_id) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b never served the new key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(
            &b,
            "agentmesh_control_plane_change_notifications_total{kind=\"keys\"}"
        )
        .await
        .is_some_and(|n| n >= 1.0)
    );

    // The server ends both listeners' sessions; each reconnects (and
    // re-reads), and the next change still arrives.
    let killed = db
        .count(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE query = 'LISTEN agentmesh_changes' AND datname = current_database()",
        )
        .await;
    assert_eq!(killed, 2, "one listener per replica");
    let r = ca
        .apply_policy(ADMIN, revision(2))
        .await
        .expect("applies on a");
    until_metric(
        &b,
        "agentmesh_control_plane_policy_version ",
        r.version as f64,
        "the policy on b after the listener was killed",
    )
    .await;
    until_metric(
        &b,
        "agentmesh_control_plane_change_listener_up",
        1.0,
        "listening again",
    )
    .await;
    a.shutdown().await;
    b.shutdown().await;
}
