//! The database under pressure, against a real control plane on loopback,
//! on both backends: a write lock held by another connection fails calls at
//! `--db-wait-timeout-secs` with UNAVAILABLE + retry-after (counted) while
//! reads go on, and a reaper backlog is deleted in `--reap-batch-rows`
//! transactions.

use std::time::Duration;

use crate::common::{self, ADMIN, TestDb, http_get, metric, metrics};
use agentmesh_controlplane::{retry_after, spawn};
use agentmesh_proto::pb::{
    controlplane::CreateTokenRequest,
    credential::{Role, TokenKind},
};
use tonic::Code;

fn create_token_request() -> tonic::Request<CreateTokenRequest> {
    let mut req = tonic::Request::new(CreateTokenRequest {
        kind: TokenKind::Bootstrap as i32,
        role: Role::Member as i32,
        labels: vec![],
        max_uses: 1,
        ttl_secs: 3600,
    });
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN}").parse().expect("ascii"),
    );
    req
}

async fn a_write_lock_held_elsewhere_fails_writes_at_the_deadline_while_reads_go_on(db: TestDb) {
    let mut cfg = db.config();
    cfg.db_wait_timeout_secs = 1;
    let h = spawn(cfg).await.expect("starts");
    let mut raw = common::raw_client_from(&h, [127, 0, 0, 1]).await;
    let sample = |m: &str, s: &str| metric(m, s).expect("pre-created");
    let busy = "agentmesh_control_plane_limiter_refusals_total{limiter=\"db_busy\"}";
    // The background writes (the replica heartbeat, the reaper's duty)
    // may time out on the lock too: at least one wait, never exactly.
    let lock_waits = |m: &str| -> f64 {
        db.lock_waits()
            .iter()
            .map(|w| {
                sample(
                    m,
                    &format!("agentmesh_control_plane_db_wait_timeouts_total{{wait=\"{w}\"}}"),
                )
            })
            .sum()
    };
    let before = metrics(&h).await;

    // Another process (a second replica, `token create`, an operator's
    // sqlite3 or psql) holds the write lock longer than the timeout.
    let other = db.hold_write_lock().await;
    let refused = raw
        .create_token(create_token_request())
        .await
        .expect_err("refused while the database is locked");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("database busy"), "{refused:?}");
    assert_eq!(retry_after(&refused), Some(Duration::from_secs(1)));
    // Reads go on meanwhile (SQLite: their own connections, and WAL).
    let (status, body) = http_get(h.http_addr(), "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let after = metrics(&h).await;
    assert_eq!(sample(&after, busy), sample(&before, busy) + 1.0);
    assert!(
        lock_waits(&after) >= lock_waits(&before) + 1.0,
        "the refused write waited for the lock"
    );

    other.release().await;
    raw.create_token(create_token_request())
        .await
        .expect("writes again once the lock is gone");
    h.shutdown().await;
}

async fn a_backlog_is_reaped_in_batches_of_reap_batch_rows(db: TestDb) {
    let mut cfg = db.config();
    cfg.reap_batch_rows = 10;
    let h = spawn(cfg).await.expect("starts");
    let batches = "agentmesh_control_plane_reap_batches_total";
    let lapsed = "agentmesh_control_plane_deleted_total{table=\"nodes\",reason=\"lapsed\"}";
    let expired =
        "agentmesh_control_plane_deleted_total{table=\"enrollment_requests\",reason=\"expired\"}";
    let before = metrics(&h).await;
    // 5 nodes and 20 enrollment records, all long stale (as after an outage).
    for n in 0..5u8 {
        db.exec(&format!(
            "INSERT INTO nodes (node_id, peer_id, role, token_kind, token_id, labels,
                                enrolled_at, last_seen, cred_expires_at)
             VALUES ('n-{n}', {}, 1, 1, 't', '{{}}', 1, 1, 0)",
            db.blob(&[n; 38])
        ))
        .await;
    }
    db.exec(
        "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < 20)
         INSERT INTO enrollment_requests (source, outcome, at) SELECT 'test', 'enrolled', 1 FROM i",
    )
    .await;

    let deleted = h.reap_now().await.expect("reap");
    let got = |t: &str, r: &str| {
        deleted
            .iter()
            .find(|(a, b, _)| (*a, *b) == (t, r))
            .map(|x| x.2)
    };
    assert_eq!(got("nodes", "lapsed"), Some(5));
    assert_eq!(got("enrollment_requests", "expired"), Some(20));
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM enrollment_requests").await,
        0
    );
    let after = metrics(&h).await;
    let delta = |s: &str| metric(&after, s).expect("after") - metric(&before, s).expect("before");
    // 25 rows at 10 a transaction: ceil(25 / 10) = 3 (the first takes all 5
    // nodes and 5 records).
    assert_eq!(delta(batches), 3.0);
    assert_eq!(delta(lapsed), 5.0);
    assert_eq!(delta(expired), 20.0);
    assert_eq!(
        metric(
            &after,
            "agentmesh_control_plane_storage_rows{table=\"nodes\"}"
        ),
        Some(0.0)
    );
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    a_write_lock_held_elsewhere_fails_writes_at_the_deadline_while_reads_go_on,
    a_backlog_is_reaped_in_batches_of_reap_batch_rows,
);
