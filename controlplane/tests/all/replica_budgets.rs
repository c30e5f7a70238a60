//! Two `agentmesh-control-plane` processes (the real binary) on one
//! database, on both backends: once each counts the other, the enrollment
//! budget holds for the two together, not for each. A burst of
//! single-attempt enrollments sent to both at once is admitted at most
//! `--enroll-burst + rate × elapsed` in all; two processes each holding
//! the whole budget would admit twice the burst. And held for 30 s under
//! enrollments sent to three replicas without pause, PostgreSQL only (how
//! replicas run), the three admit within 10% of `rate × 30 + burst`: the
//! shares add up to the whole budget, neither more nor less.

use std::time::{Duration, Instant};

use agentmesh_controlplane::{Client, ClientConfig};
use agentmesh_proto::identity::Keypair;

use crate::common::{
    self, Backend, TestDb,
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

/// How long the sustained test sends enrollments.
const SUSTAINED: Duration = Duration::from_secs(30);

/// Sends single-attempt enrollments to `url` until `until`, one every
/// 50 ms (far above its share of the budget); returns how many it admitted.
async fn enroll_until(url: String, tok: String, until: Instant) -> usize {
    let c = once(&url);
    let mut admitted = 0;
    while Instant::now() < until {
        if c.enroll(&tok, &Keypair::generate_ed25519()).await.is_ok() {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_the_whole_budget_over_30_s_and_no_more() {
    const RATE: f64 = 2.0;
    // A burst of 10 s of the rate per replica: a loop stalled a few
    // seconds on a loaded machine loses no refill.
    const BURST: f64 = 30.0;
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let env = db.binary_env();
    let flags = ["--enroll-rate-per-sec", "2", "--enroll-burst", "30"];
    let (a, b, c) = tokio::join!(
        serve(db.url(), &flags, &env),
        serve(db.url(), &flags, &env),
        serve(db.url(), &flags, &env)
    );
    until_live_replicas(&[&a, &b, &c], 3.0).await;
    let tok = member_token(db.url(), 10_000, &env).await;
    let started = Instant::now();
    let until = started + SUSTAINED;
    let loops: Vec<_> = [&a, &b, &c]
        .iter()
        .map(|s| tokio::spawn(enroll_until(s.url.clone(), tok.clone(), until)))
        .collect();
    let mut admitted = 0;
    for l in loops {
        admitted += l.await.expect("join");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let whole = RATE * SUSTAINED.as_secs_f64() + BURST;
    let (low, high) = (0.9 * whole, 1.1 * (RATE * elapsed + BURST));
    eprintln!("{admitted} admitted in {elapsed:.1} s (budget {whole})");
    assert!(
        (low..=high).contains(&(admitted as f64)),
        "{admitted} admitted in {elapsed:.1} s by three replicas: not within 10% of \
         {RATE}/s × 30 s + burst {BURST} = {whole}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM nodes").await,
        admitted as i64
    );
    for served in [a, b, c] {
        assert!(served.terminate().await.success());
    }
}
