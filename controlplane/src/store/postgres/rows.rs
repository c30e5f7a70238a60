//! PostgreSQL rows into the store's types. Every integer is stored as
//! BIGINT; one that does not fit the field it is read into is a
//! [`StoreError::Corrupt`] naming the column, never a silent truncation.

use tokio_postgres::Row;

use super::Tx;
use crate::store::{
    LeaseRow, NodeRow, StoreError,
    columns::{parse_addrs, parse_labels},
    policies::epoch_from,
};

/// The database's policy epoch and the generation in the counter row of
/// `counter` (`revocation_generation`, `key_generation`), as read in the
/// caller's transaction, with what they order (0 for a row not made yet).
pub(super) async fn epoch_and_generation(
    tx: &Tx<'_>,
    counter: &'static str,
) -> Result<(u64, u64), StoreError> {
    let sql = format!(
        "SELECT (SELECT epoch FROM policy_epoch WHERE id = 1),
                (SELECT generation FROM {counter} WHERE id = 1)"
    );
    let head = tx.query_one(sql.as_str(), &[]).await?;
    let (epoch, generation): (Option<i64>, Option<i64>) = (head.get(0), head.get(1));
    Ok((
        epoch_from(epoch.unwrap_or(0)),
        generation.unwrap_or(0).max(0) as u64,
    ))
}

/// When the database's epoch began, as read in the caller's transaction
/// (0 before it has one).
pub(super) async fn epoch_created_at(tx: &Tx<'_>) -> Result<i64, StoreError> {
    let row = tx
        .query_one(
            "SELECT (SELECT created_at FROM policy_epoch WHERE id = 1)",
            &[],
        )
        .await?;
    let at: Option<i64> = row.get(0);
    Ok(at.unwrap_or(0).max(0))
}

pub(super) fn int<T: TryFrom<i64>>(
    table: &'static str,
    col: &str,
    v: i64,
) -> Result<T, StoreError> {
    T::try_from(v).map_err(|_| StoreError::Corrupt {
        table,
        what: format!("{col} = {v} out of range"),
    })
}

pub(super) fn node_from(r: &Row) -> Result<NodeRow, StoreError> {
    Ok(NodeRow {
        node_id: r.get(0),
        peer_id: r.get(1),
        role: int("nodes", "role", r.get(2))?,
        token_kind: int("nodes", "token_kind", r.get(3))?,
        token_id: r.get(4),
        labels: parse_labels("nodes", r.get(5))?,
        enrolled_at: r.get(6),
        last_seen: r.get(7),
        cred_expires_at: r.get(8),
        revoked: r.get(9),
    })
}

pub(super) fn lease_from(r: &Row) -> Result<LeaseRow, StoreError> {
    Ok(LeaseRow {
        peer_id: r.get(0),
        node_id: r.get(1),
        addrs: parse_addrs(r.get(2))?,
        labels: parse_labels("router_leases", r.get(3))?,
        attached: int("router_leases", "attached", r.get(4))?,
        transit: int("router_leases", "transit", r.get(5))?,
        high: int("router_leases", "high", r.get(6))?,
        low: int("router_leases", "low", r.get(7))?,
        draining: r.get(8),
        expires_at: r.get(9),
    })
}

pub(super) const LEASE_COLS: &str =
    "peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at";
