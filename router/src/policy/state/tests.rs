use super::*;
use crate::policy::testing::{NO_GRANTS, WEB_TO_PAYMENTS, cp, signed, state};
use agentmesh_proto::pb::credential::Revocation;

fn ignored(s: &PolicyState, reason: &'static str) -> u64 {
    s.metrics()
        .ignored
        .get_or_create(&[("reason", reason)])
        .get()
}

#[test]
fn nothing_held_denies_all() {
    let s = state();
    assert_eq!(s.version(), (0, 0));
    assert!(s.push_for(0, 0).is_none(), "nothing to push");
    let p = s.policy();
    assert!(!p.may_reach(&Default::default(), &Default::default()));
}

#[test]
fn a_newer_version_is_taken_an_identical_copy_changes_nothing() {
    let (cp, s) = (cp(), state());
    let g0 = s.generations().borrow().number;
    let v1 = signed(&cp, 1, 1, WEB_TO_PAYMENTS);
    let c = s.offer(Some(&v1), &[], &cp.trust, "directory");
    assert!(c.policy && !c.revocations);
    assert_eq!(s.version(), (1, 1));
    assert_eq!(s.metrics().version.get(), 1);
    assert_eq!(s.generations().borrow().number, g0 + 1);
    // The directory poll returns the same copy every round: no change, not
    // counted as stale.
    assert!(!s.offer(Some(&v1), &[], &cp.trust, "directory").any());
    assert_eq!(ignored(&s, "stale"), 0);
    assert_eq!(s.generations().borrow().number, g0 + 1);
    let v2 = signed(&cp, 1, 2, NO_GRANTS);
    assert!(s.offer(Some(&v2), &[], &cp.trust, "watch").policy);
    assert_eq!(s.version(), (1, 2));
    assert_eq!(
        s.metrics()
            .applied
            .get_or_create(&[("source", "watch")])
            .get(),
        1
    );
}

#[test]
fn a_lying_control_plane_copy_is_ignored_and_counted() {
    let (cp, s) = (cp(), state());
    let v2 = signed(&cp, 1, 2, WEB_TO_PAYMENTS);
    s.offer(Some(&v2), &[], &cp.trust, "directory");
    // An older version (replayed): stale.
    let v1 = signed(&cp, 1, 1, NO_GRANTS);
    assert!(!s.offer(Some(&v1), &[], &cp.trust, "directory").any());
    assert_eq!(ignored(&s, "stale"), 1);
    // Signed by another key under the same key id: bad signature.
    let forger = crate::policy::testing::Cp {
        key: libp2p::identity::ed25519::Keypair::generate(),
        trust: cp.trust.clone(),
    };
    let forged = signed(&forger, 1, 9, NO_GRANTS);
    assert!(!s.offer(Some(&forged), &[], &cp.trust, "watch").any());
    assert_eq!(ignored(&s, "bad_signature"), 1);
    // Signed, newer, but not a policy: unparsable.
    let junk = signed(&cp, 1, 10, "this is not = [ toml");
    assert!(!s.offer(Some(&junk), &[], &cp.trust, "watch").any());
    assert_eq!(ignored(&s, "unparsable"), 1);
    assert_eq!(
        s.version(),
        (1, 2),
        "the held version stays through all of it"
    );
}

#[test]
fn a_new_revocation_list_is_a_change_and_pushed() {
    let (cp, s) = (cp(), state());
    let r = vec![Revocation {
        token_id: "t1".into(),
        until_unix_secs: 9000,
        ..Default::default()
    }];
    assert!(s.offer(None, &r, &cp.trust, "directory").revocations);
    assert!(!s.offer(None, &r, &cp.trust, "directory").any());
    assert_eq!(s.push_message().revocations, r);
}

#[test]
fn admission_carries_the_policy_only_to_members_that_lack_it() {
    let (cp, s) = (cp(), state());
    s.offer(
        Some(&signed(&cp, 3, 5, WEB_TO_PAYMENTS)),
        &[],
        &cp.trust,
        "directory",
    );
    assert!(s.push_for(0, 0).is_some(), "a member with none");
    assert!(s.push_for(3, 4).is_some(), "an older version");
    assert!(
        s.push_for(2, 9).is_some(),
        "another epoch (a restored database)"
    );
    assert!(s.push_for(3, 5).is_none(), "current");
}
