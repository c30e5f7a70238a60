//! Revocations: the node's row is updated first (a lease or touch in flight
//! holds or waits for it), then the revocation is recorded or extended and
//! the lease deleted, in one transaction. A token's revocation updates the
//! token's row first: an enrollment spending a use holds or waits for it,
//! so either it committed before (and its node is found and revoked by the
//! statements after) or it re-reads the token as expired and stops.

use super::{PostgresStore, Tx, rows::epoch_and_generation};
use crate::store::{RevocationRow, StoreError, StoredRevocations};

/// The list, its generation and the epoch in one REPEATABLE READ snapshot:
/// a revocation committing meanwhile is either in all three or in none.
pub(super) async fn list(store: &PostgresStore) -> Result<StoredRevocations, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = PostgresStore::read_snapshot(&mut conn, ms).await?;
    let (epoch, generation) = epoch_and_generation(&tx, "revocation_generation").await?;
    let st = tx
        .prepare_cached("SELECT peer_id, until, reason FROM revocations ORDER BY peer_id")
        .await?;
    let mut rows: Vec<RevocationRow> = tx
        .query(&st, &[])
        .await?
        .iter()
        .map(|r| RevocationRow {
            peer_id: r.get(0),
            token_id: String::new(),
            until: r.get(1),
            reason: r.get(2),
        })
        .collect();
    let st = tx
        .prepare_cached("SELECT token_id, until, reason FROM token_revocations ORDER BY token_id")
        .await?;
    rows.extend(tx.query(&st, &[]).await?.iter().map(|r| RevocationRow {
        peer_id: Vec::new(),
        token_id: r.get(0),
        until: r.get(1),
        reason: r.get(2),
    }));
    tx.commit().await?;
    Ok(StoredRevocations {
        epoch,
        generation,
        rows,
    })
}

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
    let until = revoke_in(&tx, peer_id, reason, now, default_until).await?;
    tx.commit().await?;
    Ok(until)
}

/// A node's revocation inside `tx`; returns until when it is published.
pub(super) async fn revoke_in(
    tx: &Tx<'_>,
    peer_id: &[u8],
    reason: &str,
    now: i64,
    default_until: i64,
) -> Result<i64, StoreError> {
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
    Ok(until)
}

pub(super) async fn revoke_token(
    store: &PostgresStore,
    token_id: &str,
    reason: &str,
    now: i64,
    until: i64,
) -> Result<Option<i64>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let until = revoke_token_in(&tx, token_id, reason, now, until).await?;
    if until.is_some() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(until)
}

/// A token's revocation inside `tx`; `None` when no token, node or
/// revocation has the id (the caller rolls back: nothing is written).
pub(super) async fn revoke_token_in(
    tx: &Tx<'_>,
    token_id: &str,
    reason: &str,
    now: i64,
    until: i64,
) -> Result<Option<i64>, StoreError> {
    // The token's row first: an enrollment spending a use holds or waits for it.
    let token = tx
        .execute(
            "UPDATE tokens SET expires_at = LEAST(expires_at, $2) WHERE token_id = $1",
            &[&token_id, &now],
        )
        .await?;
    let known = token > 0
        || tx
            .query_opt(
                "SELECT 1 WHERE EXISTS (SELECT 1 FROM nodes WHERE token_id = $1)
                   OR EXISTS (SELECT 1 FROM token_revocations WHERE token_id = $1)",
                &[&token_id],
            )
            .await?
            .is_some();
    if !known {
        return Ok(None);
    }
    let last_expiry: Option<i64> = tx
        .query_one(
            "SELECT MAX(cred_expires_at) FROM nodes WHERE token_id = $1",
            &[&token_id],
        )
        .await?
        .get(0);
    let until = last_expiry.unwrap_or(0).max(until);
    tx.execute(
        "UPDATE nodes SET revoked = TRUE WHERE token_id = $1",
        &[&token_id],
    )
    .await?;
    tx.execute(
        "DELETE FROM router_leases WHERE peer_id IN (SELECT peer_id FROM nodes WHERE token_id = $1)",
        &[&token_id],
    )
    .await?;
    let until: i64 = tx
        .query_one(
            "INSERT INTO token_revocations (token_id, until, reason, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (token_id) DO UPDATE SET until = GREATEST(token_revocations.until, excluded.until),
               reason = excluded.reason
             RETURNING until",
            &[&token_id, &until, &reason, &now],
        )
        .await?
        .get(0);
    Ok(Some(until))
}
