use super::*;
use agentmesh_proto::credential::{sign, verify};
use agentmesh_proto::pb::credential::{
    Claims, Credential, KeySet, Label, PolicyDocument, PublicKey, RevocationList, Role, TokenKind,
};
use agentmesh_proto::policy::sign_policy;
use agentmesh_proto::revocations::sign_revocations;
use libp2p::identity::ed25519;

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

struct Cp {
    key: ed25519::Keypair,
    trust: RwLock<Arc<Trust>>,
}

fn cp() -> Cp {
    let key = ed25519::Keypair::generate();
    let trust = Trust::new(&KeySet {
        keys: vec![PublicKey {
            key_id: "k1".into(),
            ed25519: key.public().to_bytes().to_vec(),
            active_from_unix_secs: 0,
            verify_until_unix_secs: 0,
        }],
        ..Default::default()
    });
    Cp {
        key,
        trust: RwLock::new(Arc::new(trust)),
    }
}

fn signed_by(key: &ed25519::Keypair, epoch: u64, version: u64, text: &str) -> SignedPolicy {
    sign_policy(
        &PolicyDocument {
            epoch,
            version,
            issued_at_unix_secs: 1000 + version as i64,
            text: text.into(),
            key_id: "k1".into(),
        },
        key,
    )
}

fn list_by(
    key: &ed25519::Keypair,
    epoch: u64,
    generation: u64,
    issued: i64,
    entries: &[Revocation],
) -> SignedRevocations {
    sign_revocations(
        &RevocationList {
            epoch,
            generation,
            issued_at_unix_secs: issued,
            entries: entries.to_vec(),
            key_id: "k1".into(),
        },
        key,
    )
}

fn token_revoked(token: &str) -> Revocation {
    Revocation {
        token_id: token.into(),
        until_unix_secs: 9000,
        ..Default::default()
    }
}

fn list_ignored(m: &PolicyMetrics, reason: &'static str) -> u64 {
    m.revocations_ignored
        .get_or_create(&ReasonLabel { reason })
        .get()
}

fn credential(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> Credential {
    sign(
        &Claims {
            subject: peer.to_bytes(),
            node_id: "n".into(),
            role: Role::Member as i32,
            token_kind: TokenKind::Bootstrap as i32,
            labels: vec![Label {
                key: "team".into(),
                value: team.into(),
            }],
            issued_at_unix_secs: 1000,
            expires_at_unix_secs: 5000,
            key_id: "k1".into(),
            token_id: token.into(),
        },
        &cp.key,
    )
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
    let offer = p.offer(signed_by(&cp.key, 1, 1, GRANTED), trust.clone(), "test");
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
    let again = p.offer(signed_by(&cp.key, 1, 1, GRANTED), trust.clone(), "test");
    assert_eq!(again.await, Offer::Held);
    let removed = p.offer(signed_by(&cp.key, 1, 2, NO_GRANT), trust.clone(), "test");
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
        p.offer(signed_by(&cp.key, 1, 5, GRANTED), trust.clone(), "t")
            .await,
        Offer::Accepted
    );
    let forger = ed25519::Keypair::generate();
    let forged = p.offer(signed_by(&forger, 1, 9, NO_GRANT), trust.clone(), "t");
    assert_eq!(forged.await, Offer::Ignored("bad_signature"));
    let older = p.offer(signed_by(&cp.key, 1, 4, NO_GRANT), trust.clone(), "t");
    assert_eq!(older.await, Offer::Ignored("stale"));
    let garbage = p.offer(signed_by(&cp.key, 1, 6, "format = 99"), trust.clone(), "t");
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
        signed_by(&cp.key, 1, 4, NO_GRANT),
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
    p.offer(signed_by(&cp.key, 1, 1, GRANTED), trust, "t").await;
    let web = claims(&cp, "web", "tok-web");
    let changes = p.subscribe();
    let push = PolicyPush {
        policy: None,
        revocations: Some(list_by(&cp.key, 7, 3, 100, &[token_revoked("tok-web")])),
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
    let lifted = list_by(&cp.key, 7, 4, 50, &[]);
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
    p.offer(signed_by(&cp.key, 1, 1, GRANTED), trust, "t").await;
    let (honest, revoked) = (
        claims(&cp, "web", "tok-honest"),
        claims(&cp, "web", "tok-bad"),
    );
    let old = list_by(&cp.key, 7, 3, 100, &[]);
    let current = list_by(&cp.key, 7, 4, 200, &[token_revoked("tok-bad")]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &old, 2000, "push"),
        Offer::Accepted
    );
    assert_eq!(
        p.offer_revocations(&cp.trust, &current, 2000, "push"),
        Offer::Accepted
    );

    let forger = ed25519::Keypair::generate();
    let forged = list_by(&forger, 7, 9, 300, &[token_revoked("tok-honest")]);
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
    let resigned = list_by(&cp.key, 7, 4, 900, &[token_revoked("tok-bad")]);
    assert_eq!(
        p.offer_revocations(&cp.trust, &resigned, 2000, "push"),
        Offer::Held
    );
}

#[tokio::test]
async fn a_restored_control_plane_list_of_a_new_epoch_issued_later_replaces_the_held_one() {
    let cp = cp();
    let p = MemberPolicy::new(PolicyMetrics::default());
    let before = list_by(&cp.key, 7, 40, 100, &[token_revoked("a")]);
    let restored = list_by(&cp.key, 8, 2, 200, &[token_revoked("b")]);
    let replayed = list_by(&cp.key, 6, 90, 50, &[]);
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
