//! Enrollment, refresh, leases and admin calls against a real control plane
//! on loopback, on both backends. On SQLite only: the tests whose requests
//! are refused before they reach the database (malformed requests, limiter
//! refusals, a bad embedded admin token).

use std::{sync::Arc, time::Duration};

use crate::common::{self, ADMIN, TestDb, client, metric, metrics, start, token};
use agentmesh_controlplane::{
    ClientError,
    clock::{Clock, SleepFuture},
    spawn, spawn_with_clock,
};
use agentmesh_proto::{
    credential::{Trust, peek_claims, sign, verify},
    identity::{Keypair, ed25519},
    pb::{
        controlplane::{
            EnrollRequest, RefreshRequest, RotateKeyNowRequest, RouterLeaseRequest, RouterLoad,
            control_plane_client::ControlPlaneClient,
        },
        credential::{Claims, Credential, Label, Role, TokenKind},
    },
    proof::Bound,
    revocations::verify_revocations,
    unix_now,
};
use tonic::Code;

fn code(r: Result<impl std::fmt::Debug, ClientError>) -> Code {
    match r {
        Err(ClientError::Refused(s)) => s.code(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn label(k: &str, v: &str) -> Label {
    Label {
        key: k.into(),
        value: v.into(),
    }
}

async fn enroll_refresh_and_re_enroll_without_spending_a_use(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("team", "a")], 2).await;

    let a = Keypair::generate_ed25519();
    let e = c.enroll(&tok, &a).await.expect("enrolls");
    let trust = Trust::new(e.keys.as_ref().expect("key set"));
    let cred = e.credential.expect("credential");
    let v = verify(&cred, &trust, unix_now(), Some(&a.public().to_peer_id()), 0)
        .expect("verifies offline");
    assert_eq!(v.role(), Role::Member);
    assert_eq!(v.token_kind(), TokenKind::Bootstrap);
    assert_eq!(
        v.labels().get("team").map(String::as_str),
        Some("a"),
        "labels come from the token"
    );
    assert_eq!(v.claims.node_id, e.node_id);
    assert_eq!(db.count("SELECT uses FROM tokens").await, 1);

    // Refresh: same node, new credential, last_seen updated.
    let r = c.refresh(&cred, &a).await.expect("refreshes");
    let v2 = verify(
        r.credential.as_ref().expect("cred"),
        &trust,
        unix_now(),
        Some(&a.public().to_peer_id()),
        0,
    )
    .expect("refreshed credential verifies");
    assert_eq!(v2.claims.node_id, e.node_id);

    // Re-enrolling the same key with the same token: same node, no use spent.
    for _ in 0..3 {
        let again = c.enroll(&tok, &a).await.expect("re-enrolls");
        assert_eq!(again.node_id, e.node_id);
    }
    assert_eq!(db.count("SELECT uses FROM tokens").await, 1);
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 1);

    // The second use, then the token is spent.
    let b = Keypair::generate_ed25519();
    c.enroll(&tok, &b).await.expect("second key enrolls");
    let third = c.enroll(&tok, &Keypair::generate_ed25519()).await;
    match third {
        Err(ClientError::Refused(s)) => {
            assert_eq!(s.code(), Code::Unauthenticated);
            assert!(s.message().contains("no uses left"), "{}", s.message());
        }
        other => panic!("expected used-up refusal: {other:?}"),
    }
    assert_eq!(
        code(c.enroll("amt_not-a-token", &b).await),
        Code::Unauthenticated
    );

    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_enrollments_total{result=\"enrolled\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_enrollments_total{result=\"re_enrolled\"}"
        ),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_auth_failures_total{method=\"Enroll\",reason=\"token_used_up\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_rpc_total{method=\"Enroll\",code=\"Ok\"}"
        ),
        Some(5.0)
    );
    h.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = start(dir.path()).await;
    let mut raw = ControlPlaneClient::connect(h.public_url().to_string())
        .await
        .expect("connect");
    let key = Keypair::generate_ed25519();
    let enroll = |token: &str, url: &str| {
        EnrollRequest {
            token: token.into(),
            proof: None,
        }
        .proven(url, &key, unix_now())
    };
    let no_token = raw
        .enroll(enroll("", h.public_url()))
        .await
        .expect_err("empty token");
    assert_eq!(no_token.code(), Code::InvalidArgument);
    let no_proof = raw
        .enroll(EnrollRequest {
            token: "amt_x".into(),
            proof: None,
        })
        .await
        .expect_err("no proof");
    assert_eq!(no_proof.code(), Code::InvalidArgument);
    let mut bad_key = enroll("amt_x", h.public_url());
    if let Some(p) = bad_key.proof.as_mut() {
        p.public_key = vec![1, 2, 3];
    }
    let r = raw.enroll(bad_key).await.expect_err("bad key");
    assert_eq!(r.code(), Code::InvalidArgument);
    // A proof for another endpoint is a failed proof, not a malformed one.
    let r = raw
        .enroll(enroll("amt_x", "http://evil.example:7400"))
        .await
        .expect_err("wrong endpoint");
    assert_eq!(r.code(), Code::Unauthenticated);
    let r = raw
        .refresh(
            RefreshRequest {
                credential: Some(Credential {
                    claims: vec![0xff; 10],
                    signature: vec![],
                }),
                proof: None,
            }
            .proven(h.public_url(), &key, unix_now()),
        )
        .await
        .expect_err("garbage credential");
    assert_eq!(r.code(), Code::InvalidArgument);
    // The server is still fine.
    assert!(
        raw.get_keys(agentmesh_proto::pb::controlplane::GetKeysRequest {})
            .await
            .is_ok()
    );
    h.shutdown().await;
}

/// The server's current signing key, read from its database and opened
/// with its key-encryption key.
async fn server_key(db: &TestDb) -> (String, ed25519::Keypair) {
    let mut keys = db.store().await.keys().await.expect("keys").rows;
    keys.sort_by_key(|k| k.active_from);
    let k = keys.pop().expect("a key");
    let mut secret = k.secret;
    (
        k.key_id,
        ed25519::Keypair::try_from_bytes(&mut secret).expect("key bytes"),
    )
}

async fn expired_forged_other_peer_and_revoked_credentials_are_refused(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 5).await;
    let a = Keypair::generate_ed25519();
    let b = Keypair::generate_ed25519();
    let cred_a = c
        .enroll(&tok, &a)
        .await
        .expect("a")
        .credential
        .expect("cred");
    c.enroll(&tok, &b).await.expect("b");

    // Forged: one bit of the signature flipped.
    let mut forged = cred_a.clone();
    forged.signature[0] ^= 1;
    assert_eq!(code(c.refresh(&forged, &a).await), Code::Unauthenticated);
    // Forged by another key entirely.
    let mut claims = peek_claims(&cred_a).expect("claims");
    let rogue = sign(&claims, &ed25519::Keypair::generate());
    assert_eq!(code(c.refresh(&rogue, &a).await), Code::Unauthenticated);
    // Other peer: B presents A's credential with B's own proof.
    assert_eq!(code(c.refresh(&cred_a, &b).await), Code::Unauthenticated);
    // Expired beyond the refresh grace (signed with the server's real key).
    let (key_id, key) = server_key(&db).await;
    let now = unix_now();
    claims.key_id = key_id;
    claims.issued_at_unix_secs = now - 10_000;
    claims.expires_at_unix_secs = now - 5_000;
    let expired = sign(&claims, &key);
    match c.refresh(&expired, &a).await {
        Err(ClientError::Refused(s)) => {
            assert_eq!(s.code(), Code::Unauthenticated);
            assert!(s.message().contains("expired"), "{}", s.message());
        }
        other => panic!("expected expired refusal: {other:?}"),
    }
    // Just expired, within the grace: still refreshable.
    claims.expires_at_unix_secs = now - 100;
    claims.issued_at_unix_secs = now - 3700;
    let recent = sign(&claims, &key);
    c.refresh(&recent, &a).await.expect("within refresh grace");

    // Revoked: refused, listed in the directory and /info, cannot re-enroll.
    let peer_a = a.public().to_peer_id();
    assert_eq!(
        code(c.revoke_node("wrong-admin-token-xxxx", &peer_a, "x").await),
        Code::Unauthenticated
    );
    let until = c
        .revoke_node(ADMIN, &peer_a, "lost laptop")
        .await
        .expect("revoked")
        .until_unix_secs;
    assert!(
        until >= now + 3600,
        "until the last credential expires: {until}"
    );
    assert_eq!(code(c.refresh(&cred_a, &a).await), Code::PermissionDenied);
    assert_eq!(code(c.enroll(&tok, &a).await), Code::PermissionDenied);
    let dir_resp = c.get_directory().await.expect("directory");
    // The list is signed by a key of the key set; what it says is trusted
    // only then.
    let mut trust = Trust::new(&c.get_keys().await.expect("keys"));
    let list = verify_revocations(
        dir_resp
            .revocations
            .as_ref()
            .expect("the directory carries the list"),
        &trust,
        unix_now(),
    )
    .expect("signed by the control plane");
    assert!(
        list.entries
            .iter()
            .any(|r| r.peer_id == peer_a.to_bytes() && r.reason == "lost laptop")
    );
    let (status, info) = common::http_get(h.http_addr(), "/info").await;
    assert_eq!(status, 200);
    assert!(info.contains(&peer_a.to_string()), "{info}");
    // Verifiers holding the revocation list refuse it offline too.
    trust.set_revocations(&list.entries);
    assert!(verify(&cred_a, &trust, unix_now(), Some(&peer_a), 0).is_err());
    h.shutdown().await;
}

async fn router_leases_need_role_router_and_allowed_labels(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let member_tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("zone", "a")], 1).await;
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[("zone", "a")], 1).await;
    let load = RouterLoad {
        attached_members: 3,
        transit_connections: 1,
        high_watermark: 100,
        low_watermark: 85,
    };
    let addrs = vec!["/ip4/127.0.0.1/udp/4001/quic-v1".to_string()];

    // A member token cannot make a router.
    let m = Keypair::generate_ed25519();
    let mcred = c
        .enroll(&member_tok, &m)
        .await
        .expect("member")
        .credential
        .expect("cred");
    assert_eq!(
        code(
            c.router_lease(&mcred, &m, addrs.clone(), vec![], load, false)
                .await
        ),
        Code::PermissionDenied
    );
    let r = Keypair::generate_ed25519();
    let rcred = c
        .enroll(&router_tok, &r)
        .await
        .expect("router")
        .credential
        .expect("cred");
    // Labels must be a subset of the credential's.
    assert_eq!(
        code(
            c.router_lease(
                &rcred,
                &r,
                addrs.clone(),
                vec![label("zone", "b")],
                load,
                false
            )
            .await
        ),
        Code::PermissionDenied
    );
    // Someone else's credential with their own proof.
    assert_eq!(
        code(
            c.router_lease(&rcred, &m, addrs.clone(), vec![], load, false)
                .await
        ),
        Code::Unauthenticated
    );
    let lease = c
        .router_lease(
            &rcred,
            &r,
            addrs.clone(),
            vec![label("zone", "a")],
            load,
            true,
        )
        .await
        .expect("lease");
    assert_eq!(lease.lease_ttl_secs, 30);
    let d = c.get_directory().await.expect("directory");
    assert_eq!(d.routers.len(), 1);
    let info = &d.routers[0];
    assert_eq!(info.peer_id, r.public().to_peer_id().to_bytes());
    assert_eq!(info.addrs, addrs);
    assert_eq!(info.labels, vec![label("zone", "a")]);
    assert_eq!(info.load, Some(load));
    assert!(info.draining);
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_auth_failures_total{method=\"RouterLease\",reason=\"wrong_role\"}"
        ),
        Some(1.0)
    );
    h.shutdown().await;
}

/// A clock that never moves: the limiter refills nothing, so what it
/// admits and refuses does not depend on how fast the machine is.
#[derive(Debug)]
struct Frozen;

impl Clock for Frozen {
    fn now(&self) -> Duration {
        Duration::from_secs(1000)
    }
    fn sleep(&self, _: Duration) -> SleepFuture {
        Box::pin(std::future::ready(()))
    }
}

async fn limiter_refusals_carry_retry_after_and_the_failure_guard_counts_failures_only(db: TestDb) {
    let mut cfg = db.config();
    cfg.enroll_rate_per_sec = 1;
    cfg.enroll_burst = 8;
    cfg.auth_failures_per_source_per_min = 3;
    let h = spawn_with_clock(cfg, Arc::new(Frozen))
        .await
        .expect("starts");
    let tok = token(&h, TokenKind::Ephemeral, Role::Member, &[], 10).await;
    let mut raw = ControlPlaneClient::connect(h.public_url().to_string())
        .await
        .expect("connect");
    let enroll = |t: &str, k: &Keypair| {
        EnrollRequest {
            token: t.to_string(),
            proof: None,
        }
        .proven(h.public_url(), k, unix_now())
    };
    // Successes are not failures: four members from one IP get in.
    for _ in 0..4 {
        raw.enroll(enroll(&tok, &Keypair::generate_ed25519()))
            .await
            .expect("enrolls");
    }
    // Three failures from this IP (each spent an enroll token: a made-up
    // token is looked up after the proof verified and the budget was
    // charged) put it over its limit.
    for _ in 0..3 {
        let s = raw
            .enroll(enroll("amt_wrong", &Keypair::generate_ed25519()))
            .await
            .expect_err("bad token");
        assert_eq!(s.code(), Code::Unauthenticated);
    }
    // From then on the guard refuses its made-up tokens in memory (the
    // token index holds no such digest), however often it asks, spending
    // none of the enroll budget and never reaching the database; a request
    // with nothing to verify is refused before any budget.
    for _ in 0..5 {
        let s = raw
            .enroll(enroll("amt_wrong", &Keypair::generate_ed25519()))
            .await
            .expect_err("guarded");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().starts_with("failure_guard"), "{}", s.message());
        assert!(
            s.message().contains("token not recognised"),
            "{}",
            s.message()
        );
        let wait = agentmesh_controlplane::retry_after(&s).expect("retry-after");
        assert!(
            wait >= Duration::from_secs(1) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
    }
    let s = raw
        .enroll(EnrollRequest::default())
        .await
        .expect_err("nothing to verify");
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert!(s.message().contains("carries no token"), "{}", s.message());
    // A member behind the same address with a real token is served: it
    // takes the burst's 8th token.
    raw.enroll(enroll(&tok, &Keypair::generate_ed25519()))
        .await
        .expect("a real token is served whatever its address's failures");
    // Another source: an empty request is refused as malformed (its source
    // is under its limit), and the spent budget refuses the next, before
    // looking at the token.
    let mut other = common::raw_client_from(&h, [127, 0, 0, 2]).await;
    let s = other
        .enroll(EnrollRequest::default())
        .await
        .expect_err("malformed");
    assert_eq!(s.code(), Code::InvalidArgument);
    let s = other
        .enroll(enroll("amt_unknown", &Keypair::generate_ed25519()))
        .await
        .expect_err("limited");
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert!(s.message().contains("enroll limit"), "{}", s.message());
    assert_eq!(
        agentmesh_controlplane::retry_after(&s),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM enrollment_requests WHERE outcome = 'unknown_token'")
            .await,
        3,
        "only the made-up tokens sent under the limit reached the database"
    );
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"failure_guard\"}"
        ),
        Some(6.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"enroll\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"refresh\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_token_index_loads_total{result=\"complete\"}"
        ),
        Some(1.0),
        "loaded once: the clock is frozen and nothing was minted since"
    );
    h.shutdown().await;
}

/// Members share source addresses (a NAT, a pod network): refusals of
/// callers that proved their key and hold a credential we signed (a
/// revoked token, a revoked credential, an expired one) are not failures
/// for the source's guard, so they never lock out the members beside them;
/// forged credentials from the same source still are.
async fn refusals_of_proven_callers_do_not_block_their_source(db: TestDb) {
    let mut cfg = db.config();
    cfg.auth_failures_per_source_per_min = 3;
    let h = spawn(cfg).await.expect("starts");
    let c = client(&h);
    let revoked_tok = token(&h, TokenKind::Ephemeral, Role::Member, &[], 10).await;
    let good_tok = token(&h, TokenKind::Ephemeral, Role::Member, &[], 2).await;
    let a = Keypair::generate_ed25519();
    let cred_a = c
        .enroll(&revoked_tok, &a)
        .await
        .expect("a enrolls")
        .credential
        .expect("cred");
    let m = Keypair::generate_ed25519();
    let cred_m = c
        .enroll(&good_tok, &m)
        .await
        .expect("the bystander enrolls")
        .credential
        .expect("cred");
    let token_id = peek_claims(&cred_a).expect("claims").token_id;
    c.revoke_token(ADMIN, &token_id, "test")
        .await
        .expect("revokes");

    // Twice the guard's limit of each, all from this one address.
    for _ in 0..6 {
        let other = Keypair::generate_ed25519();
        assert_eq!(
            code(c.enroll(&revoked_tok, &other).await),
            Code::PermissionDenied
        );
        assert_eq!(code(c.refresh(&cred_a, &a).await), Code::PermissionDenied);
    }
    let (key_id, key) = server_key(&db).await;
    let mut claims = peek_claims(&cred_m).expect("claims");
    let now = unix_now();
    claims.key_id = key_id;
    claims.issued_at_unix_secs = now - 10_000;
    claims.expires_at_unix_secs = now - 5_000;
    let expired = sign(&claims, &key);
    for _ in 0..6 {
        match c.refresh(&expired, &m).await {
            Err(ClientError::Refused(s)) => {
                assert_eq!(s.code(), Code::Unauthenticated);
                assert!(s.message().contains("expired"), "{}", s.message());
            }
            other => panic!("expected an expired refusal: {other:?}"),
        }
    }
    let cred_m = c
        .refresh(&cred_m, &m)
        .await
        .expect("the bystander on the same address still refreshes")
        .credential
        .expect("cred");
    let metrics_now = metrics(&h).await;
    assert_eq!(
        metric(
            &metrics_now,
            r#"agentmesh_control_plane_auth_failures_total{method="Refresh",reason="credential_expired"}"#
        ),
        Some(6.0)
    );
    assert_eq!(
        metric(
            &metrics_now,
            r#"agentmesh_control_plane_limiter_refusals_total{limiter="failure_guard"}"#
        ),
        Some(0.0)
    );

    // Forgeries from the same address are failures: three put it over its
    // limit, and the guard refuses the next forgery (a raw client: ours
    // would wait out the guard's retry-after).
    let mut forged = cred_m.clone();
    forged.signature[0] ^= 1;
    for _ in 0..3 {
        assert_eq!(code(c.refresh(&forged, &m).await), Code::Unauthenticated);
    }
    let mut raw = ControlPlaneClient::connect(h.public_url().to_string())
        .await
        .expect("connect");
    let refresh = |cred: &Credential| {
        RefreshRequest {
            credential: Some(cred.clone()),
            proof: None,
        }
        .proven(h.public_url(), &m, unix_now())
    };
    let s = raw
        .refresh(refresh(&forged))
        .await
        .expect_err("the source is over its failures");
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert!(s.message().starts_with("failure_guard"), "{}", s.message());
    assert!(
        s.message().contains("credential refused"),
        "{}",
        s.message()
    );
    // The bystander's real credential is still served from that address.
    raw.refresh(refresh(&cred_m))
        .await
        .expect("a verified caller is served whatever its address's failures");
    h.shutdown().await;
}

async fn admin_calls_need_the_bearer_token_and_rotation_publishes_ahead(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let req = agentmesh_proto::pb::controlplane::CreateTokenRequest {
        kind: TokenKind::Bootstrap as i32,
        role: Role::Router as i32,
        labels: vec![label("zone", "a")],
        max_uses: 1,
        ttl_secs: 600,
    };
    assert_eq!(
        code(c.create_token("not-the-admin-token", req.clone()).await),
        Code::Unauthenticated
    );
    let mut bad = req.clone();
    bad.role = 0;
    assert_eq!(
        code(c.create_token(ADMIN, bad).await),
        Code::InvalidArgument
    );
    let t = c.create_token(ADMIN, req).await.expect("admin mints");
    assert!(t.token.starts_with("amt_"));
    let k = Keypair::generate_ed25519();
    let cred = c
        .enroll(&t.token, &k)
        .await
        .expect("router enrolls")
        .credential
        .expect("cred");
    let before: Claims = peek_claims(&cred).expect("claims");
    assert_eq!(before.role, Role::Router as i32);

    let rot = c.rotate_key_now(ADMIN).await.expect("rotates");
    let keys = c.get_keys().await.expect("keys");
    assert_eq!(keys.keys.len(), 2, "new key published beside the old one");
    let new = keys
        .keys
        .iter()
        .find(|k| k.key_id == rot.key_id)
        .expect("new key listed");
    assert!(
        new.active_from_unix_secs >= unix_now() + 590,
        "published 600 s ahead"
    );
    let old = keys
        .keys
        .iter()
        .find(|k| k.key_id == before.key_id)
        .expect("old key listed");
    assert_eq!(old.verify_until_unix_secs, new.active_from_unix_secs + 7200);
    // Until it is active, credentials are still signed with the old key.
    let again = c
        .enroll(&t.token, &k)
        .await
        .expect("re-enroll")
        .credential
        .expect("cred");
    assert_eq!(peek_claims(&again).expect("claims").key_id, before.key_id);

    // Without an admin token configured, admin calls are denied (not unauthenticated).
    let other = db.another().await;
    let h2 = agentmesh_controlplane::spawn(agentmesh_controlplane::Config {
        admin_token: None,
        ..other.config()
    })
    .await
    .expect("starts");
    assert_eq!(
        code(client(&h2).rotate_key_now(ADMIN).await),
        Code::PermissionDenied
    );
    h2.shutdown().await;
    h.shutdown().await;
}

/// Refused callers are handed successive slots (one token interval apart,
/// sent as whole seconds) up to the cap, on both spreading budgets, and the
/// metrics show what they were told and when the cap bit; a router lease has
/// a budget of its own and is told the next token. The budgets are charged
/// only after the proof (and the credential) verified, so the requests are
/// well formed.
#[tokio::test]
async fn refused_callers_get_successive_slots_up_to_the_cap_on_both_limiters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = common::config(dir.path());
    (cfg.enroll_rate_per_sec, cfg.enroll_burst) = (2, 3);
    cfg.enroll_max_retry_after_secs = 3;
    (cfg.refresh_rate_per_sec, cfg.refresh_burst) = (1, 1);
    cfg.refresh_max_retry_after_secs = 2;
    (cfg.lease_rate_per_sec, cfg.lease_burst) = (1, 1);
    let h = spawn_with_clock(cfg, Arc::new(Frozen))
        .await
        .expect("starts");
    let mut raw = ControlPlaneClient::connect(h.public_url().to_string())
        .await
        .expect("connect");
    let url = h.public_url().to_string();
    let enroll = |t: &str, k: &Keypair| {
        EnrollRequest {
            token: t.to_string(),
            proof: None,
        }
        .proven(&url, k, unix_now())
    };
    // A member and a router take two of the three enroll tokens.
    let (member, router) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let member_tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[], 1).await;
    let member_cred = raw
        .enroll(enroll(&member_tok, &member))
        .await
        .expect("member enrolls")
        .into_inner()
        .credential
        .expect("cred");
    let router_cred = raw
        .enroll(enroll(&router_tok, &router))
        .await
        .expect("router enrolls")
        .into_inner()
        .credential
        .expect("cred");
    let mut told = Vec::new();
    for _ in 0..9 {
        match raw
            .enroll(enroll("amt_unknown", &Keypair::generate_ed25519()))
            .await
        {
            Err(s) if s.code() == Code::ResourceExhausted => told.push(
                agentmesh_controlplane::retry_after(&s)
                    .expect("retry-after")
                    .as_secs(),
            ),
            Err(s) => assert_eq!(s.code(), Code::Unauthenticated, "the one admitted: {s:?}"),
            Ok(r) => panic!("an unknown token enrolled: {r:?}"),
        }
    }
    // 2/s: slots at 0.5, 1.0, 1.5, ... s, rounded up; past 3 s, the cap.
    assert_eq!(told, [1, 1, 2, 2, 3, 3, 3, 3]);
    let refresh = || {
        RefreshRequest {
            credential: Some(member_cred.clone()),
            proof: None,
        }
        .proven(&url, &member, unix_now())
    };
    let mut told = Vec::new();
    for _ in 0..5 {
        match raw.refresh(refresh()).await {
            Err(s) if s.code() == Code::ResourceExhausted => told.push(
                agentmesh_controlplane::retry_after(&s)
                    .expect("retry-after")
                    .as_secs(),
            ),
            Err(s) => panic!("refused otherwise: {s:?}"),
            Ok(_) => told.push(0),
        }
    }
    assert_eq!(told, [0, 1, 2, 2, 2]);
    // A router lease has its own budget, untouched by the refreshes; once it
    // is spent the router is told the next token (1 s at 1/s), never a slot
    // further ahead: its lease would expire waiting its turn.
    let lease = || {
        RouterLeaseRequest {
            credential: Some(router_cred.clone()),
            ..RouterLeaseRequest::default()
        }
        .proven(&url, &router, unix_now())
    };
    raw.router_lease(lease())
        .await
        .expect("the lease budget is its own");
    let s = raw.router_lease(lease()).await.expect_err("lease refused");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().starts_with("lease limit"), "{}", s.message());
    assert_eq!(
        agentmesh_controlplane::retry_after(&s),
        Some(Duration::from_secs(1))
    );
    let m = metrics(&h).await;
    for (limiter, refused, capped) in [("enroll", 8.0, 2.0), ("refresh", 4.0, 2.0)] {
        assert_eq!(
            metric(
                &m,
                &format!(
                    "agentmesh_control_plane_retry_after_seconds_count{{limiter=\"{limiter}\"}}"
                )
            ),
            Some(refused),
            "{limiter}"
        );
        assert_eq!(
            metric(
                &m,
                &format!(
                    "agentmesh_control_plane_retry_after_capped_total{{limiter=\"{limiter}\"}}"
                )
            ),
            Some(capped),
            "{limiter}"
        );
    }
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"lease\"}"
        ),
        Some(1.0)
    );
    h.shutdown().await;
}

/// Wrong admin bearer tokens feed the same per-source failure guard as
/// failed enrollments: after `--auth-failures-per-source-per-min` of them a
/// wrong or missing token from that source is refused by the guard (with
/// `retry-after`), while the right token, and a member's real enrollment
/// token, are still served from it.
async fn wrong_admin_tokens_feed_the_failure_guard(db: TestDb) {
    let mut cfg = db.config();
    cfg.auth_failures_per_source_per_min = 3;
    let h = spawn_with_clock(cfg, Arc::new(Frozen))
        .await
        .expect("starts");
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 10).await;
    let mut raw = ControlPlaneClient::connect(h.public_url().to_string())
        .await
        .expect("connect");
    let rotate = |bearer: Option<&str>| {
        let mut r = tonic::Request::new(RotateKeyNowRequest {});
        if let Some(b) = bearer {
            r.metadata_mut().insert(
                "authorization",
                format!("Bearer {b}").parse().expect("ascii"),
            );
        }
        r
    };
    for bearer in [Some("wrong-admin-token-000000"), None, Some("guess")] {
        let s = raw
            .rotate_key_now(rotate(bearer))
            .await
            .expect_err("wrong admin token");
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    }
    for bearer in [Some("wrong-admin-token-000001"), None] {
        let s = raw
            .rotate_key_now(rotate(bearer))
            .await
            .expect_err("guarded");
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert!(s.message().starts_with("failure_guard"), "{}", s.message());
        assert!(agentmesh_controlplane::retry_after(&s).is_some());
    }
    raw.rotate_key_now(rotate(Some(ADMIN)))
        .await
        .expect("the right token is served whatever its address's failures");
    raw.enroll(
        EnrollRequest {
            token: tok.clone(),
            proof: None,
        }
        .proven(h.public_url(), &Keypair::generate_ed25519(), unix_now()),
    )
    .await
    .expect("so is a member's real token from the same address");
    // Another source with the right token is served.
    let mut other = common::raw_client_from(&h, [127, 0, 0, 3]).await;
    other
        .rotate_key_now(rotate(Some(ADMIN)))
        .await
        .expect("another source is served");
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_auth_failures_total{method=\"RotateKeyNow\",reason=\"admin_token\"}"
        ),
        Some(4.0),
        "three before the guard, one wrong token after"
    );
    assert_eq!(
        metric(
            &m,
            "agentmesh_control_plane_limiter_refusals_total{limiter=\"failure_guard\"}"
        ),
        Some(2.0)
    );
    h.shutdown().await;
}

/// An embedded admin token is held to the same minimum length as one read
/// from `--admin-token-file`.
#[tokio::test]
async fn a_short_embedded_admin_token_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = agentmesh_controlplane::Config {
        admin_token: Some("too-short".into()),
        ..common::config(dir.path())
    };
    match agentmesh_controlplane::spawn(cfg).await {
        Err(agentmesh_controlplane::SpawnError::Config(m)) => {
            assert!(m.contains("16 characters"), "{m}")
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

on_both!(
    #[tokio::test]
    enroll_refresh_and_re_enroll_without_spending_a_use,
    expired_forged_other_peer_and_revoked_credentials_are_refused,
    router_leases_need_role_router_and_allowed_labels,
    limiter_refusals_carry_retry_after_and_the_failure_guard_counts_failures_only,
    refusals_of_proven_callers_do_not_block_their_source,
    admin_calls_need_the_bearer_token_and_rotation_publishes_ahead,
    wrong_admin_tokens_feed_the_failure_guard,
);
