use super::*;
use crate::pb::credential::PublicKey;
use proptest::prelude::*;

fn setup() -> (ed25519::Keypair, KeySet, PeerId, libp2p_identity::Keypair) {
    let cp = ed25519::Keypair::generate();
    let keys = KeySet {
        keys: vec![PublicKey {
            key_id: "k1".into(),
            ed25519: cp.public().to_bytes().to_vec(),
            active_from_unix_secs: 0,
            verify_until_unix_secs: 0,
        }],
        ..Default::default()
    };
    let member = libp2p_identity::Keypair::generate_ed25519();
    (cp, keys, member.public().to_peer_id(), member)
}

fn claims_for(peer: &PeerId, now: i64) -> Claims {
    Claims {
        subject: peer.to_bytes(),
        node_id: "n1".into(),
        role: Role::Member as i32,
        token_kind: TokenKind::Bootstrap as i32,
        labels: vec![Label {
            key: "team".into(),
            value: "a".into(),
        }],
        issued_at_unix_secs: now,
        expires_at_unix_secs: now + 3600,
        key_id: "k1".into(),
        token_id: String::new(),
    }
}

#[test]
fn valid_credential_verifies() {
    let (cp, keys, peer, _) = setup();
    let cred = sign(&claims_for(&peer, 1000), &cp);
    let v = verify(&cred, &Trust::new(&keys), 1001, Some(&peer), 60).expect("valid");
    assert_eq!(v.peer, peer);
    assert_eq!(v.role(), Role::Member);
    assert_eq!(v.labels().get("team").map(String::as_str), Some("a"));
}

#[test]
fn each_refusal_has_its_type() {
    let (cp, keys, peer, _) = setup();
    let trust = Trust::new(&keys);
    let cred = sign(&claims_for(&peer, 1000), &cp);

    // Expired (beyond skew) and not yet valid (beyond skew).
    assert!(matches!(
        verify(&cred, &trust, 1000 + 3600 + 61, Some(&peer), 60),
        Err(CredentialError::Expired { .. })
    ));
    assert!(verify(&cred, &trust, 1000 + 3600 + 59, Some(&peer), 60).is_ok());
    assert!(matches!(
        verify(&cred, &trust, 1000 - 61, Some(&peer), 60),
        Err(CredentialError::NotYetValid { .. })
    ));

    // Another peer presenting it.
    let other = PeerId::random();
    assert_eq!(
        verify(&cred, &trust, 1001, Some(&other), 60),
        Err(CredentialError::WrongPeer)
    );

    // Forged: signed by a key that is not the control plane's.
    let forger = ed25519::Keypair::generate();
    let forged = sign(&claims_for(&peer, 1000), &forger);
    assert_eq!(
        verify(&forged, &trust, 1001, Some(&peer), 60),
        Err(CredentialError::BadSignature)
    );

    // Tampered claims bytes.
    let mut tampered = cred.clone();
    let mut c = claims_for(&peer, 1000);
    c.role = Role::Router as i32;
    tampered.claims = c.encode_to_vec();
    assert_eq!(
        verify(&tampered, &trust, 1001, Some(&peer), 60),
        Err(CredentialError::BadSignature)
    );

    // Unknown key id.
    let mut c = claims_for(&peer, 1000);
    c.key_id = "k9".into();
    let unknown = sign(&c, &cp);
    assert!(matches!(
        verify(&unknown, &trust, 1001, Some(&peer), 60),
        Err(CredentialError::UnknownKey(k)) if k == "k9"
    ));

    // Revoked until 2000.
    let mut revoked = trust.clone();
    revoked.set_revocations(&[Revocation {
        peer_id: peer.to_bytes(),
        until_unix_secs: 2000,
        reason: "test".into(),
        token_id: String::new(),
    }]);
    assert_eq!(
        verify(&cred, &revoked, 1001, Some(&peer), 60),
        Err(CredentialError::Revoked)
    );
    // After the revocation lapses the (still unexpired) credential is fine again.
    assert!(verify(&cred, &revoked, 2001, Some(&peer), 60).is_ok());

    // Malformed.
    let junk = Credential {
        claims: vec![0xff, 0xff, 0xff],
        signature: vec![],
    };
    assert!(matches!(
        verify(&junk, &trust, 1001, Some(&peer), 60),
        Err(CredentialError::Malformed(_))
    ));
}

#[test]
fn a_token_revocation_refuses_every_credential_of_that_token_and_no_other() {
    let (cp, keys, peer, _) = setup();
    let other = libp2p_identity::Keypair::generate_ed25519()
        .public()
        .to_peer_id();
    let of_token = |p: &PeerId, token: &str| {
        let mut c = claims_for(p, 1000);
        c.token_id = token.into();
        sign(&c, &cp)
    };
    let mut trust = Trust::new(&keys);
    trust.set_revocations(&[Revocation {
        peer_id: vec![],
        until_unix_secs: 2000,
        reason: "leaked".into(),
        token_id: "t-bad".into(),
    }]);
    for p in [&peer, &other] {
        assert_eq!(
            verify(&of_token(p, "t-bad"), &trust, 1001, Some(p), 60),
            Err(CredentialError::Revoked),
            "every member of the token"
        );
        assert!(verify(&of_token(p, "t-good"), &trust, 1001, Some(p), 60).is_ok());
    }
    // A credential from before token ids carries none and is not covered.
    assert!(verify(&of_token(&peer, ""), &trust, 1001, Some(&peer), 60).is_ok());
    assert!(!trust.is_token_revoked("", 1001));
    // Past its until, the entry lapses like a peer's.
    assert!(verify(&of_token(&peer, "t-bad"), &trust, 2001, Some(&peer), 60).is_ok());
    // A token entry never revokes a peer by accident.
    assert_eq!(trust.revoked_peers(1001).count(), 0);
}

#[test]
fn key_past_its_grace_verifies_nothing() {
    let (cp, mut keys, peer, _) = setup();
    keys.keys[0].verify_until_unix_secs = 1500;
    let trust = Trust::new(&keys);
    let cred = sign(&claims_for(&peer, 1000), &cp);
    assert!(verify(&cred, &trust, 1400, Some(&peer), 60).is_ok());
    assert!(matches!(
        verify(&cred, &trust, 1501, Some(&peer), 60),
        Err(CredentialError::Expired { .. })
    ));
}

/// A holder offered an older key set (a replica that has not reloaded)
/// keeps the newer one and its revocations; a newer one replaces it.
#[test]
fn an_older_key_set_is_not_taken() {
    let (cp, newer, peer, _) = setup();
    let newer = KeySet {
        epoch: 7,
        generation: 5,
        ..newer
    };
    let mut trust = Trust::new(&newer);
    trust.set_revocations(&[Revocation {
        peer_id: PeerId::random().to_bytes(),
        until_unix_secs: 2000,
        reason: "r".into(),
        token_id: String::new(),
    }]);
    let older = KeySet {
        epoch: 7,
        generation: 4,
        ..KeySet::default()
    };
    assert!(!trust.takes_keys(&older));
    assert!(!trust.offer_keys(&older), "stale");
    assert_eq!(trust.key_order(), (7, 5));
    assert!(trust.has_key("k1"), "the newer keys stay");
    assert_eq!(trust.revoked_peers(1000).count(), 1);
    let cred = sign(&claims_for(&peer, 1000), &cp);
    assert!(verify(&cred, &trust, 1001, Some(&peer), 60).is_ok());

    let next = KeySet {
        epoch: 7,
        generation: 6,
        ..KeySet::default()
    };
    assert!(trust.offer_keys(&next));
    assert_eq!(trust.key_order(), (7, 6));
    assert_eq!(trust.key_count(), 0, "replaced");
    assert_eq!(trust.revoked_peers(1000).count(), 1, "revocations kept");
}

#[test]
fn oversized_credential_is_refused() {
    let big = vec![0u8; MAX_CREDENTIAL_BYTES + 1];
    assert!(decode_credential(&big).is_err());
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let (_, keys, peer, _) = setup();
        let trust = Trust::new(&keys);
        if let Ok(cred) = decode_credential(&bytes) {
            let _ = verify(&cred, &trust, 1000, Some(&peer), 60);
        }
        let cred = Credential { claims: bytes.clone(), signature: bytes };
        prop_assert!(verify(&cred, &trust, 1000, Some(&peer), 60).is_err());
    }

    #[test]
    fn any_bit_flip_in_claims_is_refused(idx in 0usize..64, bit in 0u8..8) {
        let (cp, keys, peer, _) = setup();
        let trust = Trust::new(&keys);
        let mut cred = sign(&claims_for(&peer, 1000), &cp);
        let i = idx % cred.claims.len();
        cred.claims[i] ^= 1 << bit;
        prop_assert!(verify(&cred, &trust, 1001, Some(&peer), 60).is_err());
    }
}
