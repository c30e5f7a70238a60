//! A host without a credential floods the real control-plane binary with
//! unauthenticated RPCs (empty Refreshes, GetKeys, Enrolls with a made-up
//! token) at ~1,000/s from 127.0.0.77, while from 127.0.0.1 a router keeps
//! its lease as a router does and members enroll and refresh. The flood
//! runs until the real callers are done (at most `FLOOD_MAX`), so they are
//! attacked the whole time. Every real call must succeed within its
//! client's retry budget, every lease must be renewed before the previous
//! one expired, and the flood's refusals must show in `/metrics` under the
//! limits meant to stop it, with the refresh and lease budgets never
//! touched by it. The unauthenticated budget is set small (50/s) so the
//! flood's GetKeys exceed it, and its per-source shares bind, however fast
//! the machine runs the flood.

use crate::common;

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_controlplane::{Client, ClientConfig};
use agentmesh_hostile::control_plane::{FloodConfig, FloodKind, flood_until};
use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::{CreateTokenRequest, RouterLoad},
        credential::{Role, TokenKind},
    },
    unix_now,
};
use tokio::sync::watch;

const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 77));
/// The flood's longest run; it normally stops once the real callers are done.
const FLOOD_MAX: Duration = Duration::from_secs(120);
/// The flood runs at least this long, so its refusals are many.
const FLOOD_MIN: Duration = Duration::from_secs(20);
const MEMBERS: usize = 20;
const LEASE_INTERVAL: Duration = Duration::from_secs(3);
/// A router's retry budget for one lease round: a renewal that takes longer
/// could let the 30 s lease lapse.
const ROUTER_BUDGET: Duration = Duration::from_secs(20);
const MEMBER_BUDGET: Duration = Duration::from_secs(30);

fn client(url: &str, budget: Duration) -> Client {
    Client::new(ClientConfig {
        url: url.to_string(),
        retry_budget: budget,
        rpc_timeout: Duration::from_secs(5),
        ca_pem: None,
    })
    .expect("client config")
}

async fn mint(admin: &Client, role: Role, uses: u32) -> String {
    admin
        .create_token(
            common::ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: role as i32,
                labels: vec![],
                max_uses: uses,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("token minted")
        .token
}

/// What the router's lease loop saw.
#[derive(Debug, Default)]
struct Leases {
    rounds: usize,
    failures: Vec<String>,
    /// Renewals that came after the previous lease had expired.
    lapsed: usize,
    /// Rounds whose directory did not list the router itself.
    missing_from_directory: usize,
}

/// Leases, reads the directory and the keys every `LEASE_INTERVAL`, as a
/// router's control-plane loop does, until `done` and at least `FLOOD_MIN`.
async fn router_loop(url: String, token: String, done: watch::Receiver<bool>) -> Leases {
    let c = client(&url, ROUTER_BUDGET);
    let key = Keypair::generate_ed25519();
    let peer = key.public().to_peer_id().to_bytes();
    let cred = c
        .enroll(&token, &key)
        .await
        .expect("the router enrolls")
        .credential
        .expect("credential");
    let started = tokio::time::Instant::now();
    let mut out = Leases::default();
    let mut expires_at: Option<i64> = None;
    loop {
        out.rounds += 1;
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
            Ok(lease) => {
                if expires_at.is_some_and(|e| unix_now() > e) {
                    out.lapsed += 1;
                }
                expires_at = Some(lease.lease_expires_at_unix_secs);
            }
            Err(e) => out.failures.push(format!("RouterLease: {e}")),
        }
        match c.get_directory().await {
            Ok(d) if d.routers.iter().any(|r| r.peer_id == peer) => {}
            Ok(_) => out.missing_from_directory += 1,
            Err(e) => out.failures.push(format!("GetDirectory: {e}")),
        }
        if let Err(e) = c.get_keys().await {
            out.failures.push(format!("GetKeys: {e}"));
        }
        if *done.borrow() && started.elapsed() >= FLOOD_MIN {
            return out;
        }
        tokio::time::sleep(LEASE_INTERVAL).await;
    }
}

/// One member: enrolls, then refreshes twice a few seconds apart.
async fn member(url: String, token: String, n: usize) -> Result<(), String> {
    let c = client(&url, MEMBER_BUDGET);
    let key = Keypair::generate_ed25519();
    tokio::time::sleep(Duration::from_millis(100 * n as u64)).await;
    let mut cred = c
        .enroll(&token, &key)
        .await
        .map_err(|e| format!("Enroll: {e}"))?
        .credential
        .ok_or("no credential")?;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        cred = c
            .refresh(&cred, &key)
            .await
            .map_err(|e| format!("Refresh: {e}"))?
            .credential
            .ok_or("no credential")?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_host_takes_no_service_from_routers_and_members() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("cp.db").display());
    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, common::ADMIN).expect("admin token file");
    let served = common::binary::serve(
        &db,
        &[
            "--admin-token-file",
            admin_file.to_str().expect("utf8"),
            "--unauth-rate-per-sec",
            "50",
            "--unauth-burst",
            "100",
        ],
        &[],
    )
    .await;
    let url = served.url.clone();
    let admin = client(&url, Duration::from_secs(30));
    let router_token = mint(&admin, Role::Router, 1).await;
    let member_token = mint(&admin, Role::Member, MEMBERS as u32).await;

    // The members tell the router they are done; once the router is done
    // too (at least `FLOOD_MIN` of leases), the flood stops.
    let (members_done_tx, members_done) = watch::channel(false);
    let (stop_tx, mut stop_flood) = watch::channel(false);
    let attack = tokio::spawn(flood_until(
        FloodConfig {
            rate_per_sec: 1_000,
            kinds: vec![
                FloodKind::EmptyRefresh,
                FloodKind::GetKeys,
                FloodKind::EmptyRefresh,
                FloodKind::BadEnroll,
            ],
            ..FloodConfig::new(url.clone(), ATTACKER, FLOOD_MAX)
        },
        async move {
            let _ = stop_flood.wait_for(|s| *s).await;
        },
    ));
    // The real callers start once the flood has taken hold: its failures
    // have tripped the failure guard (seen in `/metrics`, not assumed after
    // a fixed wait).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = common::http_get(served.http_addr, "/metrics").await;
        let guard = common::metric(
            &body,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"failure_guard\"}",
        );
        if guard.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flood never tripped the failure guard"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let router = tokio::spawn(router_loop(url.clone(), router_token, members_done));
    let members: Vec<_> = (0..MEMBERS)
        .map(|n| tokio::spawn(member(url.clone(), member_token.clone(), n)))
        .collect();
    let errors = Arc::new(Mutex::new(Vec::new()));
    for m in members {
        if let Err(e) = m.await.expect("member task") {
            errors.lock().expect("lock").push(e);
        }
    }
    let _ = members_done_tx.send(true);
    let leases = router.await.expect("router task");
    let _ = stop_tx.send(true);
    let report = attack.await.expect("flood task").expect("flood ran");
    println!("flood: {}", report.summary());
    println!("router: {leases:?}");
    let member_errors = errors.lock().expect("lock").clone();

    // The flood really ran: it sent thousands and most were refused.
    assert!(report.sent() >= 2_000, "{}", report.summary());
    assert!(report.ok() < report.sent() / 2, "{}", report.summary());
    // Every real call succeeded within its budget.
    assert!(
        member_errors.is_empty(),
        "members failed: {member_errors:?}"
    );
    assert!(leases.failures.is_empty(), "router failed: {leases:?}");
    assert!(leases.rounds >= 5, "{leases:?}");
    assert_eq!(leases.lapsed, 0, "a lease expired before its renewal");
    assert_eq!(leases.missing_from_directory, 0, "{leases:?}");

    // Its refusals are counted under the limits meant to stop it, and it
    // never spent the budgets real members and routers draw from.
    let (status, body) = common::http_get(served.http_addr, "/metrics").await;
    assert_eq!(status, 200);
    let refused = |limiter: &str| {
        common::metric(
            &body,
            &format!("agentmesh_control_plane_limiter_refusals_total{{limiter=\"{limiter}\"}}"),
        )
        .unwrap_or_else(|| panic!("limiter {limiter} pre-created"))
    };
    // Its failed Refreshes and Enrolls are counted against it: after 60 in
    // a minute the failure guard refuses the rest (its empty Refreshes at
    // once, its made-up tokens after the proof, in memory).
    let guard = report.refused_by("failure_guard");
    assert!(guard >= 1_000, "{}", report.summary());
    assert!(refused("failure_guard") >= guard as f64);
    // Its GetKeys are held to its share of the unauthenticated budget once
    // the router and the members ask too.
    let share = report.refused_by("unauth_source_share");
    assert!(share >= 1, "{}", report.summary());
    assert!(refused("unauth_source_share") >= share as f64);
    // Every refusal of the flood came from the guard or the unauthenticated
    // budget or its own connections' stream bound (`streams_per_connection`:
    // its calls in flight on one connection, refused before any work; a
    // loaded machine that answers slower lets more pile up), or was a
    // malformed request; none from a budget real callers spend after they
    // are checked. The one exception: an enrollment with a
    // valid proof passes the cheap checks and reaches the enroll budget
    // (only the database knows the token is bad), until its source's
    // failures trip the guard, so at most the guard's threshold (60 a
    // minute) of them, and within the source's share.
    for (kind, r) in &report.kinds {
        for (limiter, n) in &r.by_limiter {
            let cheap = [
                "failure_guard",
                "unauth",
                "unauth_source_share",
                "streams_per_connection",
            ]
            .contains(&limiter.as_str());
            let before_the_guard = *kind == FloodKind::BadEnroll
                && ["enroll", "enroll_source_share"].contains(&limiter.as_str())
                && *n <= 60;
            assert!(
                cheap || before_the_guard,
                "{kind:?} refused {n} times by {limiter}: {}",
                report.summary()
            );
        }
    }
    for limiter in ["refresh", "refresh_source_share", "lease"] {
        assert_eq!(refused(limiter), 0.0, "{limiter} refused a real caller");
    }
}
