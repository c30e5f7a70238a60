use super::*;
use agentmesh_proto::credential::sign;
use agentmesh_proto::pb::credential::{Claims, Revocation, TokenKind};
use agentmesh_proto::pb::mesh::Purpose as P;
use libp2p::identity::ed25519;

/// The control plane: its key and trust (the shared fixture).
type Fixture = agentmesh_proto::testing::TestCp;

fn fixture() -> Fixture {
    Fixture::new()
}

fn claims(peer: &PeerId, role: Role, iat: i64, exp: i64) -> Claims {
    Claims {
        subject: peer.to_bytes(),
        node_id: "node-1".into(),
        role: role as i32,
        token_kind: TokenKind::Bootstrap as i32,
        labels: vec![],
        issued_at_unix_secs: iat,
        expires_at_unix_secs: exp,
        key_id: "k1".into(),
        token_id: String::new(),
    }
}

fn req(f: &Fixture, c: &Claims, purpose: P) -> AuthRequest {
    AuthRequest {
        credential: Some(sign(c, &f.key)),
        purpose: purpose as i32,
        attached_routers: vec![PeerId::random().to_bytes(), b"junk".to_vec()],
        ..Default::default()
    }
}

#[test]
fn member_attaches_until_its_credential_expires() {
    let f = fixture();
    let peer = PeerId::random();
    let a = decide(
        &req(&f, &claims(&peer, Role::Member, 100, 1000), P::Attach),
        &f.trust,
        500,
        &peer,
        0,
        &deny(),
    )
    .expect("admitted");
    assert_eq!(a.purpose, Purpose::Attach);
    assert_eq!(a.until, 1000);
    assert_eq!(a.node_id, "node-1");
    assert_eq!(a.attached_routers.len(), 1, "junk peer ids are dropped");
}

#[test]
fn refusals_carry_the_reason() {
    let f = fixture();
    let peer = PeerId::random();
    let good = claims(&peer, Role::Member, 100, 1000);
    let check = |r: &AuthRequest, now: i64, who: &PeerId| {
        decide(r, &f.trust, now, who, 10, &deny()).expect_err("refused")
    };
    // Forged: same key id, another signer.
    let forger = Fixture {
        key: ed25519::Keypair::generate(),
        trust: Trust::default(),
    };
    assert_eq!(
        check(&req(&forger, &good, P::Attach), 500, &peer).label,
        "bad_signature"
    );
    // Expired (beyond skew) and not yet valid.
    assert_eq!(
        check(&req(&f, &good, P::Attach), 1011, &peer).label,
        "expired"
    );
    assert_eq!(
        check(&req(&f, &good, P::Attach), 89, &peer).label,
        "not_yet_valid"
    );
    // Presented by another peer.
    let r = check(&req(&f, &good, P::Attach), 500, &PeerId::random());
    assert_eq!((r.reason, r.label), (AuthRefusal::WrongPeer, "wrong_peer"));
    // Unknown key id.
    let mut other_kid = good.clone();
    other_kid.key_id = "k2".into();
    let r = check(&req(&f, &other_kid, P::Attach), 500, &peer);
    assert!(r.is_unknown_key());
    // No credential, no purpose.
    let mut r0 = req(&f, &good, P::Attach);
    r0.credential = None;
    assert_eq!(check(&r0, 500, &peer).label, "malformed");
    assert_eq!(
        check(&req(&f, &good, P::Unspecified), 500, &peer).label,
        "malformed"
    );
}

#[test]
fn revoked_peers_are_refused() {
    let mut f = fixture();
    let peer = PeerId::random();
    f.trust.set_revocations(&[Revocation {
        peer_id: peer.to_bytes(),
        until_unix_secs: 2000,
        reason: "test".into(),
        token_id: String::new(),
    }]);
    let r = decide(
        &req(&f, &claims(&peer, Role::Member, 100, 1000), P::Attach),
        &f.trust,
        500,
        &peer,
        0,
        &deny(),
    )
    .expect_err("revoked");
    assert_eq!((r.reason, r.label), (AuthRefusal::Revoked, "revoked"));
}

#[test]
fn roles_limit_purposes() {
    let f = fixture();
    let peer = PeerId::random();
    let member = claims(&peer, Role::Member, 100, 1000);
    let router = claims(&peer, Role::Router, 100, 1000);
    let ok = |c: &Claims, p: P| decide(&req(&f, c, p), &f.trust, 500, &peer, 0, &deny());
    assert_eq!(
        ok(&member, P::Router).expect_err("member as router").label,
        "wrong_role"
    );
    assert!(ok(&member, P::Transit).is_ok());
    assert!(ok(&router, P::Router).is_ok());
    assert!(ok(&router, P::Transit).is_ok(), "a router may transit");
    assert_eq!(
        ok(&router, P::Attach).expect_err("router attach").label,
        "wrong_role"
    );
}

#[test]
fn no_keys_yet_is_a_refusal_not_a_panic() {
    let f = fixture();
    let peer = PeerId::random();
    let r = decide(
        &req(&f, &claims(&peer, Role::Member, 100, 1000), P::Attach),
        &Trust::default(),
        500,
        &peer,
        0,
        &deny(),
    )
    .expect_err("no keys");
    assert_eq!(r.label, "no_keys");
}

/// The policy of a control plane that has none.
fn deny() -> std::sync::Arc<agentmesh_policy::Policy> {
    std::sync::Arc::new(agentmesh_policy::Policy::deny_all())
}
