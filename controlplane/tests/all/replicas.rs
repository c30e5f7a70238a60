//! Several `agentmesh-control-plane` processes (the real binary) on one
//! database, watched by router-like watchers ([`Watcher`]: a real client
//! over every replica holding a Watch as a router does):
//!
//! - a replica stopped with SIGTERM first ends its watches with a "move"
//!   status; each watch opens again on the other replica at its first
//!   attempt (the client avoids the stopping one), no open fails and no
//!   error ends a watch, and a policy applied afterwards still arrives
//!   (both backends);
//! - watches that all opened on the one replica that answered (the two
//!   others frozen with SIGSTOP, as replicas not up yet) spread over the
//!   three after one `--watch-max-age-secs`: each watcher's next watch goes
//!   to the next replica of its own rotation, and with rotations starting
//!   at 0..6 exactly two land on each; a policy applied while they move
//!   reaches every one (PostgreSQL: a frozen SQLite process may hold the
//!   file's write lock).
//!
//! - a replica frozen with SIGSTOP under an open watch (a half-open
//!   connection: nothing closes it) is noticed by the client's HTTP/2
//!   keep-alive (default 5 s + 5 s; the wait is bounded at twice that),
//!   and the watch opens again on the other replica (PostgreSQL, as
//!   above).
//!
//! Failures are counted (opens that failed, ends that were errors); the
//! only time bound is the keep-alive's promise.

use std::{collections::BTreeMap, time::Duration};

use agentmesh_controlplane::client::{
    Client, ClientConfig, Connections, Dialing, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, WatchMove,
};
use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::{ApplyPolicyRequest, CreateTokenRequest},
        credential::{Credential, Role, TokenKind},
    },
};

use crate::common::{
    self, ADMIN, Backend, TestDb,
    binary::{Served, serve},
    watcher::Watcher,
};

/// The name every replica serves as its `--public-url`; it resolves
/// nowhere: clients dial the replicas' own addresses.
const LOGICAL: &str = "http://agentmesh-control-plane.invalid:7400";

/// `n` replicas of the real binary on `db`, each with `extra` flags.
async fn replicas(db: &TestDb, n: usize, extra: &[&str]) -> Vec<Served> {
    let admin = db.dir().join("admin.token");
    std::fs::write(&admin, ADMIN).expect("admin token");
    let admin = admin.display().to_string();
    let mut args = vec![
        "--public-url",
        LOGICAL,
        "--admin-token-file",
        &admin,
        "--policy-allow-all",
    ];
    args.extend_from_slice(extra);
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(serve(db.url(), &args, &db.binary_env()).await);
    }
    out
}

/// A client over `served` (held connections, as a router's), whose first
/// watch opens on `served[watch_start]`.
fn client(served: &[&Served], watch_start: usize, rpc_timeout: Duration) -> Client {
    Client::with_dialing(
        ClientConfig {
            url: LOGICAL.into(),
            ca_pem: None,
            retry_budget: Duration::from_secs(30),
            rpc_timeout,
        },
        Dialing {
            connections: Connections::Held,
            endpoints: served.iter().map(|s| s.endpoint()).collect(),
            watch_start: Some(watch_start),
            ..Dialing::default()
        },
    )
    .expect("client")
}

/// `n` router keys enrolled through `admin` with one router token.
async fn routers(admin: &Client, n: u32) -> Vec<(Keypair, Credential)> {
    let token = admin
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Router as i32,
                labels: Vec::new(),
                max_uses: n,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("router token")
        .token;
    let mut out = Vec::new();
    for _ in 0..n {
        let key = Keypair::generate_ed25519();
        let enrolled = admin.enroll(&token, &key).await.expect("router enrolls");
        out.push((key, enrolled.credential.expect("credential")));
    }
    out
}

fn revision(n: u32) -> ApplyPolicyRequest {
    ApplyPolicyRequest {
        text: format!("# revision {n}\n{}", agentmesh_policy::ALLOW_ALL),
        dry_run: false,
        author: "tester".into(),
    }
}

async fn a_stopping_replica_sends_its_watches_to_the_other_without_an_error(db: TestDb) {
    let mut served = replicas(&db, 2, &[]).await;
    let (a_addr, b_addr) = (served[0].endpoint(), served[1].endpoint());
    let c = client(&[&served[0], &served[1]], 0, Duration::from_secs(5));
    let (key, cred) = routers(&c, 1).await.pop().expect("one router");
    let w = Watcher::spawn(c.clone(), cred, key);
    let first = w
        .until("the first watch", |s| {
            !s.opens.is_empty() && s.policy_version >= 1
        })
        .await;
    assert_eq!(first.opens[0].endpoint, a_addr, "the rotation starts on a");
    // Another watch of this client takes the rotation's next (b), so the
    // watcher's next watch would go to a again: only a's "stopping"
    // sends it to b at its first attempt.
    let (key2, cred2) = routers(&c, 1).await.pop().expect("a second router");
    let other = c.open_watch(&cred2, &key2).await.expect("a second watch");
    assert_eq!(other.endpoint, b_addr);
    drop(other);

    // SIGTERM a: its watch is told to move, opens on b at its first
    // attempt, and a exits cleanly.
    let a = served.remove(0);
    assert!(a.terminate().await.success(), "a exits 0 after SIGTERM");
    let moved = w.until("the watch on b", |s| s.opens.len() >= 2).await;
    assert_eq!(moved.opens[1].endpoint, b_addr);
    assert_eq!(
        moved.opens[1].attempts, 1,
        "the stopping replica was not tried"
    );
    assert_eq!(moved.moves, [WatchMove::Stopping]);

    // A policy applied now (the client's calls avoid a as well) arrives
    // on the moved watch.
    let applied = c.apply_policy(ADMIN, revision(1)).await.expect("applies");
    let end = w
        .until("the new policy on the moved watch", |s| {
            s.policy_version == applied.version
        })
        .await;
    assert!(end.failed_opens.is_empty(), "{:?}", end.failed_opens);
    assert!(end.errors.is_empty(), "{:?}", end.errors);
    assert_eq!(end.opens.len(), 2, "{:?}", end.opens);
    let (_, body) = common::http_get(served[0].http_addr, "/metrics").await;
    let ends = |reason: &str| {
        common::metric(
            &body,
            &format!("agentmesh_control_plane_watch_ends_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(
        ends("stopping"),
        Some(0.0),
        "b is not stopping: pre-created at 0"
    );
    for s in served {
        assert!(s.terminate().await.success());
    }
}

/// Six watchers, three replicas, the rotations starting at 0..6.
const WATCHERS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_spread_over_the_replicas_after_one_max_age() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    // Moved at 5-10 s: well after the first opens (at most two frozen
    // endpoints' timeouts, 1 s).
    let served = replicas(&db, 3, &["--watch-max-age-secs", "10"]).await;
    let all: Vec<&Served> = served.iter().collect();
    let addrs: Vec<String> = served.iter().map(Served::endpoint).collect();
    let admin = client(&all, 0, Duration::from_secs(5));
    let routers = routers(&admin, WATCHERS as u32).await;

    // b and c frozen, as replicas not up yet: every watch opens on a.
    served[1].signal("STOP").await;
    served[2].signal("STOP").await;
    let watchers: Vec<Watcher> = routers
        .into_iter()
        .enumerate()
        .map(|(i, (key, cred))| {
            Watcher::spawn(client(&all, i, Duration::from_millis(500)), cred, key)
        })
        .collect();
    for w in &watchers {
        let s = w.until("the first watch", |s| !s.opens.is_empty()).await;
        assert_eq!(s.opens[0].endpoint, addrs[0], "only a answers");
    }
    let moved_early: usize = watchers.iter().map(|w| w.seen().moves.len()).sum();
    served[1].signal("CONT").await;
    served[2].signal("CONT").await;
    assert_eq!(
        moved_early, 0,
        "a watch moved before b and c were back: the test's premise needs a longer max age"
    );

    // The first watch to move: apply a policy while the others move too.
    let first_moved = tokio::time::timeout(common::watcher::WAIT, async {
        loop {
            if watchers.iter().any(|w| w.seen().opens.len() >= 2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    first_moved.await.expect("a watch moved within the bound");
    let admin_a = client(&all[..1], 0, Duration::from_secs(5));
    let applied = admin_a
        .apply_policy(ADMIN, revision(1))
        .await
        .expect("applies");

    let mut on: BTreeMap<String, usize> = BTreeMap::new();
    for w in &watchers {
        let s = w.until("the second watch", |s| s.opens.len() >= 2).await;
        assert_eq!(s.opens[1].attempts, 1, "{:?}", s.opens);
        assert_eq!(s.moves[0], WatchMove::MaxAge);
        *on.entry(s.opens[1].endpoint.clone()).or_default() += 1;
    }
    let spread: Vec<usize> = addrs
        .iter()
        .map(|a| on.get(a).copied().unwrap_or(0))
        .collect();
    assert_eq!(spread, [2, 2, 2], "each watcher's next replica: {on:?}");

    for w in &watchers {
        let s = w
            .until("the policy applied while watches moved", |s| {
                s.policy_version == applied.version
            })
            .await;
        assert!(s.failed_opens.is_empty(), "{:?}", s.failed_opens);
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }
    let (_, body) = common::http_get(served[0].http_addr, "/metrics").await;
    let max_age = common::metric(
        &body,
        "agentmesh_control_plane_watch_ends_total{reason=\"max_age\"}",
    );
    assert!(max_age.is_some_and(|n| n >= WATCHERS as f64), "{max_age:?}");
    drop(watchers);
    for s in served {
        assert!(s.terminate().await.success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_is_noticed_by_keepalive_and_the_watch_moves() {
    let Some(db) = TestDb::new(Backend::Postgres).await else {
        return;
    };
    let served = replicas(&db, 2, &[]).await;
    let all: Vec<&Served> = served.iter().collect();
    // The default keep-alive (what routers get), the watch starting on a.
    let c = client(&all, 0, Duration::from_secs(5));
    let (key, cred) = routers(&c, 1).await.pop().expect("one router");
    let w = Watcher::spawn(c, cred, key);
    let first = w.until("the first watch", |s| !s.opens.is_empty()).await;
    assert_eq!(first.opens[0].endpoint, served[0].endpoint());

    served[0].signal("STOP").await;
    let frozen_at = tokio::time::Instant::now();
    let bound = 2 * (KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT);
    let deadline = frozen_at + bound;
    let noticed = loop {
        let s = w.seen();
        if !s.errors.is_empty() {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the frozen replica was not noticed within {bound:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(noticed.errors.len(), 1, "{:?}", noticed.errors);
    assert!(noticed.moves.is_empty(), "a frozen replica says nothing");
    let moved = w.until("the watch on b", |s| s.opens.len() >= 2).await;
    assert_eq!(moved.opens[1].endpoint, served[1].endpoint());
    assert!(moved.failed_opens.is_empty(), "{:?}", moved.failed_opens);
    drop(w);
    served[0].signal("CONT").await;
    for s in served {
        assert!(s.terminate().await.success());
    }
}

on_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_stopping_replica_sends_its_watches_to_the_other_without_an_error,
);
