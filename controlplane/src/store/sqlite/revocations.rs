//! Revocations: one transaction marks the node revoked, records (or
//! extends) its revocation until its last credential expires, and deletes
//! its lease.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::Inner;
use crate::store::StoreError;

impl Inner {
    pub(super) fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
        tx.commit()?;
        Ok(until)
    }
}
