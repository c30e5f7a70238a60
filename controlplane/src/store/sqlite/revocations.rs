//! Revocations: one transaction marks the node revoked, records (or
//! extends) its revocation until its last credential expires, and deletes
//! its lease. A token's revocation does the same for every node of the
//! token, in one `BEGIN IMMEDIATE` transaction, so no enrollment with the
//! token can commit between its checks and its writes.

use rusqlite::{OptionalExtension, Transaction, TransactionBehavior, params};

use super::{Inner, rows::epoch_and_generation};
use crate::store::{RevocationRow, StoreError, StoredRevocations};

impl Inner {
    /// The list, its generation and the epoch in one read transaction (a
    /// WAL snapshot): a revocation committing meanwhile is either in all
    /// three or in none.
    pub(super) fn revocations(&self) -> Result<StoredRevocations, StoreError> {
        let conn = self.readers.get()?;
        let tx = conn.unchecked_transaction()?;
        let (epoch, generation) = epoch_and_generation(&tx, "revocation_generation")?;
        let mut rows = Vec::new();
        {
            let mut st = tx.prepare_cached(
                "SELECT peer_id, until, reason FROM revocations ORDER BY peer_id",
            )?;
            for r in st.query_map([], |r| {
                Ok(RevocationRow {
                    peer_id: r.get(0)?,
                    token_id: String::new(),
                    until: r.get(1)?,
                    reason: r.get(2)?,
                })
            })? {
                rows.push(r?);
            }
            let mut st = tx.prepare_cached(
                "SELECT token_id, until, reason FROM token_revocations ORDER BY token_id",
            )?;
            for r in st.query_map([], |r| {
                Ok(RevocationRow {
                    peer_id: Vec::new(),
                    token_id: r.get(0)?,
                    until: r.get(1)?,
                    reason: r.get(2)?,
                })
            })? {
                rows.push(r?);
            }
        }
        tx.commit()?;
        Ok(StoredRevocations {
            epoch,
            generation,
            rows,
        })
    }

    pub(super) fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let until = revoke_in(&tx, peer_id, reason, now, default_until)?;
        tx.commit()?;
        Ok(until)
    }

    pub(super) fn revoke_token(
        &self,
        token_id: &str,
        reason: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<i64>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let until = revoke_token_in(&tx, token_id, reason, now, until)?;
        if until.is_some() {
            tx.commit()?;
        }
        Ok(until)
    }
}

/// A node's revocation inside `tx`; returns until when it is published.
pub(super) fn revoke_in(
    tx: &Transaction<'_>,
    peer_id: &[u8],
    reason: &str,
    now: i64,
    default_until: i64,
) -> Result<i64, StoreError> {
    let last_expiry: Option<i64> = tx
        .query_row(
            "SELECT cred_expires_at FROM nodes WHERE peer_id = ?1",
            params![peer_id],
            |r| r.get(0),
        )
        .optional()?;
    let until = last_expiry.unwrap_or(0).max(default_until);
    tx.execute(
        "UPDATE nodes SET revoked = 1 WHERE peer_id = ?1",
        params![peer_id],
    )?;
    let until: i64 = tx.query_row(
        "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(peer_id) DO UPDATE SET until = MAX(until, excluded.until), reason = excluded.reason
         RETURNING until",
        params![peer_id, until, reason, now],
        |r| r.get(0),
    )?;
    tx.execute(
        "DELETE FROM router_leases WHERE peer_id = ?1",
        params![peer_id],
    )?;
    Ok(until)
}

/// A token's revocation inside `tx`; `None` (nothing written) when no
/// token, node or revocation has the id.
pub(super) fn revoke_token_in(
    tx: &Transaction<'_>,
    token_id: &str,
    reason: &str,
    now: i64,
    until: i64,
) -> Result<Option<i64>, StoreError> {
    let known = tx
        .query_row(
            "SELECT 1 WHERE EXISTS (SELECT 1 FROM tokens WHERE token_id = ?1)
               OR EXISTS (SELECT 1 FROM nodes WHERE token_id = ?1)
               OR EXISTS (SELECT 1 FROM token_revocations WHERE token_id = ?1)",
            params![token_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if !known {
        return Ok(None);
    }
    tx.execute(
        "UPDATE tokens SET expires_at = MIN(expires_at, ?2) WHERE token_id = ?1",
        params![token_id, now],
    )?;
    let last_expiry: Option<i64> = tx.query_row(
        "SELECT MAX(cred_expires_at) FROM nodes WHERE token_id = ?1",
        params![token_id],
        |r| r.get(0),
    )?;
    let until = last_expiry.unwrap_or(0).max(until);
    tx.execute(
        "DELETE FROM router_leases WHERE peer_id IN (SELECT peer_id FROM nodes WHERE token_id = ?1)",
        params![token_id],
    )?;
    tx.execute(
        "UPDATE nodes SET revoked = 1 WHERE token_id = ?1",
        params![token_id],
    )?;
    let until: i64 = tx.query_row(
        "INSERT INTO token_revocations (token_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(token_id) DO UPDATE SET until = MAX(until, excluded.until), reason = excluded.reason
         RETURNING until",
        params![token_id, until, reason, now],
        |r| r.get(0),
    )?;
    Ok(Some(until))
}
