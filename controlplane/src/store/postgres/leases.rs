//! Router leases and the directory: a lease is written after locking its
//! node's row (`FOR UPDATE`, the row a revocation updates first), so a
//! revocation either is seen or deletes the lease after it; the directory is
//! read in one read-only REPEATABLE READ transaction.

use super::{
    PostgresStore, Tx,
    rows::{LEASE_COLS, lease_from, node_from},
};
use crate::store::{
    LeaseRow, NodeRefusal, NodeRow, ROUTER_ROLE, StoreError,
    columns::{NODE_COLS, labels_json},
};

pub(super) async fn router_lease(
    store: &PostgresStore,
    lease: &LeaseRow,
    now: i64,
) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    // FOR UPDATE: a revocation (which updates this row first) either
    // commits before and is seen here, or waits and deletes our lease.
    let st = tx
        .prepare_cached(&format!(
            "SELECT {NODE_COLS} FROM nodes WHERE peer_id = $1 FOR UPDATE"
        ))
        .await?;
    let Some(row) = tx.query_opt(&st, &[&lease.peer_id]).await? else {
        return Ok(Err(NodeRefusal::UnknownNode));
    };
    let mut node = node_from(&row)?;
    let st = tx
        .prepare_cached("SELECT 1 FROM revocations WHERE peer_id = $1 AND until > $2")
        .await?;
    if node.revoked || tx.query_opt(&st, &[&lease.peer_id, &now]).await?.is_some() {
        return Ok(Err(NodeRefusal::Revoked));
    }
    if node.role != ROUTER_ROLE {
        return Ok(Err(NodeRefusal::NotARouter));
    }
    node.last_seen = now.max(1);
    let st = tx
        .prepare_cached("UPDATE nodes SET last_seen = $2 WHERE peer_id = $1")
        .await?;
    tx.execute(&st, &[&lease.peer_id, &node.last_seen]).await?;
    insert_lease(&tx, lease, true).await?;
    tx.commit().await?;
    Ok(Ok(node))
}

pub(super) async fn directory(
    store: &PostgresStore,
    now: i64,
) -> Result<Vec<LeaseRow>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.build_transaction().read_only(true).start().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx
        .prepare_cached(&format!(
            "SELECT {LEASE_COLS} FROM router_leases WHERE expires_at > $1 ORDER BY node_id"
        ))
        .await?;
    let leases = tx
        .query(&st, &[&now])
        .await?
        .iter()
        .map(lease_from)
        .collect::<Result<Vec<_>, _>>()?;
    tx.commit().await?;
    Ok(leases)
}

pub(super) async fn insert_lease(
    tx: &Tx<'_>,
    l: &LeaseRow,
    upsert: bool,
) -> Result<(), StoreError> {
    let on_conflict = if upsert {
        "ON CONFLICT (peer_id) DO UPDATE SET node_id = excluded.node_id, addrs = excluded.addrs,
           labels = excluded.labels, attached = excluded.attached, transit = excluded.transit,
           high = excluded.high, low = excluded.low, draining = excluded.draining,
           expires_at = excluded.expires_at"
    } else {
        ""
    };
    let addrs = serde_json::to_string(&l.addrs).unwrap_or_else(|_| "[]".into());
    let labels = labels_json(&l.labels);
    let (a, t, h, lo) = (
        i64::from(l.attached),
        i64::from(l.transit),
        i64::from(l.high),
        i64::from(l.low),
    );
    let sql = format!(
        "INSERT INTO router_leases ({LEASE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) {on_conflict}"
    );
    let st = tx.prepare_cached(&sql).await?;
    tx.execute(
        &st,
        &[
            &l.peer_id,
            &l.node_id,
            &addrs,
            &labels,
            &a,
            &t,
            &h,
            &lo,
            &l.draining,
            &l.expires_at,
        ],
    )
    .await?;
    Ok(())
}
