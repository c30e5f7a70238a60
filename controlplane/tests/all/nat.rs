//! An attacker behind a NAT: it shares 127.0.0.1 with members and a router
//! and keeps the failure guard tripped for that address the whole time
//! with Refreshes carrying garbage, empty Refreshes and Enrolls with
//! made-up tokens (valid proofs). The guard refuses only requests that fail
//! to prove who they are, so the members behind the same address enroll
//! and refresh, and the router leases, opens a Watch and stays in the
//! directory throughout; the made-up tokens stop reaching the database once
//! the guard is tripped. On both backends (every real call reaches the
//! store).

use crate::common::{TestDb, metric, metrics, token};

use std::{net::IpAddr, time::Duration};

use agentmesh_controlplane::{Client, ClientConfig, Handle};
use agentmesh_hostile::control_plane::{FloodConfig, FloodKind, flood_until};
use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::RouterLoad,
        credential::{Credential, Role, TokenKind},
    },
    unix_now,
};
use tokio::sync::watch;

/// The NAT's one address: the attacker's, the members' and the router's.
const NAT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
const MEMBERS: usize = 8;
/// The router's lease rounds during the attack, one a second.
const ROUNDS: usize = 8;
/// The lease's lifetime: renewed every second, it lapses only if renewals
/// fail (or stall) for this long.
const LEASE_TTL_SECS: u64 = 15;
/// A real call's retry budget. Under the old guard the source's refusals
/// said "retry in ~60 s", past it.
const BUDGET: Duration = Duration::from_secs(10);
/// The flood's longest run: within one guard window (60 s) of its first
/// failure, so at most 60 of its made-up tokens can reach the database.
const FLOOD_MAX: Duration = Duration::from_secs(50);

fn client(url: &str) -> Client {
    Client::new(ClientConfig {
        url: url.to_string(),
        retry_budget: BUDGET,
        rpc_timeout: Duration::from_secs(5),
        ca_pem: None,
    })
    .expect("client config")
}

async fn failure_guard_refusals(h: &Handle) -> f64 {
    metric(
        &metrics(h).await,
        r#"agentmesh_control_plane_limiter_refusals_total{limiter="failure_guard"}"#,
    )
    .expect("pre-created")
}

/// What the router saw during the attack.
#[derive(Debug, Default)]
struct RouterRun {
    failures: Vec<String>,
    /// Leases renewed after the previous one had expired.
    lapsed: usize,
    /// Directory reads that did not list the router.
    missing: usize,
}

/// A router's Watch opened during the attack: `Ok` once its first event
/// arrived.
async fn watcher(url: String, key: Keypair, cred: Credential) -> Result<(), String> {
    let mut s = client(&url)
        .watch(&cred, &key)
        .await
        .map_err(|e| format!("Watch: {e}"))?;
    match tokio::time::timeout(Duration::from_secs(30), s.message()).await {
        Ok(Ok(Some(_))) => Ok(()),
        other => Err(format!("Watch's first event: {other:?}")),
    }
}

/// A router's lease loop during the attack: lease, then read the directory.
async fn router(url: String, key: Keypair, cred: Credential) -> RouterRun {
    let c = client(&url);
    let me = key.public().to_peer_id().to_bytes();
    let mut run = RouterRun::default();
    let mut expires_at: Option<i64> = None;
    for _ in 0..ROUNDS {
        match c
            .router_lease(
                &cred,
                &key,
                vec!["/ip4/127.0.0.1/tcp/4001".into()],
                vec![],
                RouterLoad::default(),
                false,
            )
            .await
        {
            Ok(l) => {
                if expires_at.is_some_and(|e| unix_now() > e) {
                    run.lapsed += 1;
                }
                expires_at = Some(l.lease_expires_at_unix_secs);
            }
            Err(e) => run.failures.push(format!("RouterLease: {e}")),
        }
        match c.get_directory().await {
            Ok(d) if d.routers.iter().any(|r| r.peer_id == me) => {}
            Ok(_) => run.missing += 1,
            Err(e) => run.failures.push(format!("GetDirectory: {e}")),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    run
}

/// One member behind the NAT: enrolls, then refreshes twice.
async fn member(url: String, token: String) -> Result<(), String> {
    let c = client(&url);
    let key = Keypair::generate_ed25519();
    let mut cred = c
        .enroll(&token, &key)
        .await
        .map_err(|e| format!("Enroll: {e}"))?
        .credential
        .ok_or("no credential")?;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cred = c
            .refresh(&cred, &key)
            .await
            .map_err(|e| format!("Refresh: {e}"))?
            .credential
            .ok_or("no credential")?;
    }
    Ok(())
}

async fn an_attacker_behind_a_nat_takes_no_service_from_members_and_routers_behind_it(db: TestDb) {
    let mut cfg = db.config();
    cfg.lease_ttl_secs = LEASE_TTL_SECS;
    let h = agentmesh_controlplane::spawn(cfg)
        .await
        .expect("control plane starts");
    let url = h.public_url().to_string();
    let router_token = token(&h, TokenKind::Bootstrap, Role::Router, &[], 1).await;
    let member_token = token(&h, TokenKind::Bootstrap, Role::Member, &[], MEMBERS as u32).await;

    // The router joins before the attack.
    let router_key = Keypair::generate_ed25519();
    let router_cred = client(&url)
        .enroll(&router_token, &router_key)
        .await
        .expect("the router enrolls")
        .credential
        .expect("credential");

    let (stop_tx, mut stop) = watch::channel(false);
    let attack = tokio::spawn(flood_until(
        FloodConfig {
            rate_per_sec: 300,
            kinds: vec![
                FloodKind::GarbageRefresh,
                FloodKind::BadEnroll,
                FloodKind::EmptyRefresh,
            ],
            ..FloodConfig::new(url.clone(), NAT, FLOOD_MAX)
        },
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ));
    // The guard trips for the NAT's address before anyone else asks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while failure_guard_refusals(&h).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood never tripped the failure guard"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tripped_at = failure_guard_refusals(&h).await;

    let watch = tokio::spawn(watcher(
        url.clone(),
        router_key.clone(),
        router_cred.clone(),
    ));
    let router = tokio::spawn(router(url.clone(), router_key, router_cred));
    let members: Vec<_> = (0..MEMBERS)
        .map(|_| tokio::spawn(member(url.clone(), member_token.clone())))
        .collect();
    let mut member_errors = Vec::new();
    for m in members {
        if let Err(e) = m.await.expect("member task") {
            member_errors.push(e);
        }
    }
    let run = router.await.expect("router task");
    let watched = watch.await.expect("watch task");
    // The guard was still refusing the attacker when everyone was done.
    let refused_meanwhile = failure_guard_refusals(&h).await - tripped_at;
    let _ = stop_tx.send(true);
    let report = attack.await.expect("flood task").expect("flood ran");
    println!("flood: {}", report.summary());
    println!("router: {run:?}");

    assert!(report.sent() >= 1_000, "{}", report.summary());
    assert!(
        refused_meanwhile >= 100.0,
        "the guard did not keep refusing the attacker: {refused_meanwhile}"
    );
    assert!(
        member_errors.is_empty(),
        "members behind the NAT failed: {member_errors:?}"
    );
    assert!(run.failures.is_empty(), "the router failed: {run:?}");
    assert_eq!(run.lapsed, 0, "a lease lapsed: {run:?}");
    assert_eq!(run.missing, 0, "the router left the directory: {run:?}");
    assert_eq!(watched, Ok(()), "the router's Watch");

    // Made-up tokens reach the database only while the source is under its
    // failure limit (one window here): once it is over, they are refused in
    // memory, before the enroll budget and the token lookup.
    let looked_up = db
        .count("SELECT COUNT(*) FROM enrollment_requests WHERE outcome = 'unknown_token'")
        .await;
    assert!(
        looked_up <= 60,
        "{looked_up} made-up tokens reached the database"
    );
    let m = metrics(&h).await;
    for limiter in ["lease", "refresh", "refresh_source_share"] {
        assert_eq!(
            metric(
                &m,
                &format!("agentmesh_control_plane_limiter_refusals_total{{limiter=\"{limiter}\"}}")
            ),
            Some(0.0),
            "{limiter}"
        );
    }
    h.shutdown().await;
}

on_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    an_attacker_behind_a_nat_takes_no_service_from_members_and_routers_behind_it,
);
