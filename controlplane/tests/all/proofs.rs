//! Proofs of possession bound to their request, attacked against a real
//! control plane on loopback, on both backends: a proof seen in flight
//! (valid for ±5 min) is moved onto another request (another token,
//! another credential of the same key, other lease addresses, labels,
//! load or draining flag) and refused `UNAUTHENTICATED`/`bad_proof`, with
//! nothing changed; replayed with its own request it does exactly what
//! that request did (an idempotent re-enrollment, the same lease, a watch),
//! nothing more. And the consequence side: a key enrolled as a router
//! becomes a member only by its own, freshly bound proof; and an old,
//! unbound proof is refused with a message that says why.

use agentmesh_proto::{
    credential::{Trust, verify},
    identity::Keypair,
    pb::{
        controlplane::{
            EnrollRequest, EnrollResponse, GetDirectoryRequest, ProofOfPossession, RefreshRequest,
            RouterInfo, RouterLeaseRequest, RouterLoad, WatchRequest,
            control_plane_client::ControlPlaneClient,
        },
        credential::{Credential, Label, Role, TokenKind},
    },
    proof::Bound,
    unix_now,
};
use tonic::{Code, Status, transport::Channel};

use crate::common::{self, TestDb, metric, metrics, token};

type Raw = ControlPlaneClient<Channel>;

fn enroll_req(token: &str, key: &Keypair, url: &str) -> EnrollRequest {
    EnrollRequest {
        token: token.to_string(),
        proof: None,
    }
    .proven(url, key, unix_now())
}

fn refresh_req(cred: &Credential, key: &Keypair, url: &str) -> RefreshRequest {
    RefreshRequest {
        credential: Some(cred.clone()),
        proof: None,
    }
    .proven(url, key, unix_now())
}

fn watch_req(cred: &Credential, key: &Keypair, url: &str) -> WatchRequest {
    WatchRequest {
        credential: Some(cred.clone()),
        proof: None,
    }
    .proven(url, key, unix_now())
}

/// A lease for `addrs`, labelled `zone=a`, not draining.
fn lease_req(cred: &Credential, key: &Keypair, url: &str, addrs: &[&str]) -> RouterLeaseRequest {
    RouterLeaseRequest {
        credential: Some(cred.clone()),
        proof: None,
        addrs: addrs.iter().map(|a| a.to_string()).collect(),
        labels: vec![zone_a()],
        load: Some(RouterLoad {
            attached_members: 3,
            transit_connections: 1,
            high_watermark: 100,
            low_watermark: 85,
        }),
        draining: false,
    }
    .proven(url, key, unix_now())
}

fn zone_a() -> Label {
    Label {
        key: "zone".into(),
        value: "a".into(),
    }
}

/// The refusal of a moved proof: `UNAUTHENTICATED`, naming the proof.
fn assert_bad_proof<T: std::fmt::Debug>(r: Result<T, Status>, what: &str) {
    match r {
        Err(s) => {
            assert_eq!(s.code(), Code::Unauthenticated, "{what}: {s:?}");
            assert!(s.message().contains("proof"), "{what}: {}", s.message());
        }
        Ok(v) => panic!("{what}: a moved proof was accepted: {v:?}"),
    }
}

fn bad_proofs(m: &str, method: &str) -> f64 {
    metric(
        m,
        &format!(
            r#"agentmesh_control_plane_auth_failures_total{{method="{method}",reason="bad_proof"}}"#
        ),
    )
    .unwrap_or(0.0)
}

async fn raw(h: &agentmesh_controlplane::Handle) -> Raw {
    common::raw_client_from(h, [127, 0, 0, 1]).await
}

/// The role and `zone` label of the credential in `resp`, verified offline.
fn role_and_zone(cred: &Credential, keys: &Trust, key: &Keypair) -> (Role, Option<String>) {
    let v = verify(cred, keys, unix_now(), Some(&key.public().to_peer_id()), 0)
        .expect("the credential verifies offline");
    (v.role(), v.labels().get("zone").cloned())
}

fn enrolled(resp: EnrollResponse) -> (Credential, Trust, String) {
    let trust = Trust::new(resp.keys.as_ref().expect("key set"));
    (resp.credential.expect("credential"), trust, resp.node_id)
}

async fn router_entry(raw: &mut Raw, key: &Keypair) -> Option<RouterInfo> {
    let d = raw
        .get_directory(GetDirectoryRequest::default())
        .await
        .expect("directory")
        .into_inner();
    let peer = key.public().to_peer_id().to_bytes();
    d.routers.into_iter().find(|r| r.peer_id == peer)
}

/// A router enrolls with its router token; an attacker who saw that
/// request pairs its proof with a member token. Refused, and the router is
/// untouched: still a router in the database, its lease accepted, its
/// refresh a router credential, the member token not spent. The proof
/// replayed with its own token re-enrolls the same node, spending nothing.
async fn an_enroll_proof_moved_onto_another_token_is_refused(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[("zone", "a")], 1).await;
    let member_tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("zone", "m")], 5).await;
    let mut raw = raw(&h).await;
    let router = Keypair::generate_ed25519();
    let seen = enroll_req(&router_tok, &router, &url);
    let (cred, trust, node_id) = enrolled(
        raw.enroll(seen.clone())
            .await
            .expect("the router enrolls")
            .into_inner(),
    );
    assert_eq!(
        role_and_zone(&cred, &trust, &router),
        (Role::Router, Some("a".into()))
    );

    let moved = EnrollRequest {
        token: member_tok.clone(),
        proof: seen.proof.clone(),
    };
    assert_bad_proof(raw.enroll(moved).await, "enroll proof with a member token");

    // Nothing changed: a router in the database, the member token unspent.
    assert_eq!(
        db.count("SELECT COUNT(*) FROM nodes WHERE role = 2").await,
        1,
        "still a router"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM tokens WHERE uses > 0").await,
        1
    );
    raw.router_lease(lease_req(
        &cred,
        &router,
        &url,
        &["/ip4/127.0.0.1/tcp/4001"],
    ))
    .await
    .expect("the router's lease is still accepted");
    let refreshed = raw
        .refresh(refresh_req(&cred, &router, &url))
        .await
        .expect("the router refreshes")
        .into_inner()
        .credential
        .expect("credential");
    assert_eq!(
        role_and_zone(&refreshed, &trust, &router),
        (Role::Router, Some("a".into())),
        "Refresh still returns a router credential"
    );

    // The seen request replayed whole: the same node again, no use spent.
    let (again, _, again_id) = enrolled(
        raw.enroll(seen)
            .await
            .expect("replayed with its own token")
            .into_inner(),
    );
    assert_eq!(again_id, node_id);
    assert_eq!(
        role_and_zone(&again, &trust, &router),
        (Role::Router, Some("a".into()))
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM tokens WHERE uses > 0").await,
        1
    );

    let m = metrics(&h).await;
    assert_eq!(bad_proofs(&m, "Enroll"), 1.0);
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_control_plane_enrollments_total{result="re_enrolled"}"#
        ),
        Some(1.0)
    );
    h.shutdown().await;
}

/// A key enrolled as a router with two router tokens holds two valid
/// credentials. A Refresh proof made with one, moved onto the other, is
/// refused; with its own credential it refreshes.
async fn a_refresh_proof_moved_onto_another_credential_is_refused(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let mut raw = raw(&h).await;
    let router = Keypair::generate_ed25519();
    let (first, second) = two_credentials(&h, &mut raw, &router).await;
    let seen = refresh_req(&first, &router, &url);
    let moved = RefreshRequest {
        credential: Some(second.clone()),
        proof: seen.proof.clone(),
    };
    assert_bad_proof(
        raw.refresh(moved).await,
        "refresh proof on another credential",
    );
    raw.refresh(seen).await.expect("with its own credential");
    assert_eq!(bad_proofs(&metrics(&h).await, "Refresh"), 1.0);
    h.shutdown().await;
}

/// A router's lease, seen in flight, replayed with other addresses (the
/// directory would send members elsewhere), another label set, another
/// load, draining (members would leave it), or another credential of the
/// same key: each refused, the directory entry unchanged. Replayed whole it
/// renews the same lease.
async fn a_lease_proof_moved_onto_other_lease_fields_is_refused(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let mut raw = raw(&h).await;
    let router = Keypair::generate_ed25519();
    let (first, second) = two_credentials(&h, &mut raw, &router).await;
    let seen = lease_req(&first, &router, &url, &["/ip4/127.0.0.1/tcp/4001"]);
    raw.router_lease(seen.clone()).await.expect("the lease");
    let before = router_entry(&mut raw, &router)
        .await
        .expect("in the directory");

    let moves: Vec<(&str, RouterLeaseRequest)> = vec![
        (
            "other addresses",
            RouterLeaseRequest {
                addrs: vec!["/ip4/192.0.2.66/tcp/4001".into()],
                ..seen.clone()
            },
        ),
        (
            "an added address",
            RouterLeaseRequest {
                addrs: vec![
                    "/ip4/127.0.0.1/tcp/4001".into(),
                    "/ip4/192.0.2.66/tcp/4001".into(),
                ],
                ..seen.clone()
            },
        ),
        (
            "no labels",
            RouterLeaseRequest {
                labels: vec![],
                ..seen.clone()
            },
        ),
        (
            "a full load",
            RouterLeaseRequest {
                load: Some(RouterLoad {
                    attached_members: 100,
                    ..seen.load.unwrap_or_default()
                }),
                ..seen.clone()
            },
        ),
        (
            "draining",
            RouterLeaseRequest {
                draining: true,
                ..seen.clone()
            },
        ),
        (
            "another credential",
            RouterLeaseRequest {
                credential: Some(second.clone()),
                ..seen.clone()
            },
        ),
    ];
    let n = moves.len();
    for (what, req) in moves {
        assert_bad_proof(raw.router_lease(req).await, what);
    }
    let after = router_entry(&mut raw, &router).await.expect("still listed");
    assert_eq!(after.addrs, before.addrs);
    assert_eq!(after.labels, before.labels);
    assert_eq!(after.load, before.load);
    assert!(!after.draining);
    raw.router_lease(seen)
        .await
        .expect("replayed whole: renewed");
    let renewed = router_entry(&mut raw, &router).await.expect("listed");
    assert_eq!(
        (
            renewed.addrs,
            renewed.labels,
            renewed.load,
            renewed.draining
        ),
        (before.addrs, before.labels, before.load, before.draining)
    );
    assert_eq!(bad_proofs(&metrics(&h).await, "RouterLease"), n as f64);
    h.shutdown().await;
}

/// A Watch proof made with one of the key's credentials, moved onto the
/// other, is refused; with its own credential the watch opens.
async fn a_watch_proof_moved_onto_another_credential_is_refused(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let mut raw = raw(&h).await;
    let router = Keypair::generate_ed25519();
    let (first, second) = two_credentials(&h, &mut raw, &router).await;
    let seen = watch_req(&first, &router, &url);
    let moved = WatchRequest {
        credential: Some(second),
        proof: seen.proof.clone(),
    };
    assert_bad_proof(raw.watch(moved).await, "watch proof on another credential");
    let stream = raw.watch(seen).await.expect("with its own credential");
    drop(stream);
    assert_eq!(bad_proofs(&metrics(&h).await, "Watch"), 1.0);
    h.shutdown().await;
}

/// `key` enrolled with two router tokens: two valid router credentials of
/// the same key, which differ (their token ids do).
async fn two_credentials(
    h: &agentmesh_controlplane::Handle,
    raw: &mut Raw,
    key: &Keypair,
) -> (Credential, Credential) {
    let url = h.public_url().to_string();
    let mut creds = Vec::new();
    for _ in 0..2 {
        let tok = token(h, TokenKind::Bootstrap, Role::Router, &[("zone", "a")], 1).await;
        let resp = raw
            .enroll(enroll_req(&tok, key, &url))
            .await
            .expect("enrolls")
            .into_inner();
        creds.push(resp.credential.expect("credential"));
    }
    let second = creds.pop().expect("two");
    let first = creds.pop().expect("two");
    assert_ne!(first, second);
    (first, second)
}

/// The consequence side, decided: a key enrolled as a router may enroll
/// again through a member token, but only with a proof it made for that
/// token (its holder's own choice, as re-enrolling with any new token is).
/// The node is then a member: its leases are refused `PERMISSION_DENIED`
/// (`wrong_role`, the database's role, even with the router credential it
/// still holds), and Refresh returns a member credential.
async fn a_router_key_becomes_a_member_only_by_its_own_proof(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let router_tok = token(&h, TokenKind::Bootstrap, Role::Router, &[("zone", "a")], 1).await;
    let member_tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("zone", "m")], 1).await;
    let mut raw = raw(&h).await;
    let key = Keypair::generate_ed25519();
    let (router_cred, trust, node_id) = enrolled(
        raw.enroll(enroll_req(&router_tok, &key, &url))
            .await
            .expect("router")
            .into_inner(),
    );
    let (member_cred, _, member_node) = enrolled(
        raw.enroll(enroll_req(&member_tok, &key, &url))
            .await
            .expect("the key holder's own choice")
            .into_inner(),
    );
    assert_eq!(member_node, node_id, "the same node");
    assert_eq!(
        role_and_zone(&member_cred, &trust, &key),
        (Role::Member, Some("m".into()))
    );
    let s = raw
        .router_lease(lease_req(
            &router_cred,
            &key,
            &url,
            &["/ip4/127.0.0.1/tcp/1"],
        ))
        .await
        .expect_err("no longer a router");
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let refreshed = raw
        .refresh(refresh_req(&router_cred, &key, &url))
        .await
        .expect("refreshes")
        .into_inner()
        .credential
        .expect("credential");
    assert_eq!(
        role_and_zone(&refreshed, &trust, &key),
        (Role::Member, Some("m".into()))
    );
    h.shutdown().await;
}

/// A program older than the control plane signs proofs in format v1 (no
/// binding): refused `UNAUTHENTICATED` with a message that says to upgrade
/// it, counted as `old_proof`, and nothing enrolled.
async fn an_old_format_proof_is_refused_with_a_clear_error(db: TestDb) {
    let h = db.start().await;
    let url = h.public_url().to_string();
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let mut raw = raw(&h).await;
    let key = Keypair::generate_ed25519();
    let now = unix_now();
    // The v1 message, as an older program wrote it: domain, endpoint,
    // PeerId, time; nothing of the request.
    let peer = key.public().to_peer_id().to_bytes();
    let mut v1 = b"agentmesh enroll v1\0".to_vec();
    v1.extend_from_slice(&(url.len() as u32).to_be_bytes());
    v1.extend_from_slice(url.as_bytes());
    v1.extend_from_slice(&(peer.len() as u32).to_be_bytes());
    v1.extend_from_slice(&peer);
    v1.extend_from_slice(&now.to_be_bytes());
    let old = EnrollRequest {
        token: tok,
        proof: Some(ProofOfPossession {
            public_key: key.public().encode_protobuf(),
            timestamp_unix_secs: now,
            signature: key.sign(&v1).expect("signs"),
        }),
    };
    let s = raw.enroll(old).await.expect_err("an old-format proof");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(
        s.message().contains("old v1 format") && s.message().contains("upgrade"),
        "{}",
        s.message()
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 0);
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_control_plane_auth_failures_total{method="Enroll",reason="old_proof"}"#
        ),
        Some(1.0)
    );
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    an_enroll_proof_moved_onto_another_token_is_refused,
    a_refresh_proof_moved_onto_another_credential_is_refused,
    a_lease_proof_moved_onto_other_lease_fields_is_refused,
    a_watch_proof_moved_onto_another_credential_is_refused,
    a_router_key_becomes_a_member_only_by_its_own_proof,
    an_old_format_proof_is_refused_with_a_clear_error,
);
