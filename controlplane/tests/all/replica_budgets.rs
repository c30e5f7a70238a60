//! Two `agentmesh-control-plane` processes (the real binary) on one
//! database, on both backends: once each counts the other, the enrollment
//! budget holds for the two together, not for each. A burst of
//! single-attempt enrollments sent to both at once is admitted at most
//! `--enroll-burst + rate × elapsed` in all; two processes each holding
//! the whole budget would admit twice the burst.

use std::time::{Duration, Instant};

use agentmesh_controlplane::{Client, ClientConfig};
use agentmesh_proto::identity::Keypair;

use crate::common::{
    self, TestDb,
    binary::{member_token, serve, until_live_replicas},
};

/// One attempt (a budget too short for any retry): what the budget does
/// to each request is seen.
fn once(url: &str) -> Client {
    Client::new(ClientConfig {
        url: url.to_string(),
        retry_budget: Duration::from_millis(1),
        rpc_timeout: Duration::from_secs(30),
        ca_pem: None,
    })
    .expect("client")
}

async fn enrollment_budget_is_shared_by_the_live_replicas(db: TestDb) {
    const RATE: f64 = 1.0;
    const BURST: usize = 20;
    const PER_REPLICA: usize = BURST;
    let env = db.binary_env();
    let flags = ["--enroll-rate-per-sec", "1", "--enroll-burst", "20"];
    let (a, b) = tokio::join!(serve(db.url(), &flags, &env), serve(db.url(), &flags, &env));
    until_live_replicas(&[&a, &b], 2.0).await;
    let tok = member_token(db.url(), 1000, &env).await;

    let started = Instant::now();
    let mut calls = Vec::new();
    for served in [&a, &b] {
        for _ in 0..PER_REPLICA {
            let (c, tok) = (once(&served.url), tok.clone());
            calls.push(tokio::spawn(async move {
                c.enroll(&tok, &Keypair::generate_ed25519()).await.is_ok()
            }));
        }
    }
    let mut admitted = 0;
    for c in calls {
        admitted += usize::from(c.await.expect("join"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let bound = BURST + (RATE * elapsed).ceil() as usize;
    assert!(admitted >= 1, "the budget admits some");
    assert!(
        admitted <= bound,
        "{admitted} of {} admitted in {elapsed:.1} s: over the whole control plane's \
         --enroll-burst {BURST} + {RATE}/s (2 × the burst would mean each replica held it all)",
        2 * PER_REPLICA
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM nodes").await,
        admitted as i64,
        "every admitted enrollment is a node"
    );
    let mut refused = 0.0;
    for served in [&a, &b] {
        let (_, body) = common::http_get(served.http_addr, "/metrics").await;
        refused += common::metric(
            &body,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"enroll\"}",
        )
        .unwrap_or(0.0);
    }
    assert!(
        refused >= (2 * PER_REPLICA - admitted) as f64,
        "refusals counted: {refused}"
    );
    for served in [a, b] {
        assert!(served.terminate().await.success());
    }
}

on_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    enrollment_budget_is_shared_by_the_live_replicas;
);
