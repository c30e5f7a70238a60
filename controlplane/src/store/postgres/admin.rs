//! Admin requests and listings: a token minted, a key rotated, a policy
//! applied or a node or token revoked in the transaction that records its
//! request. The record goes first, with
//! `ON CONFLICT DO NOTHING`: of two requests racing with one id, the
//! second's insert waits for the first's row, then inserts nothing and
//! reads the first's record, so the work is done once. Also the token and
//! node pages of `token list` / `node list`.

use super::{
    PostgresStore, Tx,
    keys::rotate_in,
    nodes::insert_token,
    policies::apply_in,
    revocations::{revoke_in, revoke_token_in},
    rows::{int, node_from},
};
use crate::store::{
    AdminRequest, AppliedPolicy, MAX_LIST_ROWS, NewPolicy, NodeListing, PriorRequest, RequestOnce,
    SigningKeyRow, StoreError, TokenListing, TokenRow,
    admin_requests::{digest_from, seal_id},
    columns::parse_labels,
    listing::{NODE_PAGE, TOKEN_PAGE, postgres},
};

pub(super) async fn create_token_once(
    store: &PostgresStore,
    digest: &[u8; 32],
    t: &TokenRow,
    request: &AdminRequest,
) -> Result<Result<(), PriorRequest>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if let Some(prior) = record(store, &tx, request).await? {
        return Ok(Err(prior));
    }
    insert_token(&tx, digest, t).await?;
    tx.commit().await?;
    Ok(Ok(()))
}

pub(super) async fn rotate_once(
    store: &PostgresStore,
    next: i64,
    new_key: &SigningKeyRow,
    retire_until: i64,
    request: &AdminRequest,
) -> Result<Result<(), PriorRequest>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if let Some(prior) = record(store, &tx, request).await? {
        return Ok(Err(prior));
    }
    // Forced: always claimed.
    rotate_in(store, &tx, None, next, new_key, retire_until).await?;
    tx.commit().await?;
    Ok(Ok(()))
}

pub(super) async fn revoke_once(
    store: &PostgresStore,
    peer_id: &[u8],
    reason: &str,
    now: i64,
    default_until: i64,
    request: &RequestOnce<i64>,
) -> Result<Result<i64, PriorRequest>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if let Some(prior) = record(store, &tx, &request.claim()).await? {
        return Ok(Err(prior));
    }
    let until = revoke_in(&tx, peer_id, reason, now, default_until).await?;
    finish(store, tx, request, &until).await?;
    Ok(Ok(until))
}

pub(super) async fn revoke_token_once(
    store: &PostgresStore,
    token_id: &str,
    reason: &str,
    now: i64,
    until: i64,
    request: &RequestOnce<Option<i64>>,
) -> Result<Result<Option<i64>, PriorRequest>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if let Some(prior) = record(store, &tx, &request.claim()).await? {
        return Ok(Err(prior));
    }
    let until = revoke_token_in(&tx, token_id, reason, now, until).await?;
    finish(store, tx, request, &until).await?;
    Ok(Ok(until))
}

pub(super) async fn apply_policy_once(
    store: &PostgresStore,
    new: &NewPolicy,
    request: &RequestOnce<AppliedPolicy>,
) -> Result<Result<AppliedPolicy, PriorRequest>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    if let Some(prior) = record(store, &tx, &request.claim()).await? {
        return Ok(Err(prior));
    }
    let done = apply_in(&tx, new).await?;
    finish(store, tx, request, &done).await?;
    Ok(Ok(done))
}

/// Ends a transaction that claimed `request`'s id and did its work:
/// records the answer `done` gives and commits, or, when `done` has none
/// (nothing was done), rolls back, the claim included.
async fn finish<T>(
    store: &PostgresStore,
    tx: Tx<'_>,
    request: &RequestOnce<T>,
    done: &T,
) -> Result<(), StoreError> {
    let Some(answer) = (request.answer)(done) else {
        tx.rollback().await?;
        return Ok(());
    };
    let id = &request.request_id;
    let sealed = store.kek.seal(&seal_id(id), &answer)?;
    let n = tx
        .execute(
            "UPDATE admin_requests SET response = $2 WHERE request_id = $1",
            &[id, &sealed],
        )
        .await?;
    if n != 1 {
        return Err(StoreError::Query(format!(
            "admin request {id:?} claimed but not found to record its answer"
        )));
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn list_tokens(
    store: &PostgresStore,
    after: &str,
    limit: u32,
) -> Result<Vec<TokenListing>, StoreError> {
    page(store, TOKEN_PAGE, after, limit)
        .await?
        .iter()
        .map(|r| {
            let until: Option<i64> = r.get(9);
            let reason: Option<String> = r.get(10);
            Ok(TokenListing {
                row: TokenRow {
                    token_id: r.get(0),
                    kind: int("tokens", "kind", r.get(1))?,
                    role: int("tokens", "role", r.get(2))?,
                    labels: parse_labels("tokens", r.get(3))?,
                    max_uses: int("tokens", "max_uses", r.get(4))?,
                    uses: int("tokens", "uses", r.get(5))?,
                    created_at: r.get(6),
                    expires_at: r.get(7),
                },
                last_used_at: r.get(8),
                revoked: until.map(|u| (u, reason.unwrap_or_default())),
            })
        })
        .collect()
}

pub(super) async fn list_nodes(
    store: &PostgresStore,
    after: &str,
    limit: u32,
) -> Result<Vec<NodeListing>, StoreError> {
    page(store, NODE_PAGE, after, limit)
        .await?
        .iter()
        .map(|r| {
            Ok(NodeListing {
                row: node_from(r)?,
                revoked_until: r.get(10),
            })
        })
        .collect()
}

/// One page of a listing: `sql` (a page query of `crate::store::listing`,
/// keyed after `after`) read in a read-only transaction, at most
/// `MAX_LIST_ROWS` rows.
async fn page(
    store: &PostgresStore,
    sql: &str,
    after: &str,
    limit: u32,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.build_transaction().read_only(true).start().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx.prepare_cached(&postgres(sql)).await?;
    let limit = i64::from(limit.min(MAX_LIST_ROWS));
    let rows = tx.query(&st, &[&after, &limit]).await?;
    tx.commit().await?;
    Ok(rows)
}

/// Records `request` inside `tx`; when its id is recorded already,
/// returns that request instead (and `tx`, dropped, writes nothing).
async fn record(
    store: &PostgresStore,
    tx: &Tx<'_>,
    request: &AdminRequest,
) -> Result<Option<PriorRequest>, StoreError> {
    let id = &request.request_id;
    let sealed = store.kek.seal(&seal_id(id), &request.response)?;
    let inserted = tx
        .execute(
            "INSERT INTO admin_requests (request_id, method, digest, response, created_at)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (request_id) DO NOTHING",
            &[
                id,
                &request.method,
                &&request.digest[..],
                &sealed,
                &request.at,
            ],
        )
        .await?;
    if inserted == 1 {
        return Ok(None);
    }
    let r = tx
        .query_opt(
            "SELECT method, digest, response, created_at FROM admin_requests WHERE request_id = $1",
            &[id],
        )
        .await?
        .ok_or_else(|| StoreError::Query(format!("admin request {id:?} neither new nor found")))?;
    let response: Vec<u8> = r.get(2);
    Ok(Some(PriorRequest {
        method: r.get(0),
        digest: digest_from(r.get::<_, &[u8]>(1))?,
        at: r.get(3),
        response: store.kek.open(&seal_id(id), &response)?,
    }))
}
