//! The policy's decisions on a router's real components (no I/O).

use agentmesh_proto::pb::credential::Revocation;
use agentmesh_proto::unix_now;
use libp2p::PeerId;
use libp2p::identity::Keypair;

use super::state::testing::{
    NO_GRANTS, WEB_TO_PAYMENTS, claims, cp, credential, record, signed, signed_list,
};
use crate::admission::{Admission, PeerGroups, Purpose};
use crate::resources::CircuitPolicy as _;
use crate::tables::Owner;
use crate::test_support::components;

/// Only `payments/*` of other teams' making: nobody owns payments.
const PAYMENTS_UNOWNED: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["web/*"]
groups = ["web"]

[[grants]]
from = ["payments"]
to = ["web/*"]
"#;

/// Admits `peer` as the swarm loop would: the test holds the tables' owner.
fn admit(
    c: &crate::Components,
    owner: &mut Owner,
    cp: &super::state::testing::Cp,
    peer: PeerId,
    team: &str,
    token: &str,
) {
    let policy = c.policy.policy();
    owner.tables.admissions.write().admit(
        peer,
        Admission {
            purpose: Purpose::Attach,
            until: unix_now() + 3600,
            node_id: team.into(),
            attached_routers: vec![],
            groups: Some(PeerGroups::new(claims(cp, &peer, team, token), &policy)),
            push: Default::default(),
        },
    );
}

#[tokio::test]
async fn circuits_need_a_grant_and_follow_each_new_policy() {
    let (cp, (c, mut owner)) = (cp(), components(|_| {}));
    *owner.tables.trust.write() = cp.trust.clone();
    let (web, pay, stranger) = (PeerId::random(), PeerId::random(), PeerId::random());
    // Admitted before any policy: deny all.
    admit(&c, &mut owner, &cp, web, "web", "tw");
    admit(&c, &mut owner, &cp, pay, "payments", "tp");
    let circuit = super::CircuitCheck {
        state: c.policy.clone(),
        admissions: c.admissions.clone(),
    };
    let check = |s: &PeerId, d: &PeerId| circuit.allows(s, d);
    assert!(!check(&web, &pay), "no policy: no circuit");
    let ctx = c.policy_ctx();
    assert!(
        owner
            .serve_while(ctx.take(Some(&signed(&cp, 1, 1, WEB_TO_PAYMENTS)), None, "directory"))
            .await
            .policy
    );
    assert!(
        check(&web, &pay),
        "web is granted payments/api, which payments owns"
    );
    assert!(!check(&pay, &web), "payments is granted nothing");
    assert!(
        !check(&stranger, &pay),
        "a peer not admitted is in no group"
    );
    owner
        .serve_while(ctx.take(Some(&signed(&cp, 1, 2, NO_GRANTS)), None, "watch"))
        .await;
    assert!(!check(&web, &pay), "the grant was removed");
    let refused = c
        .policy
        .metrics()
        .circuits_refused
        .get_or_create(&[("reason", "not_granted")])
        .get();
    assert_eq!(refused, 4, "every refusal counted");
}

#[tokio::test]
async fn records_not_owned_are_refused_and_dropped_when_ownership_goes() {
    let (cp, (c, mut owner)) = (cp(), components(|_| {}));
    *owner.tables.trust.write() = cp.trust.clone();
    let ctx = c.policy_ctx();
    let own = c.ownership();
    let (pay_key, web_key) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let (pay, web) = (pay_key.public().to_peer_id(), web_key.public().to_peer_id());
    let now = unix_now();
    let (r, s) = record(
        &pay_key,
        &["payments/api"],
        Some(credential(&cp, &pay, "payments", "tp")),
    );
    assert!(
        own.check(&r, &pay, now).is_err(),
        "no policy: nobody owns anything"
    );
    owner
        .serve_while(ctx.take(Some(&signed(&cp, 1, 1, WEB_TO_PAYMENTS)), None, "directory"))
        .await;
    own.check(&r, &pay, now).expect("payments owns payments/*");
    owner
        .tables
        .catalog
        .write()
        .publish(pay, s, &r, now)
        .expect("stored");
    // The impostor: web publishing payments/api with its own credential.
    let (ri, _) = record(
        &web_key,
        &["payments/api"],
        Some(credential(&cp, &web, "web", "tw")),
    );
    let why = own
        .check(&ri, &web, now)
        .expect_err("web does not own payments/api");
    assert!(why.starts_with("not_owner"), "{why}");
    // Another member's credential in its record: wrong subject.
    let (rs, _) = record(
        &web_key,
        &["payments/api"],
        Some(credential(&cp, &pay, "payments", "tp")),
    );
    assert!(
        own.check(&rs, &web, now)
            .expect_err("stolen")
            .starts_with("wrong_subject")
    );
    // No credential at all.
    let (rn, _) = record(&web_key, &["payments/api"], None);
    assert!(
        own.check(&rn, &web, now)
            .expect_err("none")
            .starts_with("no_credential")
    );
    let m = c.policy.metrics();
    // not_owner twice: before any policy, and the impostor.
    for (reason, n) in [("not_owner", 2), ("wrong_subject", 1), ("no_credential", 1)] {
        assert_eq!(
            m.catalog_refused.get_or_create(&[("reason", reason)]).get(),
            n,
            "{reason}"
        );
    }
    // Ownership moves away: the stored record is dropped.
    owner
        .serve_while(ctx.take(Some(&signed(&cp, 1, 2, PAYMENTS_UNOWNED)), None, "watch"))
        .await;
    assert!(c.records.read().lookup("payments/api", now, 10).is_empty());
    assert_eq!(m.catalog_dropped.get(), 1);
}

#[tokio::test]
async fn a_token_revocation_drops_every_member_of_that_token_and_their_records() {
    let (cp, (c, mut owner)) = (cp(), components(|_| {}));
    *owner.tables.trust.write() = cp.trust.clone();
    let ctx = c.policy_ctx();
    owner
        .serve_while(ctx.take(Some(&signed(&cp, 1, 1, WEB_TO_PAYMENTS)), None, "directory"))
        .await;
    let pay_key = Keypair::generate_ed25519();
    let pay = pay_key.public().to_peer_id();
    let (other, web) = (PeerId::random(), PeerId::random());
    admit(&c, &mut owner, &cp, pay, "payments", "bad-token");
    admit(&c, &mut owner, &cp, other, "payments", "bad-token");
    admit(&c, &mut owner, &cp, web, "web", "good-token");
    let now = unix_now();
    let (r, s) = record(
        &pay_key,
        &["payments/api"],
        Some(credential(&cp, &pay, "payments", "bad-token")),
    );
    owner
        .tables
        .catalog
        .write()
        .publish(pay, s, &r, now)
        .expect("stored");
    let revoked = vec![Revocation {
        token_id: "bad-token".into(),
        until_unix_secs: now + 3600,
        ..Default::default()
    }];
    let list = signed_list(&cp, 1, 1, now, &revoked);
    // The push round starts only once the list is in the trust: not while
    // the take waits for the swarm loop to install it.
    let g0 = c.policy.generations().borrow().number;
    let mut take = std::pin::pin!(ctx.take(None, Some(&list), "watch"));
    assert!(
        futures::poll!(take.as_mut()).is_pending(),
        "waits on the loop"
    );
    assert_eq!(
        c.policy.generations().borrow().number,
        g0,
        "no push round before the list is installed"
    );
    assert!(owner.serve_while(take).await.revocations);
    assert_eq!(c.policy.generations().borrow().number, g0 + 1);
    let list = list.clone();
    // So the round leaves out the members being dropped.
    let (now_list, later, _) = super::push::attached(&c.link, &c.admissions, u64::MAX);
    let pushed: Vec<PeerId> = now_list.into_iter().chain(later).collect();
    assert_eq!(pushed, vec![web], "revoked members are not pushed");
    assert!(
        c.records.read().lookup("payments/api", now, 10).is_empty(),
        "its record goes at once"
    );
    let trust = owner.tables.trust.read().clone();
    let mut gone = owner.tables.admissions.write().revoke(&trust, now);
    gone.sort();
    let mut want = vec![pay, other];
    want.sort();
    assert_eq!(gone, want, "one entry revokes every member of the token");
    assert!(c.admissions.read().get(&web).is_some());
    assert_eq!(
        c.policy.push_message().revocations,
        Some(list),
        "members get it pushed, signed as it came"
    );
}

#[tokio::test]
async fn a_revocation_list_the_swarm_loop_did_not_install_is_installed_by_the_next_take() {
    let (cp, (c, mut owner)) = (cp(), components(|_| {}));
    *owner.tables.trust.write() = cp.trust.clone();
    let now = unix_now();
    let peer = PeerId::random();
    let revoked = vec![Revocation {
        peer_id: peer.to_bytes(),
        until_unix_secs: now + 3600,
        ..Default::default()
    }];
    let list = signed_list(&cp, 1, 1, now, &revoked);
    // A swarm loop that cannot answer (gone): the list is taken, not installed.
    let (gone, _, dead) = Owner::new(
        &mut prometheus_client::registry::Registry::default(),
        std::time::Duration::from_secs(60),
        16,
    );
    drop(gone);
    let stalled = super::PolicyCtx {
        tables: dead,
        ..c.policy_ctx()
    };
    assert!(stalled.take(None, Some(&list), "watch").await.revocations);
    assert!(!owner.tables.trust.read().is_revoked(&peer, now));
    // The next take brings nothing new, and installs it.
    let ctx = c.policy_ctx();
    let changed = owner
        .serve_while(ctx.take(None, Some(&list), "directory"))
        .await;
    assert!(!changed.any(), "nothing new was taken");
    assert!(
        owner.tables.trust.read().is_revoked(&peer, now),
        "the list held is in the trust"
    );
}
