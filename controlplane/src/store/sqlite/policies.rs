//! Policy versions and the epoch (see [`crate::store::policies`]): an
//! apply reads the version in force and writes the next one in one `BEGIN
//! IMMEDIATE` transaction, which holds the file's write lock, so two
//! processes applying at once are serialised and number their versions
//! apart.

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::Inner;
use crate::store::{
    AppliedPolicy, NewPolicy, PolicyHead, PolicyRow, StoreError,
    policies::{epoch_from, new_epoch, version_from, version_to},
};

const COLS: &str = "version, text, applied_at, applied_by, applied_from, replaced_at";

fn row_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, PolicyRow)> {
    Ok((
        r.get(0)?,
        PolicyRow {
            version: 0,
            text: r.get(1)?,
            applied_at: r.get(2)?,
            applied_by: r.get(3)?,
            applied_from: r.get(4)?,
            replaced_at: r.get(5)?,
        },
    ))
}

fn finish((v, mut row): (i64, PolicyRow)) -> Result<PolicyRow, StoreError> {
    row.version = version_from(v)?;
    Ok(row)
}

/// Gives a database without an epoch its first (a new database, or one
/// from before policies); keeps an existing one.
pub(super) fn ensure_epoch(conn: &Connection) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO policy_epoch (id, epoch, created_at) VALUES (1, ?1, ?2)
         ON CONFLICT(id) DO NOTHING",
        params![new_epoch(), agentmesh_proto::unix_now()],
    )?;
    Ok(())
}

/// Replaces the epoch with a new random one; returns it.
pub(super) fn replace_epoch(conn: &Connection) -> Result<u64, StoreError> {
    let epoch = new_epoch();
    conn.execute(
        "INSERT INTO policy_epoch (id, epoch, created_at) VALUES (1, ?1, ?2)
         ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, created_at = excluded.created_at",
        params![epoch, agentmesh_proto::unix_now()],
    )?;
    Ok(epoch_from(epoch))
}

/// Every kept version, oldest first (`store copy`).
pub(super) fn read_policies(conn: &Connection) -> Result<Vec<PolicyRow>, StoreError> {
    conn.prepare(&format!("SELECT {COLS} FROM policies ORDER BY version"))?
        .query_map([], row_from)?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(finish)
        .collect()
}

/// Writes one version as it is (`store copy`).
pub(super) fn insert_policy(conn: &Connection, p: &PolicyRow) -> Result<(), StoreError> {
    conn.execute(
        &format!("INSERT INTO policies ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
        params![
            version_to(p.version)?,
            p.text,
            p.applied_at,
            p.applied_by,
            p.applied_from,
            p.replaced_at
        ],
    )?;
    Ok(())
}

impl Inner {
    pub(super) fn policy_head(&self) -> Result<PolicyHead, StoreError> {
        let conn = self.readers.get()?;
        let (epoch, version): (i64, Option<i64>) = conn.query_row(
            "SELECT (SELECT epoch FROM policy_epoch WHERE id = 1), (SELECT MAX(version) FROM policies)",
            [],
            |r| Ok((r.get::<_, Option<i64>>(0)?.unwrap_or(0), r.get(1)?)),
        )?;
        Ok(PolicyHead {
            epoch: epoch_from(epoch),
            version: version.map(version_from).transpose()?,
        })
    }

    pub(super) fn policy(&self, version: u64) -> Result<Option<PolicyRow>, StoreError> {
        let conn = self.readers.get()?;
        conn.query_row(
            &format!("SELECT {COLS} FROM policies WHERE version = ?1"),
            params![version_to(version)?],
            row_from,
        )
        .optional()?
        .map(finish)
        .transpose()
    }

    pub(super) fn apply_policy(&self, new: &NewPolicy) -> Result<AppliedPolicy, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done = apply_in(&tx, new)?;
        tx.commit()?;
        Ok(done)
    }

    pub(super) fn new_policy_epoch(&self) -> Result<u64, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let epoch = replace_epoch(&tx)?;
        tx.commit()?;
        Ok(epoch)
    }
}

/// An apply inside `tx` (which holds the write lock): the next version,
/// unless the text is in force (or, [`NewPolicy::unless_replaced`], was
/// replaced since).
pub(super) fn apply_in(tx: &Transaction<'_>, new: &NewPolicy) -> Result<AppliedPolicy, StoreError> {
    let current: Option<(i64, String)> = tx
        .query_row(
            "SELECT version, text FROM policies ORDER BY version DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if let Some((v, text)) = &current
        && *text == new.text
    {
        return Ok(AppliedPolicy::Unchanged(version_from(*v)?));
    }
    if let Some((head, _)) = &current
        && new.unless_replaced
    {
        let was: Option<i64> = tx.query_row(
            "SELECT MAX(version) FROM policies WHERE text = ?1",
            params![new.text],
            |r| r.get(0),
        )?;
        if let Some(was) = was {
            return Ok(AppliedPolicy::Superseded {
                was: version_from(was)?,
                head: version_from(*head)?,
            });
        }
    }
    let next = current.as_ref().map_or(1, |(v, _)| v + 1);
    if let Some((v, _)) = &current {
        tx.execute(
            "UPDATE policies SET replaced_at = ?2 WHERE version = ?1",
            params![v, new.applied_at],
        )?;
    }
    tx.execute(
        &format!("INSERT INTO policies ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, NULL)"),
        params![
            next,
            new.text,
            new.applied_at,
            new.applied_by,
            new.applied_from
        ],
    )?;
    Ok(AppliedPolicy::Applied(version_from(next)?))
}
