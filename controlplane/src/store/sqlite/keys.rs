//! Signing keys and the rotation deadline: the first key created under the
//! file's write lock, a rotation claimed by a conditional update, every
//! secret sealed with the key-encryption key on the way in and opened on
//! the way out (and sealed again at open after a KEK rotation).

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{
    Inner,
    rows::{epoch_and_generation, epoch_created_at},
};
use crate::store::{Kek, SigningKeyRow, StoreError, StoredKeys, snapshot::KeyEntry};

impl Inner {
    /// The keys, their generation and the epoch in one read transaction
    /// (a WAL snapshot): a key write committing meanwhile is in all three
    /// or in none.
    pub(super) fn keys(&self) -> Result<StoredKeys, StoreError> {
        let conn = self.readers.get()?;
        let tx = conn.unchecked_transaction()?;
        let (epoch, generation) = epoch_and_generation(&tx, "key_generation")?;
        let epoch_created_at = epoch_created_at(&tx)?;
        let rows = read_keys(&tx, &self.kek)?
            .into_iter()
            .map(|k| k.row)
            .collect();
        tx.commit()?;
        Ok(StoredKeys {
            epoch,
            generation,
            epoch_created_at,
            rows,
        })
    }

    pub(super) fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.writer.get()?;
        // IMMEDIATE takes the file's write lock before the count: a second
        // process waits here and then finds the first one's key.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n: i64 = tx.query_row("SELECT COUNT(*) FROM signing_keys", [], |r| r.get(0))?;
        if n > 0 {
            tx.execute(
                "INSERT OR IGNORE INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)",
                params![next_rotation_at],
            )?;
            tx.commit()?;
            return Ok(false);
        }
        insert_key(&tx, &self.kek, first, agentmesh_proto::unix_now())?;
        tx.execute(
            "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)
             ON CONFLICT(id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
            params![next_rotation_at],
        )?;
        tx.commit()?;
        Ok(true)
    }

    pub(super) fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        Ok(self
            .readers
            .get()?
            .query_row(
                "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub(super) fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if !rotate_in(&tx, &self.kek, expected, next, new_key, retire_until)? {
            return Ok(false);
        }
        tx.commit()?;
        Ok(true)
    }
}

/// The rotation inside `tx`: claims it (see [`Inner::rotate`]), retires
/// every key without an end and stores `new_key`. Returns whether claimed.
pub(super) fn rotate_in(
    tx: &rusqlite::Transaction<'_>,
    kek: &Kek,
    expected: Option<i64>,
    next: i64,
    new_key: &SigningKeyRow,
    retire_until: i64,
) -> Result<bool, StoreError> {
    let claimed = match expected {
        Some(old) => tx.execute(
            "UPDATE rotation_state SET next_rotation_at = ?2 WHERE id = 1 AND next_rotation_at = ?1",
            params![old, next],
        )?,
        None => tx.execute(
            "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)
             ON CONFLICT(id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
            params![next],
        )?,
    };
    if claimed != 1 {
        return Ok(false);
    }
    tx.execute(
        "UPDATE signing_keys SET verify_until = ?1 WHERE verify_until = 0",
        params![retire_until],
    )?;
    insert_key(tx, kek, new_key, agentmesh_proto::unix_now())?;
    Ok(true)
}

/// Seals, in one transaction, every signing key stored in the clear or
/// under a previous key-encryption key.
pub(super) fn reseal_keys(conn: &mut Connection, kek: &Kek) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let rows = tx
        .prepare("SELECT key_id, secret FROM signing_keys")?
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, stored) in rows.into_iter().filter(|(_, s)| kek.needs_reseal(s)) {
        let sealed = kek.seal(&id, &kek.open(&id, &stored)?)?;
        tx.execute(
            "UPDATE signing_keys SET secret = ?2 WHERE key_id = ?1",
            params![id, sealed],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Every key, opened, in signing order.
pub(super) fn read_keys(conn: &Connection, kek: &Kek) -> Result<Vec<KeyEntry>, StoreError> {
    let mut st = conn.prepare_cached(
        "SELECT key_id, secret, public, active_from, verify_until, created_at FROM signing_keys ORDER BY active_from, created_at, rowid",
    )?;
    let rows = st
        .query_map([], |r| {
            Ok(KeyEntry {
                row: SigningKeyRow {
                    key_id: r.get(0)?,
                    secret: r.get(1)?,
                    public: r.get(2)?,
                    active_from: r.get(3)?,
                    verify_until: r.get(4)?,
                },
                created_at: r.get(5)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|mut k| {
            k.row.secret = kek.open(&k.row.key_id, &k.row.secret)?;
            Ok(k)
        })
        .collect()
}

pub(super) fn insert_key(
    tx: &rusqlite::Transaction<'_>,
    kek: &Kek,
    k: &SigningKeyRow,
    created_at: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO signing_keys (key_id, secret, public, created_at, active_from, verify_until)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            k.key_id,
            kek.seal(&k.key_id, &k.secret)?,
            k.public,
            created_at,
            k.active_from,
            k.verify_until
        ],
    )?;
    Ok(())
}
