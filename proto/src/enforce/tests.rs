use super::*;
use crate::pb::credential::{Credential, Revocation};
use crate::testing::{TestCp as Cp, WEB_TO_PAYMENTS as POLICY};

fn cp() -> Cp {
    Cp::new()
}

/// Credentials of these tests are valid from 1000 to 5000.
fn credential(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> Credential {
    cp.member(peer, team, token, 1000..5000)
}

fn record(
    provider: &PeerId,
    services: &[&str],
    expires: i64,
    cred: Option<Credential>,
) -> ServiceRecord {
    ServiceRecord {
        provider: provider.to_bytes(),
        services: services.iter().map(|s| s.to_string()).collect(),
        routers: vec![],
        issued_at_unix_secs: 1000,
        expires_at_unix_secs: expires,
        credential: cred,
    }
}

fn peer() -> PeerId {
    libp2p_identity::Keypair::generate_ed25519()
        .public()
        .to_peer_id()
}

#[test]
fn a_policy_is_taken_only_verified_parsed_and_newer() {
    let cp = cp();
    let v1 = HeldPolicy::accept(&cp.policy(7, 1, 100, POLICY), &cp.trust, None).expect("v1");
    assert_eq!((v1.epoch, v1.version), (7, 1));
    let v2 = HeldPolicy::accept(&cp.policy(7, 2, 200, POLICY), &cp.trust, Some(&v1)).expect("v2");
    // Older or equal versions of the same epoch are stale.
    for v in [1, 2] {
        let r = HeldPolicy::accept(&cp.policy(7, v, 300, POLICY), &cp.trust, Some(&v2));
        assert_eq!(r.expect_err("refused").reason(), "stale");
    }
    // A replayed document of an older epoch is stale; a later epoch is taken.
    let r = HeldPolicy::accept(&cp.policy(6, 9, 150, POLICY), &cp.trust, Some(&v2));
    assert_eq!(r.expect_err("refused").reason(), "stale");
    assert!(HeldPolicy::accept(&cp.policy(8, 1, 400, POLICY), &cp.trust, Some(&v2)).is_ok());
    // Another signer, a tampered document, a text this build cannot parse.
    let other = self::cp();
    let r = HeldPolicy::accept(&other.policy(7, 3, 300, POLICY), &cp.trust, Some(&v2));
    assert_eq!(r.expect_err("refused").reason(), "bad_signature");
    let mut tampered = cp.policy(7, 3, 300, POLICY);
    let last = tampered.document.len() - 1;
    tampered.document[last] ^= 1;
    assert!(HeldPolicy::accept(&tampered, &cp.trust, Some(&v2)).is_err());
    let r = HeldPolicy::accept(&cp.policy(7, 3, 300, "format = 99"), &cp.trust, Some(&v2));
    assert_eq!(r.expect_err("refused").reason(), "unparsable");
    // What a holder reporting a version lacks.
    assert!(v2.is_newer_than(0, 0));
    assert!(v2.is_newer_than(7, 1));
    assert!(!v2.is_newer_than(7, 2));
    assert!(v2.is_newer_than(6, 2));
    for r in ["stale", "unparsable", "bad_signature"] {
        assert!(PolicyRejection::REASONS.contains(&r));
    }
}

#[test]
fn a_record_proves_ownership_only_with_its_own_valid_credential() {
    let cp = cp();
    let policy = Policy::parse(POLICY).expect("policy");
    let (pay, web) = (peer(), peer());
    let pay_cred = credential(&cp, &pay, "payments", "t1");
    let check = |r: &ServiceRecord, p: &PeerId, trust: &Trust| {
        check_ownership(r, p, trust, &policy, 2000, 60).map(|c| c.peer)
    };
    // The owner's own record.
    let ok = record(&pay, &["payments/api"], 4000, Some(pay_cred.clone()));
    assert_eq!(check(&ok, &pay, &cp.trust), Ok(pay));
    // A member of another team naming the service: not its owner.
    let impostor = record(
        &web,
        &["payments/api"],
        4000,
        Some(credential(&cp, &web, "web", "t2")),
    );
    assert_eq!(
        check(&impostor, &web, &cp.trust),
        Err(OwnershipError::NotOwner("payments/api".into()))
    );
    // One unowned name among owned ones refuses the whole record.
    let mixed = record(&pay, &["payments/api", "db"], 4000, Some(pay_cred.clone()));
    assert_eq!(
        check(&mixed, &pay, &cp.trust)
            .expect_err("refused")
            .reason(),
        "not_owner"
    );
    // The impostor carrying the owner's credential: not its subject.
    let stolen = record(&web, &["payments/api"], 4000, Some(pay_cred.clone()));
    assert_eq!(
        check(&stolen, &web, &cp.trust),
        Err(OwnershipError::WrongSubject)
    );
    // No credential, one past the record's expiry, a forged one.
    let bare = record(&pay, &["payments/api"], 4000, None);
    assert_eq!(
        check(&bare, &pay, &cp.trust),
        Err(OwnershipError::NoCredential)
    );
    let long = record(&pay, &["payments/api"], 9000, Some(pay_cred.clone()));
    assert_eq!(
        check(&long, &pay, &cp.trust),
        Err(OwnershipError::OutlivesCredential)
    );
    let forged = record(
        &pay,
        &["payments/api"],
        4000,
        Some(credential(&self::cp(), &pay, "payments", "t1")),
    );
    assert_eq!(
        check(&forged, &pay, &cp.trust)
            .expect_err("refused")
            .reason(),
        "bad_credential"
    );
    // Revoked by its token.
    let mut revoked = cp.trust.clone();
    revoked.set_revocations(&[Revocation {
        peer_id: vec![],
        until_unix_secs: 9000,
        reason: "leaked".into(),
        token_id: "t1".into(),
    }]);
    assert_eq!(
        check(&ok, &pay, &revoked).expect_err("refused").reason(),
        "revoked"
    );
}

#[test]
fn an_unknown_role_is_in_no_group() {
    let cp = cp();
    let policy = Policy::parse(agentmesh_policy::ALLOW_ALL).expect("allow all");
    let p = peer();
    let mut claims = crate::credential::verify(
        &credential(&cp, &p, "web", ""),
        &cp.trust,
        2000,
        Some(&p),
        0,
    )
    .expect("claims");
    assert!(!groups_of(&policy, &claims).is_empty());
    claims.claims.role = Role::Unspecified as i32;
    assert!(groups_of(&policy, &claims).is_empty());
}
