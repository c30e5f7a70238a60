//! The PostgreSQL server under two replicas stopped as `pg_ctl stop -m
//! immediate` does (no checkpoint: the next start replays its WAL, as
//! after a crash or a failover) and started again two seconds later, in
//! the middle of enrollments and refreshes: the callers see retries only,
//! never an error; every enrollment and refresh a replica acknowledged is
//! still there afterwards (each acknowledged credential refreshes, which
//! the control plane refuses for a node it does not hold); and neither
//! replica's `/readyz` turned unready for the blip (a replica is unready
//! only after its database failed for `--db-unready-after-secs`, 10 s by
//! default, so one short outage does not take every replica out of the
//! Service at once).
//!
//! The server is the test's own (the shared one of `.ci/postgres.sh`
//! serves other tests): started from the PostgreSQL binaries, as root
//! under the `postgres` user. Where PostgreSQL is required (CI) and its
//! binaries are missing, the test fails; elsewhere it notes that it did
//! not run.

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_controlplane::store::testing;
use agentmesh_ladder::postgres::{Postgres, unavailable};
use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{DEADLINE, eventually};

use super::load::Load;
use super::set::Replicas;

/// How long the server stays down.
const DOWN: Duration = Duration::from_secs(2);

/// Samples both replicas' `/readyz` every 100 ms until `stop` says so;
/// returns the samples that were not 200.
async fn readiness_while(
    set: &Replicas,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<String> {
    let mut unready = Vec::new();
    while !*stop.borrow() {
        for i in 0..set.all.len() {
            let status = set.readyz(i).await;
            if status != Some(200) {
                unready.push(format!("replica {i}: {status:?}"));
            }
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    unready
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_enrollments_costs_retries_and_loses_no_acknowledged_write() {
    if let Some(why) = unavailable(None) {
        assert!(
            !testing::required(),
            "PostgreSQL is required here and cannot run: {why}"
        );
        eprintln!("note: the PostgreSQL restart test did not run: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pg = Postgres::start(None, &dir.path().join("postgres.log"), DEADLINE)
        .await
        .expect("a PostgreSQL server of the test's own");
    let args = [
        "--policy-allow-all",
        "--enroll-rate-per-sec",
        "30",
        "--enroll-burst",
        "30",
    ];
    let set = Replicas::start_on(pg.url(), pg.env(), 2, &args).await;
    let (token, _) = set.token(Role::Member, &BTreeMap::new(), 1000).await;
    let load = Load::start(set.client(), token);
    eventually("enrollments under way", || async {
        (load.enrolled() >= 5).then_some(())
    })
    .await;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (unready, restarted) = tokio::join!(readiness_while(&set, stopped), async {
        let before = load.enrolled();
        let r = pg.restart_immediate(DOWN, DEADLINE).await;
        // The load carries on past the restart before sampling ends.
        eventually("enrollments after the restart", || async {
            (load.enrolled() >= before + 10).then_some(())
        })
        .await;
        let _ = stop.send(true);
        r
    });
    restarted.expect("the server restarted");
    let outcome = load.stop().await;
    assert!(
        outcome.errors.is_empty(),
        "errors reached the callers: {:?}",
        outcome.errors
    );
    assert!(
        unready.is_empty(),
        "a replica turned unready for the blip: {unready:?}"
    );
    assert!(outcome.acked.len() >= 15, "{} acked", outcome.acked.len());
    let client = set.client();
    for (key, cred) in &outcome.acked {
        client
            .refresh(cred, key)
            .await
            .expect("an acknowledged enrollment is still held");
    }
    // The outage reached callers as UNAVAILABLE (which they retried),
    // never as INTERNAL (which no client retries).
    let mut answers = Vec::new();
    for i in 0..set.all.len() {
        answers.extend(set.series(i, "agentmesh_control_plane_rpc_total{").await);
    }
    let count = |code: &str| -> f64 {
        answers
            .iter()
            .filter(|l| l.contains(&format!("code=\"{code}\"")))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert!(count("Unavailable") >= 1.0, "{answers:#?}");
    assert_eq!(count("Internal"), 0.0, "{answers:#?}");
    eprintln!(
        "{} enrollments acknowledged across the restart, every one held; {} calls answered \
         UNAVAILABLE during it and retried",
        outcome.acked.len(),
        count("Unavailable")
    );
    drop(set);
    pg.stop().await;
}
