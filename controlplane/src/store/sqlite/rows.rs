//! SQLite rows into the store's types: a node row, whose labels are
//! parsed apart so a corrupt label is a [`StoreError::Corrupt`] and not a
//! driver error.

use std::collections::BTreeMap;

use rusqlite::Row;

use crate::store::{NodeRow, StoreError, columns::parse_labels};

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
