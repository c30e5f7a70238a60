use super::*;
use crate::pb::credential::{KeySet, PublicKey};

/// A control-plane key with `id`, and its public half as a key set entry.
fn key(id: &str, verify_until: i64) -> (ed25519::Keypair, PublicKey) {
    let k = ed25519::Keypair::generate();
    let public = PublicKey {
        key_id: id.into(),
        ed25519: k.public().to_bytes().to_vec(),
        active_from_unix_secs: 0,
        verify_until_unix_secs: verify_until,
    };
    (k, public)
}

fn trust(keys: &[&PublicKey]) -> Trust {
    Trust::new(&KeySet {
        keys: keys.iter().map(|k| (*k).clone()).collect(),
        ..Default::default()
    })
}

fn entry(token: &str) -> Revocation {
    Revocation {
        peer_id: Vec::new(),
        until_unix_secs: 5000,
        reason: "leaked".into(),
        token_id: token.into(),
    }
}

fn list(epoch: u64, generation: u64, issued: i64, key_id: &str) -> RevocationList {
    RevocationList {
        epoch,
        generation,
        issued_at_unix_secs: issued,
        entries: vec![entry("t1"), entry("t2")],
        key_id: key_id.into(),
    }
}

const NOW: i64 = 1000;

#[test]
fn a_signed_list_verifies_and_a_tampered_one_does_not() {
    let (k1, p1) = key("k1", 0);
    let t = trust(&[&p1]);
    let signed = sign_revocations(&list(7, 3, 100, "k1"), &k1);
    assert_eq!(
        verify_revocations(&signed, &t, NOW),
        Ok(list(7, 3, 100, "k1"))
    );
    assert_eq!(peek_generation(&signed), Some((7, 3)));

    // Each byte of the list and of the signature matters.
    for i in 0..signed.list.len() {
        let mut tampered = signed.clone();
        tampered.list[i] ^= 1;
        assert!(
            verify_revocations(&tampered, &t, NOW).is_err(),
            "list byte {i} flipped and still verified"
        );
    }
    let mut tampered = signed.clone();
    tampered.signature[0] ^= 1;
    assert_eq!(
        verify_revocations(&tampered, &t, NOW),
        Err(RevocationsVerifyError::BadSignature)
    );
    let unsigned = SignedRevocations {
        list: signed.list.clone(),
        signature: Vec::new(),
    };
    assert_eq!(
        verify_revocations(&unsigned, &t, NOW),
        Err(RevocationsVerifyError::BadSignature),
        "an unsigned list"
    );
}

#[test]
fn a_forger_under_a_known_key_id_and_an_unknown_key_are_refused() {
    let (_, p1) = key("k1", 0);
    let t = trust(&[&p1]);
    let forger = ed25519::Keypair::generate();
    assert_eq!(
        verify_revocations(&sign_revocations(&list(7, 9, 100, "k1"), &forger), &t, NOW),
        Err(RevocationsVerifyError::BadSignature)
    );
    assert_eq!(
        verify_revocations(&sign_revocations(&list(7, 9, 100, "k9"), &forger), &t, NOW),
        Err(RevocationsVerifyError::UnknownKey("k9".into()))
    );
    let garbage = SignedRevocations {
        list: vec![0xff; 8],
        signature: vec![],
    };
    assert_eq!(
        verify_revocations(&garbage, &t, NOW),
        Err(RevocationsVerifyError::Malformed)
    );
    let huge = SignedRevocations {
        list: vec![0; MAX_REVOCATIONS_LIST_BYTES + 1],
        signature: vec![],
    };
    assert!(matches!(
        verify_revocations(&huge, &t, NOW),
        Err(RevocationsVerifyError::TooLarge(_))
    ));
}

#[test]
fn a_retired_key_verifies_within_its_grace_and_not_after() {
    let (old, p_old) = key("k1", NOW + 60);
    let t = trust(&[&p_old]);
    let signed = sign_revocations(&list(7, 3, 100, "k1"), &old);
    assert!(verify_revocations(&signed, &t, NOW).is_ok(), "within grace");
    assert!(
        verify_revocations(&signed, &t, NOW + 60).is_ok(),
        "its last second"
    );
    assert_eq!(
        verify_revocations(&signed, &t, NOW + 61),
        Err(RevocationsVerifyError::KeyRetired {
            key_id: "k1".into(),
            verify_until: NOW + 60,
            now: NOW + 61,
        })
    );
}

#[test]
fn a_list_signed_again_after_a_rotation_verifies_with_the_new_key_set() {
    // Before the rotation: k1 signs. After it: k1 retires (its grace
    // ends at NOW + 60) and k2 signs the same generation again.
    let (k1, _) = key("k1", 0);
    let (k2, p2) = key("k2", 0);
    let (_, mut p1_retired) = key("k1", NOW + 60);
    p1_retired.ed25519 = k1.public().to_bytes().to_vec();
    let after = trust(&[&p1_retired, &p2]);
    let before = sign_revocations(&list(7, 3, 100, "k1"), &k1);
    let again = sign_revocations(&list(7, 3, 500, "k2"), &k2);
    assert!(verify_revocations(&before, &after, NOW).is_ok());
    assert!(verify_revocations(&again, &after, NOW).is_ok());
    // Past k1's grace only the copy signed again verifies.
    assert!(verify_revocations(&before, &after, NOW + 61).is_err());
    assert_eq!(
        verify_revocations(&again, &after, NOW + 61).map(|l| l.entries),
        Ok(list(7, 3, 0, "").entries)
    );
    // Once k1 is gone from the key set, likewise.
    let later = trust(&[&p2]);
    assert!(matches!(
        verify_revocations(&before, &later, NOW),
        Err(RevocationsVerifyError::UnknownKey(_))
    ));
    assert!(verify_revocations(&again, &later, NOW).is_ok());
}

fn order(epoch: u64, generation: u64, issued: i64) -> ListOrder {
    ListOrder {
        epoch,
        generation,
        issued_at_unix_secs: issued,
    }
}

#[test]
fn only_newer_lists_supersede() {
    let held = order(7, 3, 100);
    assert!(supersedes(held, None), "anything beats nothing");
    assert!(
        supersedes(order(7, 4, 90), Some(held)),
        "same epoch: the generation decides, not the clock"
    );
    assert!(
        !supersedes(order(7, 3, 200), Some(held)),
        "the same generation"
    );
    assert!(
        !supersedes(order(7, 2, 200), Some(held)),
        "an older generation"
    );
    assert!(
        supersedes(order(8, 0, 101), Some(held)),
        "a restored database, issued later"
    );
    assert!(
        !supersedes(order(6, 9, 99), Some(held)),
        "a replayed older epoch"
    );
}

#[test]
fn accept_takes_only_a_verified_newer_list_and_a_router_also_takes_a_copy_signed_again() {
    let (k1, p1) = key("k1", 0);
    let t = trust(&[&p1]);
    let g3 = sign_revocations(&list(7, 3, 100, "k1"), &k1);
    let held = HeldRevocations::accept(&g3, &t, None, NOW, SameGeneration::Refuse).expect("first");
    assert_eq!(held.generation(), (7, 3));
    assert_eq!(held.entries.len(), 2);

    let g2 = sign_revocations(&list(7, 2, 900, "k1"), &k1);
    assert_eq!(
        HeldRevocations::accept(&g2, &t, Some(&held), NOW, SameGeneration::Refuse),
        Err(RevocationsRejection::Stale {
            epoch: 7,
            generation: 2
        }),
        "a rollback"
    );
    let g3_again = sign_revocations(&list(7, 3, 300, "k1"), &k1);
    assert_eq!(
        HeldRevocations::accept(&g3_again, &t, Some(&held), NOW, SameGeneration::Refuse)
            .map_err(|e| e.reason()),
        Err("stale"),
        "a member: the same generation changes nothing"
    );
    let router = HeldRevocations::accept(
        &g3_again,
        &t,
        Some(&held),
        NOW,
        SameGeneration::TakeResigned,
    )
    .expect("a router takes the copy signed later");
    assert_eq!(router.order.issued_at_unix_secs, 300);
    assert!(
        HeldRevocations::accept(&g3, &t, Some(&router), NOW, SameGeneration::TakeResigned).is_err(),
        "but never an earlier copy back"
    );
    let g4 = sign_revocations(&list(7, 4, 50, "k1"), &k1);
    assert!(HeldRevocations::accept(&g4, &t, Some(&held), NOW, SameGeneration::Refuse).is_ok());

    let forged = sign_revocations(&list(7, 9, 100, "k1"), &ed25519::Keypair::generate());
    assert_eq!(
        HeldRevocations::accept(&forged, &t, Some(&held), NOW, SameGeneration::Refuse)
            .map_err(|e| e.reason()),
        Err("bad_signature")
    );
}

#[test]
fn a_holder_lacks_a_list_unless_it_reports_its_generation() {
    let (k1, p1) = key("k1", 0);
    let t = trust(&[&p1]);
    let signed = sign_revocations(&list(7, 3, 100, "k1"), &k1);
    let h = HeldRevocations::accept(&signed, &t, None, NOW, SameGeneration::Refuse).expect("ok");
    assert!(h.is_newer_than(0, 0), "none held");
    assert!(h.is_newer_than(7, 2));
    assert!(!h.is_newer_than(7, 3));
    assert!(!h.is_newer_than(7, 4), "the holder is ahead of this router");
    assert!(h.is_newer_than(6, 9), "another epoch: let the holder judge");
}

#[test]
fn every_rejection_reason_is_listed() {
    let reasons = [
        RevocationsRejection::Verify(RevocationsVerifyError::TooLarge(0)),
        RevocationsVerifyError::Malformed.into(),
        RevocationsVerifyError::UnknownKey(String::new()).into(),
        RevocationsVerifyError::BadSignature.into(),
        RevocationsVerifyError::KeyRetired {
            key_id: String::new(),
            verify_until: 0,
            now: 0,
        }
        .into(),
        RevocationsRejection::Stale {
            epoch: 0,
            generation: 0,
        },
    ];
    let got: Vec<_> = reasons.iter().map(|r| r.reason()).collect();
    assert_eq!(got, RevocationsRejection::REASONS);
}
