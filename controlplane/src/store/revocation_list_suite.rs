//! The revocation list's generation on both backends (each test once on a
//! SQLite file, once on a PostgreSQL database of its own; see `suite.rs`):
//! it moves with every write to the revocation tables, whoever makes it
//! (a revocation, a token's revocation, the reaper, a restore), never
//! without one, and a list read with it is the list of that generation.

use super::*;

use super::suite_kit::{Backend, Target, member_token, on_both, reap_policy};

const NOW: i64 = 1_000_000;

fn token(id: &str) -> TokenRow {
    member_token(id, NOW + 86_400)
}

async fn the_generation_moves_with_every_revocation_write_and_only_then(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let start = s.revocations().await.expect("list");
    assert!(start.rows.is_empty());
    assert_eq!(
        start.epoch,
        s.policy_head().await.expect("head").epoch,
        "the database's policy epoch"
    );
    assert_ne!(start.epoch, 0);
    // Reads and writes elsewhere leave it alone.
    s.create_token(&[1; 32], &token("t1")).await.expect("token");
    s.enroll(&[1; 32], &[1; 38], "n-1", "t", NOW, NOW + 60)
        .await
        .expect("store")
        .expect("enrolls");
    assert_eq!(s.revocations().await.expect("list"), start);

    s.revoke(&[1; 38], "one", NOW, NOW + 100)
        .await
        .expect("revoke");
    let g1 = s.revocations().await.expect("list");
    assert!(g1.generation > start.generation, "{g1:?}");
    assert_eq!(g1.rows.len(), 1);
    assert_eq!(g1.epoch, start.epoch);

    s.revoke_token("t1", "leaked", NOW, NOW + 200)
        .await
        .expect("store")
        .expect("known");
    let g2 = s.revocations().await.expect("list");
    assert!(g2.generation > g1.generation);
    assert_eq!(
        g2.rows
            .iter()
            .map(|r| r.token_id.as_str())
            .collect::<Vec<_>>(),
        ["", "t1"],
        "PeerId entries first, then tokens"
    );
    // Revoking again (the same entry, extended) is a write too.
    s.revoke(&[1; 38], "again", NOW, NOW + 300)
        .await
        .expect("revoke");
    let g3 = s.revocations().await.expect("list");
    assert!(g3.generation > g2.generation);

    // A reap that deletes nothing from the lists leaves it; one that does
    // moves it.
    s.reap_batch(NOW + 1, &reap_policy(), 100)
        .await
        .expect("reap");
    assert_eq!(s.revocations().await.expect("list"), g3);
    s.reap_batch(NOW + 3600, &reap_policy(), 100)
        .await
        .expect("reap");
    let g4 = s.revocations().await.expect("list");
    assert!(g4.rows.is_empty(), "{g4:?}");
    assert!(g4.generation > g3.generation);
}

async fn revocations_from_two_stores_each_move_the_generation(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let start = one.revocations().await.expect("list").generation;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16u8 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        tasks.spawn(async move {
            store
                .revoke(&[i; 38], "race", NOW, NOW + 60)
                .await
                .expect("revoke");
            // What this store reads after its write includes it.
            let after = store.revocations().await.expect("list");
            assert!(after.rows.iter().any(|r| r.peer_id == [i; 38]));
            after.generation
        });
    }
    let mut seen = Vec::new();
    while let Some(g) = tasks.join_next().await {
        seen.push(g.expect("join"));
    }
    let end = one.revocations().await.expect("list");
    assert_eq!(end.rows.len(), 16);
    assert_eq!(
        end.generation,
        start + 16,
        "one bump per committed write, none lost to the race"
    );
    assert!(seen.iter().all(|g| *g > start && *g <= end.generation));
    assert_eq!(
        two.revocations().await.expect("list"),
        end,
        "one list per generation"
    );
}

async fn a_restored_database_has_its_own_epoch_and_the_same_entries(b: Backend) {
    let Some(src) = Target::new(b).await else {
        return;
    };
    let Some(dst) = Target::new(b.other()).await else {
        return;
    };
    let s = src.open().await;
    s.revoke(&[7; 38], "copied", NOW, NOW + 100)
        .await
        .expect("revoke");
    let before = s.revocations().await.expect("list");
    let d = dst.open().await;
    d.restore(&s.snapshot().await.expect("snapshot"))
        .await
        .expect("restore");
    let after = d.revocations().await.expect("list");
    assert_eq!(after.rows, before.rows);
    assert_ne!(after.epoch, before.epoch, "a new history");
}

on_both!(
    the_generation_moves_with_every_revocation_write_and_only_then,
    revocations_from_two_stores_each_move_the_generation,
    a_restored_database_has_its_own_epoch_and_the_same_entries,
);
