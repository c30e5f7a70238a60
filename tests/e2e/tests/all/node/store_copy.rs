//! A mesh moved from SQLite to PostgreSQL with `agentmesh-control-plane
//! store copy` (the real binary), as docs/storage.md tells an operator to:
//! a member enrolled on SQLite and attached to a real router, the control
//! plane stopped, its database copied, a control plane started on
//! PostgreSQL at the same address. The member refreshes there without
//! enrolling again, its router accepts the refreshed credential (signed by
//! the copied key) and keeps it attached, the router keeps leasing, and
//! tokens keep their spent uses. The PostgreSQL database is a fresh one on
//! the server `AGENTMESH_TEST_POSTGRES_URL` names (`.ci/postgres.sh`);
//! without one the test fails in CI and elsewhere notes that it did not run.

use super::support::*;

use agentmesh_controlplane::store::{KEK_ENV, Kek, testing};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Label, Role, TokenKind};
use agentmesh_testkit::eventually;
use libp2p::identity::Keypair;

const BIN: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// Short credentials, so the member refreshes within the test (two thirds
/// of the lifetime after the last one, minus jitter).
const CREDENTIAL_TTL_SECS: u64 = 20;

/// `agentmesh-control-plane store copy --from … --to …`, the target's KEK
/// from the environment.
async fn store_copy(from: &str, to: &str, kek: &str) -> std::process::Output {
    let out = tokio::process::Command::new(BIN)
        .args(["store", "copy", "--from", from, "--to", to])
        .env(KEK_ENV, kek)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(DEADLINE, out)
        .await
        .expect("store copy finishes in time")
        .expect("store copy runs")
}

async fn cp_metric(handle: &agentmesh_controlplane::Handle, series: &str) -> f64 {
    let (status, body) = http_get(handle.http_addr(), "/metrics").await;
    assert_eq!(status, 200);
    metric(&body, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_copied_from_sqlite_to_postgres_refreshes_and_its_router_keeps_it() {
    let Some(pg) = testing::fresh_database().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = format!("sqlite://{}", dir.path().join("cp.db").display());
    let cp = start_cp_with(|c| {
        c.db = sqlite.clone();
        c.credential_ttl_secs = CREDENTIAL_TTL_SECS;
    })
    .await;
    let router = start_router(&cp, "r1").await;
    let token = cp.token(Role::Member).await;
    let (node, _node_dir) = spawn_node(&cp, &token, "spawn member", |c| c).await;
    ready(&node, "member").await;
    assert_eq!(node.status().borrow().reserved, vec![router.id()]);
    // A second member, through the client, with a single-use token it spends.
    let once = cp
        .client
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Member as i32,
                labels: vec![Label {
                    key: "team".into(),
                    value: "a".into(),
                }],
                max_uses: 1,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("token")
        .token;
    let key = Keypair::generate_ed25519();
    let enrolled = cp.client.enroll(&once, &key).await.expect("enrolls");
    let cred = enrolled.credential.clone().expect("credential");

    // Stop the control plane, then copy: nothing is written after the read.
    let addr = cp.handle.grpc_addr();
    let url = cp.url.clone();
    let client = cp.client.clone();
    cp.handle.shutdown().await;
    let expiry_on_sqlite = node.status().borrow().credential_expires_at_unix_secs;
    let admitted = "agentmesh_router_auth_total{purpose=\"attach\",result=\"admitted\"}";
    let admitted_on_sqlite = router.metric(admitted);

    let kek = Kek::generate_hex();
    let out = store_copy(&sqlite, &pg.url, &kek).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The router, the member and the client's member.
    assert!(stderr.contains("copied 3 rows of nodes"), "{stderr}");
    assert!(stderr.contains("copied 1 rows of signing_keys"), "{stderr}");
    assert!(
        stderr.contains("copied 1 rows of router_leases"),
        "{stderr}"
    );
    // A second copy into the now full target is refused, naming why.
    let again = store_copy(&sqlite, &pg.url, &kek).await;
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success());
    assert!(stderr.contains("empty"), "{stderr}");

    // The control plane on PostgreSQL, at the address members sign for.
    let pg_cp = agentmesh_controlplane::spawn(agentmesh_controlplane::Config {
        grpc_addr: addr,
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: pg.url.clone(),
        key_encryption_key: Some(kek),
        admin_token: Some(ADMIN.to_string()),
        credential_ttl_secs: CREDENTIAL_TTL_SECS,
        ..Default::default()
    })
    .await
    .expect("starts on PostgreSQL");
    assert_eq!(pg_cp.public_url(), url);

    // The member refreshes there and re-presents the new credential to its
    // router, which admits it again on the same connection.
    eventually("the member refreshed on PostgreSQL", || async {
        let s = node.status().borrow().clone();
        (s.credential_expires_at_unix_secs > expiry_on_sqlite).then_some(())
    })
    .await;
    eventually("the router admitted the refreshed credential", || async {
        (router.metric(admitted) > admitted_on_sqlite).then_some(())
    })
    .await;
    let enroll_rpcs = cp_metric(
        &pg_cp,
        "agentmesh_control_plane_rpc_total{method=\"Enroll\",code=\"Ok\"}",
    )
    .await
        + cp_metric(
            &pg_cp,
            "agentmesh_control_plane_rpc_total{method=\"Enroll\",code=\"Unauthenticated\"}",
        )
        .await;
    assert_eq!(enroll_rpcs, 0.0, "nobody enrolled again");
    let s = node.status().borrow().clone();
    assert!(s.ready, "{s:?}");
    assert_eq!(s.reserved, vec![router.id()], "still on its router");
    assert_eq!(router.metric("agentmesh_router_attached_members"), 1.0);
    // The router leases to the control plane on PostgreSQL.
    eventually("the router leases on PostgreSQL", || async {
        let ok = cp_metric(
            &pg_cp,
            "agentmesh_control_plane_rpc_total{method=\"RouterLease\",code=\"Ok\"}",
        )
        .await;
        (ok >= 1.0).then_some(())
    })
    .await;

    // The client's member: the same signing key, a refresh without
    // enrolling, its used-up token still used up, and re-enrolling its own
    // key with it needs no use and keeps its node. (The copy is a new
    // database, so its epoch is new: holders take its key set whatever
    // generation it carries; the keys themselves are the same.)
    let copied = client.get_keys().await.expect("keys");
    let original = enrolled.keys.clone().expect("key set");
    assert_eq!(copied.keys, original.keys, "the same signing key");
    assert_ne!(
        copied.epoch, original.epoch,
        "a copied database's epoch is its own"
    );
    let refreshed = client
        .refresh(&cred, &key)
        .await
        .expect("refreshes on PostgreSQL without enrolling again");
    assert!(refreshed.credential.is_some());
    assert!(
        client
            .enroll(&once, &Keypair::generate_ed25519())
            .await
            .is_err(),
        "the used-up token stays used up"
    );
    let again = client.enroll(&once, &key).await.expect("re-enrolls");
    assert_eq!(again.node_id, enrolled.node_id);

    node.shutdown().await;
    drop(router);
    pg_cp.shutdown().await;
}
