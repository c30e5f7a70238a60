//! The key set's order through the real gRPC server, on both backends:
//! every set served (GetKeys, the enrollment and refresh answers) carries
//! the database's epoch and the keys' generation, which rises with a
//! rotation; and a holder that took one replica's newer set refuses the
//! older set of a replica that has not reloaded yet, then takes that
//! replica's set once it has.
//!
//! The second test is deterministic: the older set is the one replica B
//! served before A's rotation committed (what B serves until it reloads,
//! whenever that is), and the set B serves right after the rotation is
//! checked whichever it is (stale or caught up). Only B catching up is
//! waited for, bounded, as convergence, never to order anything.

use std::time::Duration;

use agentmesh_controlplane::spawn;
use agentmesh_proto::{
    credential::Trust,
    identity::Keypair,
    pb::credential::{KeySet, Role, TokenKind},
};

use crate::common::{ADMIN, TestDb, client, token};

/// B's catching up, far above one key check (1 s here) or notification.
const CATCH_UP: Duration = Duration::from_secs(30);

async fn every_key_set_served_carries_a_generation_that_rises_with_a_rotation(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let before = c.get_keys().await.expect("keys");
    assert_ne!(before.epoch, 0, "{before:?}");
    assert_ne!(before.generation, 0, "the first key is a write");

    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 5).await;
    let member = Keypair::generate_ed25519();
    let enrolled = c.enroll(&tok, &member).await.expect("enrolls");
    assert_eq!(enrolled.keys.as_ref(), Some(&before), "the same set");

    let rotated = c.rotate_key_now(ADMIN).await.expect("rotates");
    let after = c.get_keys().await.expect("keys");
    assert_eq!(after.epoch, before.epoch);
    assert!(
        after.generation > before.generation,
        "{before:?} then {after:?}"
    );
    assert!(after.keys.iter().any(|k| k.key_id == rotated.key_id));
    let refreshed = c
        .refresh(enrolled.credential.as_ref().expect("credential"), &member)
        .await
        .expect("refreshes");
    assert_eq!(refreshed.keys.as_ref(), Some(&after));

    // What a router or member holding the rotated set does with each.
    let holder = Trust::new(&after);
    assert!(!holder.takes_keys(&before), "never backwards");
    assert!(holder.takes_keys(&after));
    h.shutdown().await;
}

async fn a_holder_of_one_replicas_newer_keys_refuses_a_lagging_replicas_set(db: TestDb) {
    let mut cfg = db.config();
    cfg.key_check_interval_secs = 1;
    let a = spawn(cfg.clone()).await.expect("replica a");
    let b = spawn(cfg).await.expect("replica b");
    let (ca, cb) = (client(&a), client(&b));
    // What b serves until it reloads after a's rotation.
    let b_before = cb.get_keys().await.expect("b's keys");

    let rotated = ca.rotate_key_now(ADMIN).await.expect("rotates on a");
    let a_after = ca.get_keys().await.expect("a's keys");
    assert_eq!(a_after.epoch, b_before.epoch, "one database, one epoch");
    assert!(a_after.generation > b_before.generation);

    // A router fails over from a to b.
    let mut trust = Trust::new(&KeySet::default());
    assert!(trust.offer_keys(&a_after));
    assert!(!trust.offer_keys(&b_before), "b's older set is refused");
    assert!(trust.has_key(&rotated.key_id), "a's new key is kept");
    assert_eq!(trust.key_order(), (a_after.epoch, a_after.generation));
    // Whatever b serves now, stale or caught up, the new key stays.
    let b_now = cb.get_keys().await.expect("b's keys");
    assert_eq!(
        trust.offer_keys(&b_now),
        b_now.generation >= a_after.generation,
        "{b_now:?}"
    );
    assert!(trust.has_key(&rotated.key_id));

    // Once b has reloaded, its set (the same generation) is taken.
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let caught_up = loop {
        let k = cb.get_keys().await.expect("b's keys");
        if k.generation >= a_after.generation {
            break k;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b never reloaded the keys"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(caught_up, a_after, "one set per generation");
    assert!(trust.offer_keys(&caught_up));
    a.shutdown().await;
    b.shutdown().await;
}

/// `store new-policy-epoch` while a replica runs: the set it serves
/// afterwards (once it reloaded) is of the new epoch, which began later;
/// a holder of it refuses the old epoch's set a lagging replica would
/// still serve (before, any other epoch replaced the set held, so holders
/// flipped between the two until every replica reloaded).
async fn a_holder_of_a_new_epochs_keys_refuses_the_old_epochs_set(db: TestDb) {
    let mut cfg = db.config();
    cfg.key_check_interval_secs = 1;
    let a = spawn(cfg).await.expect("replica");
    let ca = client(&a);
    let old = ca.get_keys().await.expect("keys");
    assert!(old.epoch_created_at_unix_secs > 0, "{old:?}");
    // The epoch's beginning is in whole seconds: let one pass, so the new
    // epoch begins strictly later (polled, not assumed after a sleep).
    while agentmesh_proto::unix_now() <= old.epoch_created_at_unix_secs {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let epoch = agentmesh_controlplane::offline::new_policy_epoch(db.url())
        .await
        .expect("new epoch");
    let deadline = tokio::time::Instant::now() + CATCH_UP;
    let new = loop {
        let k = ca.get_keys().await.expect("keys");
        if k.epoch == epoch {
            break k;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica never served the new epoch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(new.epoch_created_at_unix_secs > old.epoch_created_at_unix_secs);
    let mut holder = Trust::new(&KeySet::default());
    assert!(holder.offer_keys(&old));
    assert!(holder.offer_keys(&new), "the new epoch replaces the old");
    assert!(!holder.offer_keys(&old), "the old epoch never comes back");
    assert_eq!(holder.key_order(), (new.epoch, new.generation));
    a.shutdown().await;
}

on_both!(
    #[tokio::test]
    every_key_set_served_carries_a_generation_that_rises_with_a_rotation;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_holder_of_one_replicas_newer_keys_refuses_a_lagging_replicas_set;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_holder_of_a_new_epochs_keys_refuses_the_old_epochs_set;
);
