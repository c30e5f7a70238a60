use super::testing::{NO_GRANTS, WEB_TO_PAYMENTS, cp, signed, signed_list, state};
use super::*;
use agentmesh_proto::pb::credential::Revocation;

const NOW: i64 = 2000;

fn ignored(s: &PolicyState, reason: &'static str) -> u64 {
    s.metrics()
        .ignored
        .get_or_create(&[("reason", reason)])
        .get()
}

fn list_ignored(s: &PolicyState, reason: &'static str) -> u64 {
    s.metrics()
        .revocations_ignored
        .get_or_create(&[("reason", reason)])
        .get()
}

fn member(policy: (u64, u64), revocations: (u64, u64)) -> Reported {
    Reported {
        policy,
        revocations,
    }
}

fn token(id: &str) -> Revocation {
    Revocation {
        token_id: id.into(),
        until_unix_secs: 9000,
        ..Default::default()
    }
}

#[test]
fn nothing_held_denies_all() {
    let s = state();
    assert_eq!(s.version(), (0, 0));
    assert!(s.push_for(Reported::default()).is_none(), "nothing to push");
    let p = s.policy();
    assert!(!p.may_reach(&Default::default(), &Default::default()));
}

#[test]
fn a_newer_version_is_taken_an_identical_copy_changes_nothing() {
    let (cp, s) = (cp(), state());
    let g0 = s.generations().borrow().number;
    let v1 = signed(&cp, 1, 1, WEB_TO_PAYMENTS);
    let c = s.offer(Some(&v1), None, &cp.trust, NOW, "directory");
    assert!(c.policy && !c.revocations);
    assert_eq!(s.version(), (1, 1));
    assert_eq!(s.metrics().version.get(), 1);
    // The push round starts when the taker announces it.
    assert_eq!(s.generations().borrow().number, g0);
    s.announce(tokio::time::Instant::now());
    assert_eq!(s.generations().borrow().number, g0 + 1);
    // The directory poll returns the same copy every round: no change, not
    // counted as stale.
    assert!(!s.offer(Some(&v1), None, &cp.trust, NOW, "directory").any());
    assert_eq!(ignored(&s, "stale"), 0);
    assert_eq!(s.generations().borrow().number, g0 + 1);
    let v2 = signed(&cp, 1, 2, NO_GRANTS);
    assert!(s.offer(Some(&v2), None, &cp.trust, NOW, "watch").policy);
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
    s.offer(Some(&v2), None, &cp.trust, NOW, "directory");
    // An older version (replayed): stale.
    let v1 = signed(&cp, 1, 1, NO_GRANTS);
    assert!(!s.offer(Some(&v1), None, &cp.trust, NOW, "directory").any());
    assert_eq!(ignored(&s, "stale"), 1);
    // Signed by another key under the same key id: bad signature.
    let forger = super::testing::Cp {
        key: libp2p::identity::ed25519::Keypair::generate(),
        trust: cp.trust.clone(),
    };
    let forged = signed(&forger, 1, 9, NO_GRANTS);
    assert!(!s.offer(Some(&forged), None, &cp.trust, NOW, "watch").any());
    assert_eq!(ignored(&s, "bad_signature"), 1);
    // Signed, newer, but not a policy: unparsable.
    let junk = signed(&cp, 1, 10, "this is not = [ toml");
    assert!(!s.offer(Some(&junk), None, &cp.trust, NOW, "watch").any());
    assert_eq!(ignored(&s, "unparsable"), 1);
    assert_eq!(
        s.version(),
        (1, 2),
        "the held version stays through all of it"
    );
}

#[test]
fn a_newer_revocation_list_is_a_change_and_pushed_an_older_or_forged_one_is_not() {
    let (cp, s) = (cp(), state());
    let g5 = signed_list(&cp, 7, 5, 100, &[token("t1")]);
    let c = s.offer(None, Some(&g5), &cp.trust, NOW, "directory");
    assert!(c.revocations && c.revocations_copy);
    assert_eq!(s.revocations_generation(), (7, 5));
    assert_eq!(*s.revocation_entries(), vec![token("t1")]);
    assert_eq!(s.metrics().revocations_generation.get(), 5);
    assert!(!s.offer(None, Some(&g5), &cp.trust, NOW, "watch").any());
    assert_eq!(s.push_message().revocations, Some(g5.clone()));

    // The poll and the watch racing: an older generation never goes back.
    let g4 = signed_list(&cp, 7, 4, 200, &[]);
    assert!(
        !s.offer(None, Some(&g4), &cp.trust, NOW, "directory")
            .revocations_copy
    );
    assert_eq!(list_ignored(&s, "stale"), 1);
    // Forged under the control plane's key id.
    let forger = super::testing::Cp {
        key: libp2p::identity::ed25519::Keypair::generate(),
        trust: cp.trust.clone(),
    };
    let forged = signed_list(&forger, 7, 9, 300, &[token("honest")]);
    assert!(
        !s.offer(None, Some(&forged), &cp.trust, NOW, "watch")
            .revocations_copy
    );
    assert_eq!(list_ignored(&s, "bad_signature"), 1);
    assert_eq!(*s.revocation_entries(), vec![token("t1")]);

    // The same generation signed again later (a key rotation): the copy
    // forwarded is replaced, and that is no change to push.
    let resigned = signed_list(&cp, 7, 5, 500, &[token("t1")]);
    let c = s.offer(None, Some(&resigned), &cp.trust, NOW, "watch");
    assert!(c.revocations_copy && !c.any());
    assert_eq!(s.push_message().revocations, Some(resigned));
    // The earlier copy again (another control plane's): quietly kept out.
    assert!(
        !s.offer(None, Some(&g5), &cp.trust, NOW, "directory")
            .revocations_copy
    );
    assert_eq!(list_ignored(&s, "stale"), 1, "not counted as a lie");
}

#[test]
fn admission_carries_only_what_the_member_lacks() {
    let (cp, s) = (cp(), state());
    s.offer(
        Some(&signed(&cp, 3, 5, WEB_TO_PAYMENTS)),
        Some(&signed_list(&cp, 3, 8, 100, &[token("t1")])),
        &cp.trust,
        NOW,
        "directory",
    );
    let both = s
        .push_for(member((0, 0), (0, 0)))
        .expect("a member with none")
        .1;
    assert!(both.policy.is_some() && both.revocations.is_some());
    let policy = s
        .push_for(member((3, 4), (3, 8)))
        .expect("an older version")
        .1;
    assert!(policy.policy.is_some() && policy.revocations.is_none());
    let list = s.push_for(member((3, 5), (3, 7))).expect("an older list").1;
    assert!(list.policy.is_none() && list.revocations.is_some());
    assert!(
        s.push_for(member((2, 9), (3, 8))).is_some(),
        "another epoch (a restored database)"
    );
    assert!(s.push_for(member((3, 5), (3, 8))).is_none(), "current");
    assert!(
        s.push_for(member((3, 5), (3, 9))).is_none(),
        "a member ahead of this router is sent nothing"
    );
}
