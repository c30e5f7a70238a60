use super::*;
use agentmesh_proto::credential::verify;
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::testing::TestCp;

const GRANTED: &str = r#"
format = 1
[groups]
members = { role = "member" }
web = { labels = { team = "web" } }
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["web"]
to = ["db"]
"#;

const NO_GRANT: &str = r#"
format = 1
[groups]
members = { role = "member" }
[[owners]]
services = ["*"]
groups = ["members"]
"#;

/// The fixture control plane, its trust behind the lock the node's
/// policy reads it through.
struct Cp {
    fx: TestCp,
    trust: RwLock<Arc<Trust>>,
}

fn cp() -> Cp {
    let fx = TestCp::new();
    let trust = RwLock::new(Arc::new(fx.trust.clone()));
    Cp { fx, trust }
}

/// A policy issued at `1000 + version`.
fn signed_by(fx: &TestCp, epoch: u64, version: u64, text: &str) -> SignedPolicy {
    fx.policy(epoch, version, 1000 + version as i64, text)
}

fn token_revoked(token: &str) -> Revocation {
    agentmesh_proto::testing::token_revoked(token, 9000)
}

fn list_ignored(m: &PolicyMetrics, reason: &'static str) -> u64 {
    m.revocations_ignored
        .get_or_create(&ReasonLabel { reason })
        .get()
}

/// Credentials of these tests are valid from 1000 to 5000.
fn credential(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> Credential {
    cp.fx.member(peer, team, token, 1000..5000)
}

fn claims(cp: &Cp, team: &str, token: &str) -> VerifiedClaims {
    let peer = PeerId::random();
    let c = credential(cp, &peer, team, token);
    verify(&c, &cp.trust.read(), 2000, Some(&peer), 0).expect("valid")
}

fn ignored(m: &PolicyMetrics, reason: &'static str) -> u64 {
    m.ignored.get_or_create(&ReasonLabel { reason }).get()
}

#[tokio::test]
async fn none_held_denies_every_call_and_a_grant_lets_one_through() {
    let cp = cp();
    let m = PolicyMetrics::default();
    let p = MemberPolicy::new(m.clone());
    let web = claims(&cp, "web", "t1");
    let trust = cp.trust.read().clone();
    assert_eq!(p.epoch_version(), (0, 0));
    assert_eq!(
        p.may_call(&trust, &web, "db", 2000),
        Err(Denied::NotGranted)
    );

    let mut changes = p.subscribe();
    let offer = p.offer(signed_by(&cp.fx, 1, 1, GRANTED), trust.clone(), "test");
    assert_eq!(offer.await, Offer::Accepted);
    assert!(
        changes.has_changed().expect("open"),
        "a change is signalled"
    );
    changes.mark_unchanged();
    assert_eq!(p.epoch_version(), (1, 1));
    assert_eq!(m.version.get(), 1);
    assert_eq!(p.may_call(&trust, &web, "db", 2000), Ok(()));
    let data = claims(&cp, "data", "t2");
    assert_eq!(
        p.may_call(&trust, &data, "db", 2000),
        Err(Denied::NotGranted)
    );
    assert_eq!(
        p.may_call(&trust, &web, "other", 2000),
        Err(Denied::NotGranted)
    );

    // The same policy again is held, not counted; the grant removed takes effect.
    let again = p.offer(signed_by(&cp.fx, 1, 1, GRANTED), trust.clone(), "test");
    assert_eq!(again.await, Offer::Held);
    let removed = p.offer(signed_by(&cp.fx, 1, 2, NO_GRANT), trust.clone(), "test");
    assert_eq!(removed.await, Offer::Accepted);
    assert_eq!(
        p.may_call(&trust, &web, "db", 2000),
        Err(Denied::NotGranted)
    );
    assert!(changes.has_changed().expect("open"));
}

/// A lying router: a forged signature, a replayed older version and a
/// document this build cannot parse are all ignored, counted, and the
/// held policy stays.
#[tokio::test]
async fn forged_stale_and_unparsable_policies_are_ignored_and_counted() {
    let cp = cp();
    let m = PolicyMetrics::default();
    m.precreate();
    let p = MemberPolicy::new(m.clone());
    let trust = cp.trust.read().clone();
    assert_eq!(
        p.offer(signed_by(&cp.fx, 1, 5, GRANTED), trust.clone(), "t")
            .await,
        Offer::Accepted
    );
    let forger = TestCp::new();
    let forged = p.offer(signed_by(&forger, 1, 9, NO_GRANT), trust.clone(), "t");
    assert_eq!(forged.await, Offer::Ignored("bad_signature"));
    let older = p.offer(signed_by(&cp.fx, 1, 4, NO_GRANT), trust.clone(), "t");
    assert_eq!(older.await, Offer::Ignored("stale"));
    let garbage = p.offer(signed_by(&cp.fx, 1, 6, "format = 99"), trust.clone(), "t");
    assert_eq!(garbage.await, Offer::Ignored("unparsable"));
    let bytes = SignedPolicy {
        document: vec![0xff; 40],
        signature: vec![1; 64],
    };
    assert!(matches!(
        p.offer(bytes, trust, "t").await,
        Offer::Ignored(_)
    ));
    assert_eq!(p.epoch_version(), (1, 5));
    assert_eq!(ignored(&m, "bad_signature"), 1);
    assert_eq!(ignored(&m, "stale"), 1);
    assert_eq!(ignored(&m, "unparsable"), 1);
    // An older one from the (cached) directory is not a lie: not counted.
    let cached = p.offer(
        signed_by(&cp.fx, 1, 4, NO_GRANT),
        cp.trust.read().clone(),
        DIRECTORY,
    );
    assert_eq!(cached.await, Offer::Ignored("stale"));
    assert_eq!(ignored(&m, "stale"), 1);
}

#[tokio::test]
async fn a_pushed_signed_list_revokes_and_a_newer_one_lifts_it() {
    let cp = cp();
    let m = PolicyMetrics::default();
    m.precreate();
    let p = MemberPolicy::new(m.clone());
    let trust = cp.trust.read().clone();
    p.offer(signed_by(&cp.fx, 1, 1, GRANTED), trust, "t").await;
    let web = claims(&cp, "web", "tok-web");
    let changes = p.subscribe();
    let push = PolicyPush {
        policy: None,
        revocations: Some(cp.fx.revocations(7, 3, 100, &[token_revoked("tok-web")])),
    };
    let (ack, result) = p.on_push(&cp.trust, push, 2000, "push").await;
    assert_eq!((ack.epoch, ack.version, result), (1, 1, "probe"));
    assert_eq!((ack.revocations_epoch, ack.revocations_generation), (7, 3));
    assert!(ack.revocations_ignored.is_empty());
    assert_eq!(p.revocations_generation(), (7, 3));
    assert_eq!(m.revocations_generation.get(), 3);
    assert_eq!(m.revocations.get(), 1);
    assert!(changes.has_changed().expect("open"));
    assert_eq!(
        p.may_call(&cp.trust.read(), &web, "db", 2000),
        Err(Denied::Revoked)
    );
    // The control plane lifted it (the entry reaped): a newer generation.
    let lifted = cp.fx.revocations(7, 4, 50, &[]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &lifted, 2000, DIRECTORY),
        Offer::Accepted
    );
    assert_eq!(p.may_call(&cp.trust.read(), &web, "db", 2000), Ok(()));
    assert_eq!(
        p.offer_revocations(&cp.trust, &lifted, 2000, "push"),
        Offer::Held
    );
    for reason in RevocationsRejection::REASONS {
        assert_eq!(list_ignored(&m, reason), 0, "{reason}");
    }
}

/// A lying router: a forged list naming an honest member, an unsigned
/// one, and a genuine older list without a revocation in force are all
/// ignored and counted; what is held stays.
#[tokio::test]
async fn forged_unsigned_and_rolled_back_lists_are_ignored_and_counted() {
    let cp = cp();
    let m = PolicyMetrics::default();
    m.precreate();
    let p = MemberPolicy::new(m.clone());
    let trust = cp.trust.read().clone();
    p.offer(signed_by(&cp.fx, 1, 1, GRANTED), trust, "t").await;
    let (honest, revoked) = (
        claims(&cp, "web", "tok-honest"),
        claims(&cp, "web", "tok-bad"),
    );
    let old = cp.fx.revocations(7, 3, 100, &[]);
    let current = cp.fx.revocations(7, 4, 200, &[token_revoked("tok-bad")]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &old, 2000, "push"),
        Offer::Accepted
    );
    assert_eq!(
        p.offer_revocations(&cp.trust, &current, 2000, "push"),
        Offer::Accepted
    );

    let forger = TestCp::new();
    let forged = forger.revocations(7, 9, 300, &[token_revoked("tok-honest")]);
    let (ack, _) = p
        .on_push(
            &cp.trust,
            PolicyPush {
                policy: None,
                revocations: Some(forged.clone()),
            },
            2000,
            "push",
        )
        .await;
    assert_eq!(ack.revocations_ignored, "bad_signature");
    assert_eq!((ack.revocations_epoch, ack.revocations_generation), (7, 4));
    let unsigned = SignedRevocations {
        list: forged.list,
        signature: Vec::new(),
    };
    assert_eq!(
        p.offer_revocations(&cp.trust, &unsigned, 2000, "admission"),
        Offer::Ignored("bad_signature")
    );
    // The rollback: genuine, signed, older.
    let (ack, _) = p
        .on_push(
            &cp.trust,
            PolicyPush {
                policy: None,
                revocations: Some(old.clone()),
            },
            2000,
            "push",
        )
        .await;
    assert_eq!(ack.revocations_ignored, "stale");
    assert_eq!(list_ignored(&m, "bad_signature"), 2);
    assert_eq!(list_ignored(&m, "stale"), 1);
    assert_eq!(p.revocations_generation(), (7, 4));
    let t = cp.trust.read().clone();
    assert_eq!(p.may_call(&t, &honest, "db", 2000), Ok(()), "never forged");
    assert_eq!(
        p.may_call(&t, &revoked, "db", 2000),
        Err(Denied::Revoked),
        "never rolled back"
    );
    // An older list from the (cached) directory is not a lie: not counted.
    assert_eq!(
        p.offer_revocations(&cp.trust, &old, 2000, DIRECTORY),
        Offer::Ignored("stale")
    );
    assert_eq!(list_ignored(&m, "stale"), 1);
    // The held generation signed again (a key rotation): nothing to do.
    let resigned = cp.fx.revocations(7, 4, 900, &[token_revoked("tok-bad")]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &resigned, 2000, "push"),
        Offer::Held
    );
}

#[tokio::test]
async fn a_restored_control_plane_list_of_a_new_epoch_issued_later_replaces_the_held_one() {
    let cp = cp();
    let p = MemberPolicy::new(PolicyMetrics::default());
    let before = cp.fx.revocations(7, 40, 100, &[token_revoked("a")]);
    let restored = cp.fx.revocations(8, 2, 200, &[token_revoked("b")]);
    let replayed = cp.fx.revocations(6, 90, 50, &[]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &before, 2000, "t"),
        Offer::Accepted
    );
    assert_eq!(
        p.offer_revocations(&cp.trust, &restored, 2000, "t"),
        Offer::Accepted
    );
    assert_eq!(p.revocations_generation(), (8, 2));
    assert_eq!(
        p.offer_revocations(&cp.trust, &replayed, 2000, "t"),
        Offer::Ignored("stale")
    );
}
