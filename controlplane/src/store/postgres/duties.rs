//! Duty leases on PostgreSQL: one conditional upsert timed by the server's
//! `clock_timestamp()`, so replicas whose clocks disagree still agree on
//! when a lease lapsed, and two claiming at once get one winner (the row
//! lock of `ON CONFLICT … DO UPDATE` orders them).

use super::PostgresStore;
use crate::store::{REPLICA_DUTY_PREFIX, StoreError, replica_duty};

/// The server's clock in milliseconds.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

pub(super) async fn claim(
    store: &PostgresStore,
    duty: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<bool, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx
        .prepare_cached(&format!(
            "INSERT INTO duty_leases (duty, holder, expires_at_ms)
             VALUES ($1, $2, {NOW_MS} + $3)
             ON CONFLICT (duty) DO UPDATE
                SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
              WHERE duty_leases.holder = excluded.holder
                 OR duty_leases.expires_at_ms <= {NOW_MS}
             RETURNING holder"
        ))
        .await?;
    let won = tx.query_opt(&st, &[&duty, &holder, &ttl_ms]).await?;
    tx.commit().await?;
    Ok(won.is_some())
}

pub(super) async fn heartbeat(
    store: &PostgresStore,
    holder: &str,
    ttl_ms: i64,
) -> Result<u32, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx
        .prepare_cached(&format!(
            "INSERT INTO duty_leases (duty, holder, expires_at_ms)
             VALUES ($1, $2, {NOW_MS} + $3)
             ON CONFLICT (duty) DO UPDATE
                SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms"
        ))
        .await?;
    tx.execute(&st, &[&replica_duty(holder), &holder, &ttl_ms])
        .await?;
    let like = format!("{REPLICA_DUTY_PREFIX}%");
    let st = tx
        .prepare_cached(&format!(
            "DELETE FROM duty_leases WHERE duty LIKE $1 AND expires_at_ms <= {NOW_MS}"
        ))
        .await?;
    tx.execute(&st, &[&like]).await?;
    let st = tx
        .prepare_cached("SELECT COUNT(*) FROM duty_leases WHERE duty LIKE $1")
        .await?;
    let live: i64 = tx.query_one(&st, &[&like]).await?.get(0);
    tx.commit().await?;
    Ok(u32::try_from(live).unwrap_or(u32::MAX))
}

pub(super) async fn release(
    store: &PostgresStore,
    duty: &str,
    holder: &str,
) -> Result<(), StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx
        .prepare_cached("DELETE FROM duty_leases WHERE duty = $1 AND holder = $2")
        .await?;
    tx.execute(&st, &[&duty, &holder]).await?;
    tx.commit().await?;
    Ok(())
}
