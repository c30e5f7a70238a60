//! Duty leases on SQLite. One file serves one process, so a lease here
//! only ever has one claimant; the same rules as PostgreSQL keep the two
//! backends' behaviour (and the shared suite) alike.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::Inner;
use crate::store::{REPLICA_DUTY_PREFIX, StoreError, replica_duty};

/// The database's clock in milliseconds.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

impl Inner {
    pub(super) fn claim_duty(
        &self,
        duty: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let won = tx
            .query_row(
                &format!(
                    "INSERT INTO duty_leases (duty, holder, expires_at_ms)
                     VALUES (?1, ?2, {NOW_MS} + ?3)
                     ON CONFLICT (duty) DO UPDATE
                        SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
                      WHERE duty_leases.holder = excluded.holder
                         OR duty_leases.expires_at_ms <= {NOW_MS}
                     RETURNING holder"
                ),
                params![duty, holder, ttl_ms],
                |r| r.get::<_, String>(0),
            )
            .optional()?;
        tx.commit()?;
        Ok(won.is_some())
    }

    pub(super) fn replica_heartbeat(&self, holder: &str, ttl_ms: i64) -> Result<u32, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            &format!(
                "INSERT INTO duty_leases (duty, holder, expires_at_ms)
                 VALUES (?1, ?2, {NOW_MS} + ?3)
                 ON CONFLICT (duty) DO UPDATE
                    SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
            ),
            params![replica_duty(holder), holder, ttl_ms],
        )?;
        let like = format!("{REPLICA_DUTY_PREFIX}%");
        tx.execute(
            &format!("DELETE FROM duty_leases WHERE duty LIKE ?1 AND expires_at_ms <= {NOW_MS}"),
            params![like],
        )?;
        let live: i64 = tx.query_row(
            "SELECT COUNT(*) FROM duty_leases WHERE duty LIKE ?1",
            params![like],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(u32::try_from(live).unwrap_or(u32::MAX))
    }

    pub(super) fn release_duty(&self, duty: &str, holder: &str) -> Result<(), StoreError> {
        let conn = self.writer.get()?;
        conn.execute(
            "DELETE FROM duty_leases WHERE duty = ?1 AND holder = ?2",
            params![duty, holder],
        )?;
        Ok(())
    }
}
