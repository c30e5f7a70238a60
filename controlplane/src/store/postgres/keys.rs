//! Signing keys and the rotation deadline: the first key is created under a
//! transaction-level advisory lock (two processes starting on an empty
//! database end with one key), a rotation is claimed by a conditional
//! update of the deadline, and every secret is sealed with the
//! key-encryption key on the way in and opened on the way out.

use super::{
    LOCK_KEYS, PostgresStore, Tx,
    rows::{epoch_and_generation, epoch_created_at},
};
use crate::store::{SigningKeyRow, StoreError, StoredKeys, snapshot::KeyEntry};

impl PostgresStore {
    pub(super) async fn reseal_keys(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEYS])
            .await?;
        for r in tx
            .query("SELECT key_id, secret FROM signing_keys", &[])
            .await?
        {
            let (id, stored): (String, Vec<u8>) = (r.get(0), r.get(1));
            if self.kek.needs_reseal(&stored) {
                let sealed = self.kek.seal(&id, &self.kek.open(&id, &stored)?)?;
                tx.execute(
                    "UPDATE signing_keys SET secret = $2 WHERE key_id = $1",
                    &[&id, &sealed],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn insert_key(
        &self,
        tx: &Tx<'_>,
        k: &SigningKeyRow,
        created_at: i64,
    ) -> Result<(), StoreError> {
        let sealed = self.kek.seal(&k.key_id, &k.secret)?;
        tx.execute(
            "INSERT INTO signing_keys (key_id, secret, public, created_at, active_from, verify_until)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[&k.key_id, &sealed, &k.public, &created_at, &k.active_from, &k.verify_until],
        )
        .await?;
        Ok(())
    }

    pub(super) async fn read_keys(&self, tx: &Tx<'_>) -> Result<Vec<KeyEntry>, StoreError> {
        let rows = tx
            .query(
                "SELECT key_id, secret, public, active_from, verify_until, created_at FROM signing_keys
                 ORDER BY active_from, created_at, key_id",
                &[],
            )
            .await?;
        rows.into_iter()
            .map(|r| {
                let key_id: String = r.get(0);
                let secret = self.kek.open(&key_id, &r.get::<_, Vec<u8>>(1))?;
                Ok(KeyEntry {
                    row: SigningKeyRow {
                        key_id,
                        secret,
                        public: r.get(2),
                        active_from: r.get(3),
                        verify_until: r.get(4),
                    },
                    created_at: r.get(5),
                })
            })
            .collect()
    }
}

/// The keys, their generation and the epoch in one REPEATABLE READ
/// snapshot: a key write committing meanwhile is in all three or in none.
pub(super) async fn keys(store: &PostgresStore) -> Result<StoredKeys, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = PostgresStore::read_snapshot(&mut conn, ms).await?;
    let (epoch, generation) = epoch_and_generation(&tx, "key_generation").await?;
    let epoch_created_at = epoch_created_at(&tx).await?;
    let keys = store.read_keys(&tx).await?;
    tx.commit().await?;
    Ok(StoredKeys {
        epoch,
        generation,
        epoch_created_at,
        rows: keys.into_iter().map(|k| k.row).collect(),
    })
}

pub(super) async fn init_keys(
    store: &PostgresStore,
    first: &SigningKeyRow,
    next_rotation_at: i64,
) -> Result<bool, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    // Two processes starting on an empty database: the second waits
    // here for the first to commit, then counts its key.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEYS])
        .await?;
    let n: i64 = tx
        .query_one("SELECT COUNT(*) FROM signing_keys", &[])
        .await?
        .get(0);
    if n > 0 {
        tx.execute(
            "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
            &[&next_rotation_at],
        )
        .await?;
        tx.commit().await?;
        return Ok(false);
    }
    store
        .insert_key(&tx, first, agentmesh_proto::unix_now())
        .await?;
    tx.execute(
        "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
        &[&next_rotation_at],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn next_rotation_at(store: &PostgresStore) -> Result<Option<i64>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let v = tx
        .query_opt(
            "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
            &[],
        )
        .await?
        .map(|r| r.get(0));
    tx.commit().await?;
    Ok(v)
}

pub(super) async fn rotate(
    store: &PostgresStore,
    expected: Option<i64>,
    next: i64,
    new_key: &SigningKeyRow,
    retire_until: i64,
) -> Result<bool, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if !rotate_in(store, &tx, expected, next, new_key, retire_until).await? {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// The rotation inside `tx`: claims it, retires every key without an end
/// and stores `new_key`. Returns whether claimed.
pub(super) async fn rotate_in(
    store: &PostgresStore,
    tx: &Tx<'_>,
    expected: Option<i64>,
    next: i64,
    new_key: &SigningKeyRow,
    retire_until: i64,
) -> Result<bool, StoreError> {
    // The claim: of two processes seeing the same deadline pass, the
    // second's UPDATE waits for the first's row lock and then matches
    // nothing, the deadline having moved.
    let claimed = match expected {
        Some(old) => {
            tx.execute(
                "UPDATE rotation_state SET next_rotation_at = $2 WHERE id = 1 AND next_rotation_at = $1",
                &[&old, &next],
            )
            .await?
        }
        None => {
            tx.execute(
                "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
                &[&next],
            )
            .await?
        }
    };
    if claimed != 1 {
        return Ok(false);
    }
    tx.execute(
        "UPDATE signing_keys SET verify_until = $1 WHERE verify_until = 0",
        &[&retire_until],
    )
    .await?;
    store
        .insert_key(tx, new_key, agentmesh_proto::unix_now())
        .await?;
    Ok(true)
}
