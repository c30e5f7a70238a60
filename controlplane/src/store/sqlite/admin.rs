//! Admin requests and listings: a token minted, a key rotated, a policy
//! applied or a node or token revoked in the `BEGIN IMMEDIATE` transaction
//! that records its request (the record goes first, so an id already
//! recorded writes nothing), and the token and node pages of `token list`
//! / `node list`.

use rusqlite::{OptionalExtension, Transaction, TransactionBehavior, params};

use super::{
    Inner,
    keys::rotate_in,
    nodes::insert_token,
    rows::{finish_node, node_from_row},
};
use crate::store::{
    AdminRequest, Kek, MAX_LIST_ROWS, NodeListing, PriorRequest, RequestOnce, SigningKeyRow,
    StoreError, TokenListing, TokenRow,
    admin_requests::{digest_from, seal_id},
    columns::parse_labels,
    listing::{NODE_PAGE, TOKEN_PAGE},
};

impl Inner {
    pub(super) fn create_token_once(
        &self,
        digest: &[u8; 32],
        t: &TokenRow,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(prior) = record(&tx, &self.kek, request)? {
            return Ok(Err(prior));
        }
        insert_token(&tx, digest, t)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    pub(super) fn rotate_once(
        &self,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
        request: &AdminRequest,
    ) -> Result<Result<(), PriorRequest>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(prior) = record(&tx, &self.kek, request)? {
            return Ok(Err(prior));
        }
        // Forced: always claimed.
        rotate_in(&tx, &self.kek, None, next, new_key, retire_until)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    /// Runs `work` in a `BEGIN IMMEDIATE` transaction that claims
    /// `request`'s id first and records the answer `work`'s result gives
    /// before committing. An id recorded already runs nothing and returns
    /// the earlier request; a result with no answer (nothing done, e.g. an
    /// unknown token) rolls everything back, the claim included.
    pub(super) fn once<T>(
        &self,
        request: &RequestOnce<T>,
        work: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<Result<T, PriorRequest>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(prior) = record(&tx, &self.kek, &request.claim())? {
            return Ok(Err(prior));
        }
        let done = work(&tx)?;
        // Without an answer `tx` is dropped: rolled back.
        if let Some(answer) = (request.answer)(&done) {
            complete(&tx, &self.kek, &request.request_id, &answer)?;
            tx.commit()?;
        }
        Ok(Ok(done))
    }

    pub(super) fn list_tokens(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<TokenListing>, StoreError> {
        let conn = self.readers.get()?;
        let mut st = conn.prepare_cached(TOKEN_PAGE)?;
        let rows = st
            .query_map(params![after, limit.min(MAX_LIST_ROWS)], |r| {
                let until: Option<i64> = r.get(9)?;
                let reason: Option<String> = r.get(10)?;
                Ok((
                    TokenRow {
                        token_id: r.get(0)?,
                        kind: r.get(1)?,
                        role: r.get(2)?,
                        labels: Default::default(),
                        max_uses: r.get(4)?,
                        uses: r.get(5)?,
                        created_at: r.get(6)?,
                        expires_at: r.get(7)?,
                    },
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<i64>>(8)?,
                    until.map(|u| (u, reason.unwrap_or_default())),
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(mut row, labels, last_used_at, revoked)| {
                row.labels = parse_labels("tokens", &labels)?;
                Ok(TokenListing {
                    row,
                    last_used_at,
                    revoked,
                })
            })
            .collect()
    }

    pub(super) fn list_nodes(
        &self,
        after: &str,
        limit: u32,
    ) -> Result<Vec<NodeListing>, StoreError> {
        let conn = self.readers.get()?;
        let mut st = conn.prepare_cached(NODE_PAGE)?;
        let rows = st
            .query_map(params![after, limit.min(MAX_LIST_ROWS)], |r| {
                Ok((node_from_row(r)?, r.get::<_, Option<i64>>(10)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(node, revoked_until)| {
                Ok(NodeListing {
                    row: finish_node(node)?,
                    revoked_until,
                })
            })
            .collect()
    }
}

/// Writes the answer of the request `id` claimed earlier in `tx`.
fn complete(tx: &Transaction<'_>, kek: &Kek, id: &str, response: &[u8]) -> Result<(), StoreError> {
    let sealed = kek.seal(&seal_id(id), response)?;
    let n = tx.execute(
        "UPDATE admin_requests SET response = ?2 WHERE request_id = ?1",
        params![id, sealed],
    )?;
    if n != 1 {
        return Err(StoreError::Query(format!(
            "admin request {id:?} claimed but not found to record its answer"
        )));
    }
    Ok(())
}

/// Records `request` inside `tx`; when its id is recorded already,
/// returns that request instead (and `tx`, dropped, writes nothing).
fn record(
    tx: &Transaction<'_>,
    kek: &Kek,
    request: &AdminRequest,
) -> Result<Option<PriorRequest>, StoreError> {
    let id = &request.request_id;
    let sealed = kek.seal(&seal_id(id), &request.response)?;
    let inserted = tx.execute(
        "INSERT INTO admin_requests (request_id, method, digest, response, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(request_id) DO NOTHING",
        params![id, request.method, &request.digest[..], sealed, request.at],
    )?;
    if inserted == 1 {
        return Ok(None);
    }
    let (method, digest, response, at) = tx
        .query_row(
            "SELECT method, digest, response, created_at FROM admin_requests WHERE request_id = ?1",
            params![id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            },
        )
        .optional()?
        .ok_or_else(|| StoreError::Query(format!("admin request {id:?} neither new nor found")))?;
    Ok(Some(PriorRequest {
        method,
        digest: digest_from(&digest)?,
        at,
        response: kek.open(&seal_id(id), &response)?,
    }))
}
