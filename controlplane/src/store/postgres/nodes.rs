//! Tokens and nodes: minting a token; enrolling, where a use is spent by
//! `UPDATE … WHERE uses < max_uses` (the second of two enrollments racing
//! for the last use waits on the row and then matches nothing) and the
//! node is upserted with `RETURNING`, so a concurrent revocation is seen;
//! marking a node seen with one conditional `UPDATE`.

use super::{
    PostgresStore, Tx,
    rows::{int, node_from},
};
use crate::store::{
    EnrollRefusal, Enrolled, NodeRefusal, NodeRow, StoreError, TokenRow,
    columns::{NODE_COLS, labels_json, parse_labels},
};

pub(super) async fn create_token(
    store: &PostgresStore,
    digest: &[u8; 32],
    t: &TokenRow,
) -> Result<(), StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    insert_token(&tx, digest, t).await?;
    tx.commit().await?;
    Ok(())
}

/// Inserts a token inside `tx`.
pub(super) async fn insert_token(
    tx: &Tx<'_>,
    digest: &[u8; 32],
    t: &TokenRow,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO tokens (token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8)",
        &[
            &t.token_id,
            &&digest[..],
            &i64::from(t.kind),
            &i64::from(t.role),
            &labels_json(&t.labels),
            &i64::from(t.max_uses),
            &t.created_at,
            &t.expires_at,
        ],
    )
    .await?;
    Ok(())
}

pub(super) async fn token_digests(
    store: &PostgresStore,
    now: i64,
    limit: u64,
) -> Result<Vec<[u8; 32]>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.build_transaction().read_only(true).start().await?;
    PostgresStore::bound(&tx, ms).await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = tx
        .query(
            "SELECT digest FROM tokens WHERE expires_at > $1 LIMIT $2",
            &[&now, &limit],
        )
        .await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .filter_map(|r| r.get::<_, &[u8]>(0).try_into().ok())
        .collect())
}

pub(super) async fn enroll(
    store: &PostgresStore,
    digest: &[u8; 32],
    peer_id: &[u8],
    new_node_id: &str,
    source: &str,
    now: i64,
    cred_expires_at: i64,
) -> Result<Result<Enrolled, EnrollRefusal>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx
        .prepare_cached(
            "SELECT token_id, kind, role, labels, expires_at FROM tokens WHERE digest = $1",
        )
        .await?;
    let Some(token) = tx.query_opt(&st, &[&&digest[..]]).await? else {
        record(&tx, peer_id, None, source, "unknown_token", now).await?;
        tx.commit().await?;
        return Ok(Err(EnrollRefusal::UnknownToken));
    };
    let token_id: String = token.get(0);
    let kind: i32 = int("tokens", "kind", token.get(1))?;
    let role: i32 = int("tokens", "role", token.get(2))?;
    let labels: String = token.get(3);
    let expires_at: i64 = token.get(4);
    if token_revoked(&tx, &token_id).await? {
        record(&tx, peer_id, Some(&token_id), source, "token_revoked", now).await?;
        tx.commit().await?;
        return Ok(Err(EnrollRefusal::TokenRevoked));
    }
    if expires_at <= now {
        record(&tx, peer_id, Some(&token_id), source, "token_expired", now).await?;
        tx.commit().await?;
        return Ok(Err(EnrollRefusal::TokenExpired));
    }
    let st = tx
        .prepare_cached(&format!("SELECT {NODE_COLS} FROM nodes WHERE peer_id = $1"))
        .await?;
    let existing = tx
        .query_opt(&st, &[&peer_id])
        .await?
        .map(|r| node_from(&r))
        .transpose()?;
    let st = tx
        .prepare_cached("SELECT 1 FROM revocations WHERE peer_id = $1 AND until > $2")
        .await?;
    let revoked_now = tx.query_opt(&st, &[&peer_id, &now]).await?.is_some();
    if revoked_now || existing.as_ref().is_some_and(|n| n.revoked) {
        record(&tx, peer_id, Some(&token_id), source, "revoked", now).await?;
        tx.commit().await?;
        return Ok(Err(EnrollRefusal::Revoked));
    }
    let re_enrolled = existing.as_ref().is_some_and(|n| n.token_id == token_id);
    if !re_enrolled {
        // The guard: of two enrollments racing for the last use, the
        // second's UPDATE waits for the first's row lock, re-reads
        // `uses` and matches nothing. A token revocation committing
        // meanwhile (it updates this row first) has set the expiry: the
        // re-read matches nothing either, and a fresh read tells why.
        let st = tx
            .prepare_cached(
                "UPDATE tokens SET uses = uses + 1, last_used_at = $2
                 WHERE token_id = $1 AND uses < max_uses AND expires_at > $2 RETURNING uses",
            )
            .await?;
        if tx.query_opt(&st, &[&token_id, &now]).await?.is_none() {
            if token_revoked(&tx, &token_id).await? {
                record(&tx, peer_id, Some(&token_id), source, "token_revoked", now).await?;
                tx.commit().await?;
                return Ok(Err(EnrollRefusal::TokenRevoked));
            }
            record(&tx, peer_id, Some(&token_id), source, "token_used_up", now).await?;
            tx.commit().await?;
            return Ok(Err(EnrollRefusal::TokenUsedUp));
        }
    }
    let mut node = NodeRow {
        node_id: existing
            .as_ref()
            .map(|n| n.node_id.clone())
            .unwrap_or_else(|| new_node_id.to_string()),
        peer_id: peer_id.to_vec(),
        role,
        token_kind: kind,
        token_id,
        labels: parse_labels("tokens", &labels)?,
        enrolled_at: existing.as_ref().map(|n| n.enrolled_at).unwrap_or(now),
        last_seen: now.max(1),
        cred_expires_at,
        revoked: false,
    };
    let revoked;
    (node.node_id, node.enrolled_at, revoked) = upsert_node(&tx, &node, &labels).await?;
    if revoked {
        // Revoked between our check and our write: nothing is spent.
        tx.rollback().await?;
        return Ok(Err(EnrollRefusal::Revoked));
    }
    let outcome = if re_enrolled {
        "re_enrolled"
    } else {
        "enrolled"
    };
    record(&tx, peer_id, Some(&node.token_id), source, outcome, now).await?;
    tx.commit().await?;
    Ok(Ok(Enrolled { node, re_enrolled }))
}

/// Writes the node, new or re-enrolled: its (node_id, enrolled_at,
/// revoked) as stored. RETURNING: a node inserted by a concurrent
/// enrollment of the same key keeps its id; the revoked flag is never
/// reset here.
async fn upsert_node(
    tx: &Tx<'_>,
    n: &NodeRow,
    labels: &str,
) -> Result<(String, i64, bool), StoreError> {
    let st = tx
        .prepare_cached(
            "INSERT INTO nodes (node_id, peer_id, role, token_kind, token_id, labels, enrolled_at, last_seen, cred_expires_at, revoked)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, FALSE)
             ON CONFLICT (peer_id) DO UPDATE SET role = excluded.role, token_kind = excluded.token_kind,
               token_id = excluded.token_id, labels = excluded.labels, last_seen = excluded.last_seen,
               cred_expires_at = excluded.cred_expires_at
             RETURNING node_id, enrolled_at, revoked",
        )
        .await?;
    let row = tx
        .query_one(
            &st,
            &[
                &n.node_id,
                &n.peer_id,
                &i64::from(n.role),
                &i64::from(n.token_kind),
                &n.token_id,
                &labels,
                &n.enrolled_at,
                &n.last_seen,
                &n.cred_expires_at,
            ],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

pub(super) async fn touch_node(
    store: &PostgresStore,
    peer_id: &[u8],
    now: i64,
    cred_expires_at: Option<i64>,
) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    // One conditional UPDATE: a revocation committing first makes it
    // match nothing (it re-checks the row after the revocation's lock).
    let st = tx
        .prepare_cached(&format!(
            "UPDATE nodes SET last_seen = $2, cred_expires_at = COALESCE($3, cred_expires_at)
             WHERE peer_id = $1 AND NOT revoked
               AND NOT EXISTS (SELECT 1 FROM revocations r WHERE r.peer_id = $1 AND r.until > $4)
             RETURNING {NODE_COLS}"
        ))
        .await?;
    let row = tx
        .query_opt(&st, &[&peer_id, &now.max(1), &cred_expires_at, &now])
        .await?;
    let out = match row {
        Some(r) => Ok(node_from(&r)?),
        None => Err(refusal(&tx, peer_id).await?),
    };
    tx.commit().await?;
    Ok(out)
}

/// Whether `token_id` is revoked (a statement of its own: under READ
/// COMMITTED it sees every revocation committed before it).
async fn token_revoked(tx: &Tx<'_>, token_id: &str) -> Result<bool, StoreError> {
    let st = tx
        .prepare_cached("SELECT 1 FROM token_revocations WHERE token_id = $1")
        .await?;
    Ok(tx.query_opt(&st, &[&token_id]).await?.is_some())
}

async fn record(
    tx: &Tx<'_>,
    peer_id: &[u8],
    token_id: Option<&str>,
    source: &str,
    outcome: &str,
    now: i64,
) -> Result<(), StoreError> {
    let st = tx
        .prepare_cached(
            "INSERT INTO enrollment_requests (peer_id, token_id, source, outcome, at) VALUES ($1, $2, $3, $4, $5)",
        )
        .await?;
    tx.execute(&st, &[&peer_id, &token_id, &source, &outcome, &now])
        .await?;
    Ok(())
}

/// Why the conditional touch matched nothing: no such node, or revoked.
async fn refusal(tx: &Tx<'_>, peer_id: &[u8]) -> Result<NodeRefusal, StoreError> {
    let known = tx
        .query_opt("SELECT 1 FROM nodes WHERE peer_id = $1", &[&peer_id])
        .await?
        .is_some();
    Ok(if known {
        NodeRefusal::Revoked
    } else {
        NodeRefusal::UnknownNode
    })
}
