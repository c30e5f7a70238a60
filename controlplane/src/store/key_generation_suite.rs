//! The key set's generation on both backends (each test once on a SQLite
//! file, once on a PostgreSQL database of its own; see `suite.rs`): it
//! moves with every write to `signing_keys`, whoever makes it (the first
//! key, a rotation, an admin rotation, the reaper, a restore), never
//! without one, the keys read with it are the keys of that generation,
//! and a database upgraded with keys in it starts above 0.

use std::time::Duration;

use super::*;

use super::suite_kit::{Backend, Target, key, member_token, on_both, reap_policy};

const NOW: i64 = 1_000_000;

/// The schema before `key_generation` (migration 9).
const BEFORE_KEY_GENERATION: u32 = 8;

fn token(id: &str) -> TokenRow {
    member_token(id, NOW + 86_400)
}

fn rotation_request(id: &str) -> AdminRequest {
    AdminRequest {
        request_id: id.into(),
        method: "RotateKeyNow",
        digest: [5; 32],
        at: NOW,
        response: b"answer".to_vec(),
    }
}

/// Runs `sql` (several statements) on `t`'s database beside the stores,
/// as an operator would.
async fn run_sql(t: &Target, sql: &str) {
    if let Some(path) = t.url.strip_prefix("sqlite://") {
        let (path, sql) = (path.to_string(), sql.to_string());
        tokio::task::spawn_blocking(move || {
            let c = rusqlite::Connection::open(path).expect("open");
            c.busy_timeout(Duration::from_secs(10)).expect("busy");
            c.execute_batch(&sql).expect("sql runs");
        })
        .await
        .expect("join");
    } else {
        let (client, conn) = tokio_postgres::connect(&t.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let task = tokio::spawn(conn);
        client.batch_execute(sql).await.expect("sql runs");
        drop(client);
        let _ = task.await;
    }
}

async fn the_generation_moves_with_every_key_write_and_only_then(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let start = s.keys().await.expect("keys");
    assert!(start.rows.is_empty());
    assert_eq!(start.generation, 0, "a new database");
    assert_eq!(
        start.epoch,
        s.policy_head().await.expect("head").epoch,
        "the database's policy epoch"
    );
    assert_ne!(start.epoch, 0);

    assert!(s.init_keys(&key("k1", NOW), NOW + 100).await.expect("init"));
    let g1 = s.keys().await.expect("keys");
    assert!(g1.generation > start.generation, "{g1:?}");
    assert_eq!(g1.rows, [key("k1", NOW)]);
    assert_eq!(g1.epoch, start.epoch);

    // Writes elsewhere, reads, a second start and a rotation not claimed
    // leave it alone.
    s.create_token(&[1; 32], &token("t1")).await.expect("token");
    s.enroll(&[1; 32], &[1; 38], "n-1", "t", NOW, NOW + 60)
        .await
        .expect("store")
        .expect("enrolls");
    s.revoke(&[1; 38], "gone", NOW, NOW + 60)
        .await
        .expect("revoke");
    assert!(!s.init_keys(&key("k0", NOW), NOW + 100).await.expect("init"));
    assert!(
        !s.rotate(Some(NOW + 1), NOW + 200, &key("kx", NOW), NOW + 300)
            .await
            .expect("rotate"),
        "another deadline: not claimed"
    );
    assert_eq!(s.keys().await.expect("keys"), g1);

    // A claimed rotation: the old key's end and the new key, one snapshot.
    assert!(
        s.rotate(Some(NOW + 100), NOW + 200, &key("k2", NOW + 10), NOW + 50)
            .await
            .expect("rotate")
    );
    let g2 = s.keys().await.expect("keys");
    assert!(g2.generation > g1.generation, "{g2:?}");
    assert_eq!(g2.rows.len(), 2);
    assert_eq!(g2.rows[0].verify_until, NOW + 50);

    // An admin rotation moves it once; its retry (the same request id)
    // writes nothing.
    let req = rotation_request("rot-1");
    s.rotate_once(NOW + 300, &key("k3", NOW + 20), NOW + 60, &req)
        .await
        .expect("store")
        .expect("rotated");
    let g3 = s.keys().await.expect("keys");
    assert!(g3.generation > g2.generation);
    s.rotate_once(NOW + 300, &key("k4", NOW + 20), NOW + 60, &req)
        .await
        .expect("store")
        .expect_err("recorded already");
    assert_eq!(s.keys().await.expect("keys"), g3);

    // A reap that deletes no key leaves it; one that ends a grace moves it.
    s.reap_batch(NOW + 1, &reap_policy(), 100)
        .await
        .expect("reap");
    assert_eq!(s.keys().await.expect("keys"), g3);
    s.reap_batch(NOW + 3600, &reap_policy(), 100)
        .await
        .expect("reap");
    let g4 = s.keys().await.expect("keys");
    assert!(g4.generation > g3.generation);
    assert_eq!(g4.rows.len(), 1, "{g4:?}");

    // A new epoch (after a restore from a dump) is the set's epoch, with
    // the generation it had.
    // It carries when the epoch began: never before the one it replaced,
    // so a holder of the new set refuses a lagging replica's old one.
    assert!(g4.epoch_created_at > 0, "{g4:?}");
    let epoch = s.new_policy_epoch().await.expect("epoch");
    let g5 = s.keys().await.expect("keys");
    assert_eq!((g5.epoch, g5.generation), (epoch, g4.generation));
    assert_eq!(g5.rows, g4.rows);
    assert!(g5.epoch_created_at >= g4.epoch_created_at, "{g5:?} {g4:?}");
}

async fn two_stores_read_one_key_set_per_generation(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    assert!(
        one.init_keys(&key("k1", NOW), NOW + 100)
            .await
            .expect("init")
    );
    let first = two.keys().await.expect("keys");
    assert_eq!(one.keys().await.expect("keys"), first);
    // A rotation through one store is what the other reads next, at a
    // higher generation; what it read before stays older.
    assert!(
        one.rotate(None, NOW + 200, &key("k2", NOW + 10), NOW + 50)
            .await
            .expect("rotate")
    );
    let second = two.keys().await.expect("keys");
    assert_eq!(one.keys().await.expect("keys"), second);
    assert!(second.generation > first.generation);
    assert_eq!(second.epoch, first.epoch);
    assert!(second.rows.iter().any(|k| k.key_id == "k2"));
}

async fn an_upgraded_database_holding_keys_starts_above_zero(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    {
        let s = t.open().await;
        assert!(s.init_keys(&key("k1", NOW), NOW + 100).await.expect("init"));
        assert!(
            s.rotate(None, NOW + 200, &key("k2", NOW + 10), NOW + 50)
                .await
                .expect("rotate")
        );
    }
    // The database as a binary of schema 8 left it: no counter.
    let undo = match b {
        Backend::Sqlite => {
            "DROP TRIGGER signing_keys_generation_insert;
             DROP TRIGGER signing_keys_generation_update;
             DROP TRIGGER signing_keys_generation_delete;"
        }
        Backend::Postgres => {
            "DROP TRIGGER signing_keys_generation ON signing_keys;
             DROP FUNCTION bump_key_generation();"
        }
    };
    run_sql(
        &t,
        &format!(
            "{undo} DROP TABLE key_generation;
             UPDATE schema_version SET version = {BEFORE_KEY_GENERATION} WHERE id = 1;"
        ),
    )
    .await;
    let s = t.open().await;
    let upgraded = s.keys().await.expect("keys");
    assert_eq!(upgraded.rows.len(), 2);
    assert_eq!(upgraded.generation, 2, "one per key stored");
    assert!(
        s.rotate(None, NOW + 300, &key("k3", NOW + 20), NOW + 60)
            .await
            .expect("rotate")
    );
    assert!(s.keys().await.expect("keys").generation > upgraded.generation);
}

on_both!(
    the_generation_moves_with_every_key_write_and_only_then,
    two_stores_read_one_key_set_per_generation,
    an_upgraded_database_holding_keys_starts_above_zero,
);
