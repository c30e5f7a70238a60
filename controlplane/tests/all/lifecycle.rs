//! Restarts, key rotation, reapers and the HTTP endpoints, against real
//! control planes sharing one database, on both backends; backups while
//! serving on SQLite only (a PostgreSQL database is backed up with
//! `pg_dump`, docs/storage.md).

use std::time::Duration;

use crate::common::{self, TestDb, client, http_get, metric, metrics, start, token};
use agentmesh_controlplane::{offline, spawn};
use agentmesh_proto::{
    credential::{Trust, peek_claims, verify},
    identity::Keypair,
    pb::{
        controlplane::RouterLoad,
        credential::{Role, TokenKind},
    },
    unix_now,
};

async fn a_restart_loses_no_committed_enrollment(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("team", "a")], 1).await;
    let k = Keypair::generate_ed25519();
    let e = c.enroll(&tok, &k).await.expect("enrolls");
    let keys_before = c.get_keys().await.expect("keys");
    h.shutdown().await;

    let h = db.start().await;
    let c = client(&h);
    assert_eq!(
        c.get_keys().await.expect("keys"),
        keys_before,
        "keys persisted"
    );
    let cred = e.credential.expect("cred");
    let r = c
        .refresh(&cred, &k)
        .await
        .expect("node survived the restart");
    let claims = peek_claims(r.credential.as_ref().expect("cred")).expect("claims");
    assert_eq!(claims.node_id, e.node_id);
    // The token's single use is still spent, but the same key re-enrolls.
    assert_eq!(
        c.enroll(&tok, &k).await.expect("re-enroll").node_id,
        e.node_id
    );
    assert!(c.enroll(&tok, &Keypair::generate_ed25519()).await.is_err());
    // A node enrolled is recorded as seen, never at the zero time.
    assert_eq!(
        db.count("SELECT COUNT(*) FROM nodes WHERE last_seen <= 0")
            .await,
        0
    );
    h.shutdown().await;
}

async fn rotation_survives_restarts_publishes_ahead_and_is_claimed_once(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 10).await;
    let k = Keypair::generate_ed25519();
    let cred = c
        .enroll(&tok, &k)
        .await
        .expect("enrolls")
        .credential
        .expect("cred");
    let first_key = peek_claims(&cred).expect("claims").key_id;
    let deadline = db
        .count("SELECT next_rotation_at FROM rotation_state")
        .await;
    assert!(
        (deadline - (unix_now() + 86_400)).abs() < 60,
        "deadline a day ahead: {deadline}"
    );
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_next_key_rotation_timestamp_seconds"
        ),
        Some(deadline as f64)
    );
    h.shutdown().await;

    // The deadline passes while the control plane is down (it restarts more
    // often than the interval): the next start rotates.
    db.exec(&format!(
        "UPDATE rotation_state SET next_rotation_at = {}",
        unix_now() - 1
    ))
    .await;
    // Two replicas on the same database race for it.
    let a = db.start().await;
    let b = spawn(db.config()).await.expect("second replica");
    a.check_keys_now().await.expect("check a");
    b.check_keys_now().await.expect("check b");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM signing_keys").await,
        2,
        "rotated exactly once"
    );
    let c = client(&a);
    let keys = c.get_keys().await.expect("keys");
    let new = keys
        .keys
        .iter()
        .find(|k| k.key_id != first_key)
        .expect("new key published");
    assert!(
        new.active_from_unix_secs >= unix_now() + 590,
        "published ahead: {}",
        new.active_from_unix_secs
    );
    let next = db
        .count("SELECT next_rotation_at FROM rotation_state")
        .await;
    assert!(next > unix_now() + 86_000, "next deadline moved on: {next}");
    // Not active yet: still signing with the first key.
    let again = c
        .enroll(&tok, &Keypair::generate_ed25519())
        .await
        .expect("enrolls");
    assert_eq!(
        peek_claims(again.credential.as_ref().expect("cred"))
            .expect("claims")
            .key_id,
        first_key
    );

    // Once its time comes, the new key signs; the old credential still verifies.
    let now = unix_now();
    db.exec(&format!(
        "UPDATE signing_keys SET active_from = {} WHERE key_id = '{first_key}'",
        now - 100
    ))
    .await;
    db.exec(&format!(
        "UPDATE signing_keys SET active_from = {} WHERE key_id = '{}'",
        now - 1,
        new.key_id
    ))
    .await;
    a.check_keys_now().await.expect("reload");
    let fresh = c
        .enroll(&tok, &Keypair::generate_ed25519())
        .await
        .expect("enrolls");
    assert_eq!(
        peek_claims(fresh.credential.as_ref().expect("cred"))
            .expect("claims")
            .key_id,
        new.key_id
    );
    let trust = Trust::new(fresh.keys.as_ref().expect("keys"));
    verify(&cred, &trust, unix_now(), Some(&k.public().to_peer_id()), 0)
        .expect("old key within its grace");
    a.shutdown().await;
    b.shutdown().await;
}

async fn each_reaper_deletes_what_it_should_and_the_counters_show_it(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let now = unix_now();
    let boot = token(&h, TokenKind::Bootstrap, Role::Member, &[], 10).await;
    let eph = token(&h, TokenKind::Ephemeral, Role::Member, &[], 10).await;
    let once = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let _expiring = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[], 1).await;

    let lapsed = Keypair::generate_ed25519();
    let kept = Keypair::generate_ed25519();
    let eph_gone = Keypair::generate_ed25519();
    let eph_kept = Keypair::generate_ed25519();
    let router = Keypair::generate_ed25519();
    c.enroll(&boot, &lapsed).await.expect("enroll");
    c.enroll(&boot, &kept).await.expect("enroll");
    c.enroll(&eph, &eph_gone).await.expect("enroll");
    c.enroll(&eph, &eph_kept).await.expect("enroll");
    c.enroll(&once, &Keypair::generate_ed25519())
        .await
        .expect("enroll");
    let rcred = c
        .enroll(&router_tok, &router)
        .await
        .expect("enroll")
        .credential
        .expect("cred");
    c.router_lease(
        &rcred,
        &router,
        vec!["/ip4/127.0.0.1/tcp/1".into()],
        vec![],
        RouterLoad::default(),
        false,
    )
    .await
    .expect("lease");
    c.revoke_node(common::ADMIN, &kept.public().to_peer_id(), "test")
        .await
        .expect("revoke");
    c.rotate_key_now(common::ADMIN).await.expect("rotate");

    // Age the rows as a clock in the future would see them.
    let pid = |k: &Keypair| db.blob(&k.public().to_peer_id().to_bytes());
    db.exec(&format!(
        "UPDATE nodes SET last_seen = {} WHERE peer_id = {}",
        now - 31 * 86_400,
        pid(&lapsed)
    ))
    .await;
    db.exec(&format!(
        "UPDATE nodes SET last_seen = {} WHERE peer_id = {}",
        now - 7200,
        pid(&eph_gone)
    ))
    .await;
    db.exec(&format!(
        "UPDATE nodes SET last_seen = {} WHERE peer_id = {}",
        now - 600,
        pid(&eph_kept)
    ))
    .await;
    db.exec(&format!(
            "UPDATE enrollment_requests SET at = {} WHERE id IN (SELECT id FROM enrollment_requests LIMIT 2)",
            now - 8 * 86_400
        )).await;
    db.exec(&format!(
        "UPDATE tokens SET expires_at = {} WHERE max_uses = 1 AND uses = 0 AND role = 1",
        now - 1
    ))
    .await;
    db.exec(&format!(
        "UPDATE tokens SET last_used_at = {} WHERE max_uses = 1 AND uses = 1 AND role = 1",
        now - 2 * 86_400
    ))
    .await;
    db.exec(&format!(
        "UPDATE router_leases SET expires_at = {}",
        now - 1
    ))
    .await;
    db.exec(&format!("UPDATE revocations SET until = {}", now - 1))
        .await;
    db.exec(&format!(
        "UPDATE signing_keys SET verify_until = {} WHERE verify_until != 0",
        now - 1
    ))
    .await;

    let before = metrics(&h).await;
    assert_eq!(
        metric(
            &before,
            "agentmesh_control_plane_storage_rows{table=\"nodes\"}"
        ),
        Some(0.0),
        "counted at start"
    );
    let deleted = h.reap_now().await.expect("reap");
    let got = |t: &str, r: &str| {
        deleted
            .iter()
            .find(|(a, b, _)| *a == t && *b == r)
            .map(|x| x.2)
    };
    assert_eq!(got("nodes", "lapsed"), Some(1));
    assert_eq!(got("nodes", "ephemeral_lapsed"), Some(1));
    assert_eq!(got("enrollment_requests", "expired"), Some(2));
    assert_eq!(got("tokens", "expired"), Some(1));
    assert_eq!(got("tokens", "used_up"), Some(1));
    assert_eq!(got("router_leases", "expired"), Some(1));
    assert_eq!(got("revocations", "expired"), Some(1));
    assert_eq!(got("signing_keys", "grace_ended"), Some(1));
    // What should stay, stayed.
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM nodes WHERE peer_id = {}",
            pid(&eph_kept)
        ))
        .await,
        1
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM nodes WHERE peer_id = {}",
            pid(&kept)
        ))
        .await,
        1
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM tokens").await,
        3,
        "boot, eph, router tokens remain"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM signing_keys").await, 1);

    let m = metrics(&h).await;
    for (t, r) in [
        ("nodes", "lapsed"),
        ("nodes", "ephemeral_lapsed"),
        ("enrollment_requests", "expired"),
        ("tokens", "used_up"),
        ("router_leases", "expired"),
        ("signing_keys", "grace_ended"),
    ] {
        let want = got(t, r).expect("reported") as f64;
        let name = format!("agentmesh_control_plane_deleted_total{{table=\"{t}\",reason=\"{r}\"}}");
        assert_eq!(metric(&m, &name), Some(want), "{name}");
    }
    let nodes = db.count("SELECT COUNT(*) FROM nodes").await as f64;
    assert_eq!(
        metric(&m, "agentmesh_control_plane_storage_rows{table=\"nodes\"}"),
        Some(nodes)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_storage_rows{table=\"router_leases\"}"
        ),
        Some(0.0)
    );
    // A second pass finds nothing more.
    let again = h.reap_now().await.expect("reap");
    assert!(again.iter().all(|(_, _, n)| *n == 0), "{again:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn backup_while_serving_restores_to_a_working_control_plane() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = start(dir.path()).await;
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 3).await;
    let k = Keypair::generate_ed25519();
    let e = c.enroll(&tok, &k).await.expect("enrolls");
    let restored = tempfile::tempdir().expect("tempdir");
    let to = restored.path().join("cp.db");
    let db = format!("sqlite://{}", dir.path().join("cp.db").display());
    let to2 = to.clone();
    offline::backup(&db, &to2)
        .await
        .expect("backup while serving");
    // The signing keys in the copy are sealed: restoring needs the
    // key-encryption key too, which the backup does not hold.
    std::fs::copy(
        dir.path().join("cp.db.kek"),
        restored.path().join("cp.db.kek"),
    )
    .expect("the key-encryption key beside the database");
    // The handle can do it too (agentmesh-one); it refuses to overwrite.
    let other = restored.path().join("other.db");
    h.backup_to(&other)
        .await
        .expect("backup through the handle");
    assert!(h.backup_to(&other).await.is_err(), "refuses to overwrite");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&to).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    h.shutdown().await;

    let r = start(restored.path()).await;
    let c = client(&r);
    let cred = e.credential.expect("cred");
    let fresh = c
        .refresh(&cred, &k)
        .await
        .expect("restored control plane knows the node");
    let trust = Trust::new(fresh.keys.as_ref().expect("keys"));
    verify(
        fresh.credential.as_ref().expect("cred"),
        &trust,
        unix_now(),
        Some(&k.public().to_peer_id()),
        0,
    )
    .expect("verifies");
    c.enroll(&tok, &Keypair::generate_ed25519())
        .await
        .expect("token still usable after restore");
    r.shutdown().await;
}

async fn http_endpoints_health_and_reflection(db: TestDb) {
    let h = db.start().await;
    assert_eq!(http_get(h.http_addr(), "/healthz").await.0, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if http_get(h.http_addr(), "/readyz").await.0 == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "ready within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = http_get(h.http_addr(), "/info").await;
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(info["public_url"], h.public_url());
    assert_eq!(info["keys"].as_array().map(Vec::len), Some(1));
    assert!(info["routers"].as_array().is_some_and(Vec::is_empty));
    let m = metrics(&h).await;
    // Label values exist before anything happened.
    for sample in [
        "agentmesh_control_plane_rpc_total{method=\"Enroll\",code=\"ResourceExhausted\"} 0",
        "agentmesh_control_plane_limiter_refusals_total{limiter=\"enroll\"} 0",
        "agentmesh_control_plane_deleted_total{table=\"nodes\",reason=\"lapsed\"} 0",
        "agentmesh_control_plane_rpc_duration_seconds_count{method=\"Refresh\"} 0",
    ] {
        assert!(m.contains(sample), "missing {sample}");
    }
    // gRPC health says serving.
    let ch = tonic::transport::Endpoint::from_shared(h.public_url().to_string())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let s = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "agentmesh.controlplane.v1.ControlPlane".into(),
        })
        .await
        .expect("health");
    assert_eq!(
        s.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // Reflection (v1 and v1alpha) lists the service.
    {
        use tonic_reflection::pb::v1::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut refl = ServerReflectionClient::new(ch.clone());
        let mut stream = refl
            .server_reflection_info(tokio_stream::once(req))
            .await
            .expect("reflection v1")
            .into_inner();
        let resp = stream
            .message()
            .await
            .expect("answer")
            .expect("one message");
        match resp.message_response {
            Some(MessageResponse::ListServicesResponse(l)) => assert!(
                l.service
                    .iter()
                    .any(|s| s.name == "agentmesh.controlplane.v1.ControlPlane"),
                "{l:?}"
            ),
            other => panic!("unexpected reflection answer: {other:?}"),
        }
    }
    {
        use tonic_reflection::pb::v1alpha::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut refl = ServerReflectionClient::new(ch.clone());
        let mut stream = refl
            .server_reflection_info(tokio_stream::once(req))
            .await
            .expect("reflection v1alpha")
            .into_inner();
        let resp = stream
            .message()
            .await
            .expect("answer")
            .expect("one message");
        assert!(matches!(
            resp.message_response,
            Some(MessageResponse::ListServicesResponse(l))
                if l.service.iter().any(|s| s.name == "agentmesh.controlplane.v1.ControlPlane")
        ));
    }
    h.shutdown().await;
}

async fn a_client_rides_out_a_control_plane_restart(db: TestDb) {
    let h = db.start().await;
    let grpc = h.grpc_addr();
    let c = client(&h);
    let keys = c.get_keys().await.expect("keys");
    h.shutdown().await;
    // The call starts while nothing listens; it retries (UNAVAILABLE) until
    // the control plane is back on the same address.
    let pending = tokio::spawn({
        let c = c.clone();
        async move { c.get_keys().await }
    });
    let mut cfg = db.config();
    cfg.grpc_addr = grpc;
    let h = spawn(cfg).await.expect("restarts on the same address");
    let again = tokio::time::timeout(Duration::from_secs(60), pending)
        .await
        .expect("answered within 60 s")
        .expect("join")
        .expect("the retried call succeeds");
    assert_eq!(again, keys);
    h.shutdown().await;
}

async fn with_no_publish_ahead_a_rotated_key_signs_at_once_even_in_the_same_second(db: TestDb) {
    let mut cfg = db.config();
    cfg.key_publish_ahead_secs = 0;
    let h = spawn(cfg).await.expect("starts");
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 5).await;
    let k = Keypair::generate_ed25519();
    let first = c.enroll(&tok, &k).await.expect("enrolls");
    let rotated = c.rotate_key_now(common::ADMIN).await.expect("rotates");
    let again = c.enroll(&tok, &k).await.expect("re-enrolls");
    let key_of = |e: &agentmesh_proto::pb::controlplane::EnrollResponse| {
        peek_claims(e.credential.as_ref().expect("cred"))
            .expect("claims")
            .key_id
    };
    assert_ne!(key_of(&first), rotated.key_id);
    assert_eq!(key_of(&again), rotated.key_id);
    h.shutdown().await;
}

async fn after_rotate_key_now_the_new_key_verifies_at_once_and_the_old_one_within_grace(
    db: TestDb,
) {
    let mut cfg = db.config();
    cfg.key_publish_ahead_secs = 0;
    let h = spawn(cfg).await.expect("starts");
    let c = client(&h);
    let member_tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[], 1).await;
    let (m, r) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let cred = |e: Option<agentmesh_proto::pb::credential::Credential>| e.expect("credential");
    let old_m = cred(c.enroll(&member_tok, &m).await.expect("enroll").credential);
    let old_r = cred(c.enroll(&router_tok, &r).await.expect("enroll").credential);
    let lease = |cr: agentmesh_proto::pb::credential::Credential| {
        let c = &c;
        let r = &r;
        async move {
            c.router_lease(
                &cr,
                r,
                vec!["/ip4/127.0.0.1/tcp/1".into()],
                vec![],
                RouterLoad::default(),
                false,
            )
            .await
        }
    };
    // Both verifying calls run once, so their view of the keys is built
    // (and cached) before the rotation.
    c.refresh(&old_m, &m).await.expect("refresh before");
    lease(old_r.clone()).await.expect("lease before");

    let rotated = c.rotate_key_now(common::ADMIN).await.expect("rotates");
    // The old key verifies within its grace; what comes back is signed by the new one.
    let new_m = cred(
        c.refresh(&old_m, &m)
            .await
            .expect("old key within grace")
            .credential,
    );
    let new_r = cred(
        c.refresh(&old_r, &r)
            .await
            .expect("old key within grace")
            .credential,
    );
    for new in [&new_m, &new_r] {
        assert_eq!(peek_claims(new).expect("claims").key_id, rotated.key_id);
    }
    // The new key verifies at once: no stale view.
    c.refresh(&new_m, &m).await.expect("new key, Refresh");
    lease(new_r).await.expect("new key, RouterLease");
    lease(old_r)
        .await
        .expect("old key, RouterLease, within grace");
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    a_restart_loses_no_committed_enrollment,
    rotation_survives_restarts_publishes_ahead_and_is_claimed_once,
    each_reaper_deletes_what_it_should_and_the_counters_show_it,
    http_endpoints_health_and_reflection,
    a_client_rides_out_a_control_plane_restart,
    with_no_publish_ahead_a_rotated_key_signs_at_once_even_in_the_same_second,
    after_rotate_key_now_the_new_key_verifies_at_once_and_the_old_one_within_grace,
);
