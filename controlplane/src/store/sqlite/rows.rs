//! SQLite rows into the store's types: a node row, whose labels are
//! parsed apart so a corrupt label is a [`StoreError::Corrupt`] and not a
//! driver error; the epoch and a generation counter.

use std::collections::BTreeMap;

use rusqlite::{Connection, Row};

use crate::store::{NodeRow, StoreError, columns::parse_labels, policies::epoch_from};

/// The database's policy epoch and the generation in the counter row of
/// `counter` (`revocation_generation`, `key_generation`), as read in the
/// caller's transaction, with what they order (0 for a row not made yet).
pub(super) fn epoch_and_generation(
    conn: &Connection,
    counter: &'static str,
) -> Result<(u64, u64), StoreError> {
    let (epoch, generation): (Option<i64>, Option<i64>) = conn.query_row(
        &format!(
            "SELECT (SELECT epoch FROM policy_epoch WHERE id = 1),
                    (SELECT generation FROM {counter} WHERE id = 1)"
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok((
        epoch_from(epoch.unwrap_or(0)),
        generation.unwrap_or(0).max(0) as u64,
    ))
}

/// When the database's epoch began, as read in the caller's transaction
/// (0 before it has one).
pub(super) fn epoch_created_at(conn: &Connection) -> Result<i64, StoreError> {
    let at: Option<i64> = conn.query_row(
        "SELECT (SELECT created_at FROM policy_epoch WHERE id = 1)",
        [],
        |r| r.get(0),
    )?;
    Ok(at.unwrap_or(0).max(0))
}

pub(super) fn node_from_row(r: &Row<'_>) -> rusqlite::Result<(NodeRow, String)> {
    Ok((
        NodeRow {
            node_id: r.get(0)?,
            peer_id: r.get(1)?,
            role: r.get(2)?,
            token_kind: r.get(3)?,
            token_id: r.get(4)?,
            labels: BTreeMap::new(),
            enrolled_at: r.get(6)?,
            last_seen: r.get(7)?,
            cred_expires_at: r.get(8)?,
            revoked: r.get::<_, i64>(9)? != 0,
        },
        r.get(5)?,
    ))
}

pub(super) fn finish_node((mut n, labels): (NodeRow, String)) -> Result<NodeRow, StoreError> {
    n.labels = parse_labels("nodes", &labels)?;
    Ok(n)
}
