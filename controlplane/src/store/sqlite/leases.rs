//! Router leases and the directory: a lease is written in the transaction
//! that checks its node (see [`Inner::touch_in`]); the directory is the live
//! leases and active revocations, read on a read-only connection.

use std::collections::BTreeMap;

use rusqlite::{Connection, TransactionBehavior, params};

use super::Inner;
use crate::store::{
    LeaseRow, NodeRefusal, NodeRow, StoreError,
    columns::{labels_json, parse_addrs, parse_labels},
};

impl Inner {
    pub(super) fn router_lease(
        &self,
        l: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = Self::touch_in(&tx, &l.peer_id, now, None, true)?;
        if out.is_ok() {
            insert_lease(&tx, l, true)?;
            tx.commit()?;
        }
        Ok(out)
    }

    pub(super) fn directory(&self, now: i64) -> Result<Vec<LeaseRow>, StoreError> {
        let conn = self.readers.get()?;
        read_leases(&conn, Some(now))
    }
}

pub(super) fn insert_lease(
    conn: &Connection,
    l: &LeaseRow,
    upsert: bool,
) -> Result<(), StoreError> {
    let on_conflict = if upsert {
        "ON CONFLICT(peer_id) DO UPDATE SET node_id = excluded.node_id, addrs = excluded.addrs,
           labels = excluded.labels, attached = excluded.attached, transit = excluded.transit,
           high = excluded.high, low = excluded.low, draining = excluded.draining,
           expires_at = excluded.expires_at"
    } else {
        ""
    };
    conn.execute(
        &format!(
            "INSERT INTO router_leases (peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) {on_conflict}"
        ),
        params![
            l.peer_id,
            l.node_id,
            serde_json::to_string(&l.addrs).unwrap_or_else(|_| "[]".into()),
            labels_json(&l.labels),
            l.attached,
            l.transit,
            l.high,
            l.low,
            l.draining,
            l.expires_at
        ],
    )?;
    Ok(())
}

/// Leases live at `now`, or all of them.
pub(super) fn read_leases(
    conn: &Connection,
    now: Option<i64>,
) -> Result<Vec<LeaseRow>, StoreError> {
    let mut st = conn.prepare_cached(
        "SELECT peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at
         FROM router_leases WHERE expires_at > ?1 ORDER BY node_id",
    )?;
    let raw = st
        .query_map(params![now.unwrap_or(i64::MIN)], |r| {
            Ok((
                LeaseRow {
                    peer_id: r.get(0)?,
                    node_id: r.get(1)?,
                    addrs: Vec::new(),
                    labels: BTreeMap::new(),
                    attached: r.get(4)?,
                    transit: r.get(5)?,
                    high: r.get(6)?,
                    low: r.get(7)?,
                    draining: r.get(8)?,
                    expires_at: r.get(9)?,
                },
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    raw.into_iter()
        .map(|(mut l, addrs, labels)| {
            l.addrs = parse_addrs(&addrs)?;
            l.labels = parse_labels("router_leases", &labels)?;
            Ok(l)
        })
        .collect()
}
