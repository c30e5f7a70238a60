//! Revocations: the node's row is updated first (a lease or touch in flight
//! holds or waits for it), then the revocation is recorded or extended and
//! the lease deleted, in one transaction.

use super::PostgresStore;
use crate::store::StoreError;

pub(super) async fn revoke(
    store: &PostgresStore,
    peer_id: &[u8],
    reason: &str,
    now: i64,
    default_until: i64,
) -> Result<i64, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    // The node's row first: a lease or touch in flight holds or waits for it.
    let last_expiry: Option<i64> = tx
        .query_opt(
            "UPDATE nodes SET revoked = TRUE WHERE peer_id = $1 RETURNING cred_expires_at",
            &[&peer_id],
        )
        .await?
        .map(|r| r.get(0));
    let until = last_expiry.unwrap_or(0).max(default_until);
    let until: i64 = tx
        .query_one(
            "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (peer_id) DO UPDATE SET until = GREATEST(revocations.until, excluded.until),
               reason = excluded.reason
             RETURNING until",
            &[&peer_id, &until, &reason, &now],
        )
        .await?
        .get(0);
    tx.execute("DELETE FROM router_leases WHERE peer_id = $1", &[&peer_id])
        .await?;
    tx.commit().await?;
    Ok(until)
}
