use super::*;
use agentmesh_proto::credential::{sign, verify};
use agentmesh_proto::pb::credential::{
    Claims, Credential, KeySet, Label, PolicyDocument, PublicKey, Role, TokenKind,
};
use agentmesh_proto::policy::sign_policy;
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
    let p = MemberPolicy::new(m.clone(), DEFAULT_MAX_REVOCATION_ENTRIES);
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
    let p = MemberPolicy::new(m.clone(), DEFAULT_MAX_REVOCATION_ENTRIES);
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
async fn a_push_adds_revocations_and_the_directory_list_replaces_them() {
    let cp = cp();
    let p = MemberPolicy::new(PolicyMetrics::default(), DEFAULT_MAX_REVOCATION_ENTRIES);
    let trust = cp.trust.read().clone();
    p.offer(signed_by(&cp.key, 1, 1, GRANTED), trust, "t").await;
    let web = claims(&cp, "web", "tok-web");
    let token_rev = Revocation {
        token_id: "tok-web".into(),
        until_unix_secs: 9000,
        ..Default::default()
    };
    let push = PolicyPush {
        policy: None,
        revocations: vec![token_rev.clone()],
    };
    let (ack, result) = p.on_push(&cp.trust, push, 2000).await;
    assert_eq!((ack.epoch, ack.version, result), (1, 1, "probe"));
    assert_eq!(
        p.may_call(&cp.trust.read(), &web, "db", 2000),
        Err(Denied::Revoked)
    );
    // The directory's whole list (without it) replaces what pushes added.
    p.set_revocations(&cp.trust, vec![]);
    assert_eq!(p.may_call(&cp.trust.read(), &web, "db", 2000), Ok(()));
}

#[test]
fn merging_keeps_the_later_end_drops_ended_ones_and_is_bounded() {
    let rev = |token: &str, until| Revocation {
        token_id: token.into(),
        until_unix_secs: until,
        ..Default::default()
    };
    let mut held = vec![rev("a", 100)];
    let max = DEFAULT_MAX_REVOCATION_ENTRIES;
    assert_eq!(
        merge(
            &mut held,
            &[rev("a", 200), rev("b", 50), rev("c", 300)],
            60,
            max
        ),
        (true, 0)
    );
    assert_eq!(held, vec![rev("a", 200), rev("c", 300)]);
    assert_eq!(
        merge(&mut held, &[rev("a", 150)], 60, max),
        (false, 0),
        "nothing new"
    );
    assert_eq!(
        merge(&mut held, &[Revocation::default()], 60, max),
        (false, 0),
        "an empty entry"
    );
    let flood: Vec<_> = (0..max + 10)
        .map(|i| rev(&format!("t{i}"), 1000 + i as i64))
        .collect();
    assert_eq!(
        merge(&mut held, &flood, 60, max),
        (true, 12),
        "two held and ten more over the bound"
    );
    assert_eq!(held.len(), max);
    assert!(
        held.iter().all(|h| h.until_unix_secs >= 1010),
        "those ending last kept"
    );
}
