//! Duty leases on both backends (each test once on a SQLite file, once on
//! a PostgreSQL database of its own; see `suite.rs`): one holder at a time,
//! renewal, lapse by the database's clock, release.

use std::time::Duration;

use super::suite_kit::{Backend, Target, on_both};

/// Two stores on one database race for a duty: exactly one wins, the
/// winner renews, the loser keeps losing while the lease runs.
async fn a_duty_has_one_holder_while_its_lease_runs(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (a, b2) = (t.open().await, t.open().await);
    let (won_a, won_b) = tokio::join!(
        a.claim_duty("reaper", "replica-a", 60_000),
        b2.claim_duty("reaper", "replica-b", 60_000)
    );
    let (won_a, won_b) = (won_a.expect("a"), won_b.expect("b"));
    assert!(won_a ^ won_b, "exactly one claims: a={won_a} b={won_b}");
    let (winner, loser, loser_id, winner_id) = if won_a {
        (&a, &b2, "replica-b", "replica-a")
    } else {
        (&b2, &a, "replica-a", "replica-b")
    };
    assert!(
        winner
            .claim_duty("reaper", winner_id, 60_000)
            .await
            .expect("renew")
    );
    assert!(
        !loser
            .claim_duty("reaper", loser_id, 60_000)
            .await
            .expect("lose")
    );
    // Another duty is a lease of its own.
    assert!(
        loser
            .claim_duty("row_counts", loser_id, 60_000)
            .await
            .expect("other")
    );
}

/// A lease that lapses (by the database's clock) goes to the next
/// claimant; a released one goes at once; releasing another's is a no-op.
async fn a_lapsed_or_released_duty_passes_to_the_next_claimant(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (a, b2) = (t.open().await, t.open().await);
    assert!(
        a.claim_duty("reaper", "replica-a", 200)
            .await
            .expect("claim")
    );
    assert!(
        !b2.claim_duty("reaper", "replica-b", 60_000)
            .await
            .expect("held")
    );
    // Lapse: poll past the 200 ms lease (bounded: 10 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if b2
            .claim_duty("reaper", "replica-b", 60_000)
            .await
            .expect("claim")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "lease never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !a.claim_duty("reaper", "replica-a", 60_000)
            .await
            .expect("lost")
    );
    // Releasing a lease one does not hold changes nothing.
    a.release_duty("reaper", "replica-a").await.expect("no-op");
    assert!(
        !a.claim_duty("reaper", "replica-a", 60_000)
            .await
            .expect("still b's")
    );
    // Released by its holder: the next claim wins at once.
    b2.release_duty("reaper", "replica-b")
        .await
        .expect("release");
    assert!(
        a.claim_duty("reaper", "replica-a", 60_000)
            .await
            .expect("free")
    );
}

/// Replicas' presence: each heartbeat counts the live ones; a lapsed one
/// is forgotten; a released one at once.
async fn replicas_count_each_other_until_one_lapses_or_leaves(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (a, b2) = (t.open().await, t.open().await);
    assert_eq!(a.replica_heartbeat("a", 60_000).await.expect("a"), 1);
    assert_eq!(b2.replica_heartbeat("b", 200).await.expect("b"), 2);
    assert_eq!(a.replica_heartbeat("a", 60_000).await.expect("a again"), 2);
    // b stops beating: after its 200 ms it is forgotten (bounded: 10 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.replica_heartbeat("a", 60_000).await.expect("a") != 1 {
        assert!(tokio::time::Instant::now() < deadline, "b never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // b comes back, then leaves on purpose.
    assert_eq!(b2.replica_heartbeat("b", 60_000).await.expect("b"), 2);
    b2.release_duty(&super::replica_duty("b"), "b")
        .await
        .expect("leave");
    assert_eq!(a.replica_heartbeat("a", 60_000).await.expect("a"), 1);
    // Presence is not a duty: the reaper's lease is untouched by it.
    assert!(a.claim_duty("reaper", "a", 60_000).await.expect("reaper"));
    assert_eq!(a.replica_heartbeat("a", 60_000).await.expect("a"), 1);
}

on_both!(
    replicas_count_each_other_until_one_lapses_or_leaves,
    a_duty_has_one_holder_while_its_lease_runs,
    a_lapsed_or_released_duty_passes_to_the_next_claimant,
);
