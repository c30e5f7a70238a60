//! Tokens and nodes: minting a token, enrolling (one `BEGIN IMMEDIATE`
//! transaction that checks the token, spends a use with a guarded update
//! or re-enrolls a known key for free, and records the request) and
//! marking a node seen.

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::{
    Inner,
    rows::{finish_node, node_from_row},
};
use crate::store::{
    EnrollRefusal, Enrolled, NodeRefusal, NodeRow, ROUTER_ROLE, StoreError, TokenRow,
    columns::{NODE_COLS, labels_json, parse_labels},
};

impl Inner {
    pub(super) fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        insert_token(&*self.writer.get()?, digest, t)
    }

    pub(super) fn token_digests(&self, now: i64, limit: u64) -> Result<Vec<[u8; 32]>, StoreError> {
        let conn = self.readers.get()?;
        let mut st =
            conn.prepare_cached("SELECT digest FROM tokens WHERE expires_at > ?1 LIMIT ?2")?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = st
            .query_map(params![now, limit], |r| r.get::<_, Vec<u8>>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows
            .iter()
            .filter_map(|d| d.as_slice().try_into().ok())
            .collect())
    }

    pub(super) fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let token = token_by_digest(&tx, digest)?;
        let record = |tx: &rusqlite::Transaction<'_>, token_id: Option<&str>, outcome: &str| {
            tx.execute(
                "INSERT INTO enrollment_requests (peer_id, token_id, source, outcome, at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![peer_id, token_id, source, outcome, now],
            )
        };
        let Some((token_id, kind, role, labels, expires_at)) = token else {
            record(&tx, None, "unknown_token")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::UnknownToken));
        };
        if exists(
            &tx,
            "SELECT 1 FROM token_revocations WHERE token_id = ?1",
            params![token_id],
        )? {
            record(&tx, Some(&token_id), "token_revoked")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::TokenRevoked));
        }
        if expires_at <= now {
            record(&tx, Some(&token_id), "token_expired")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::TokenExpired));
        }
        let existing = tx
            .query_row(
                &format!("SELECT {NODE_COLS} FROM nodes WHERE peer_id = ?1"),
                params![peer_id],
                node_from_row,
            )
            .optional()?
            .map(finish_node)
            .transpose()?;
        let revoked_now = exists(&tx, PEER_REVOKED, params![peer_id, now])?;
        if revoked_now || existing.as_ref().is_some_and(|n| n.revoked) {
            record(&tx, Some(&token_id), "revoked")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::Revoked));
        }
        // The same key with the same token: a fresh credential, no use spent.
        let re_enrolled = existing.as_ref().is_some_and(|n| n.token_id == token_id);
        if !re_enrolled {
            // Guarded: a use is spent only while one is left.
            let spent = tx.execute(
                "UPDATE tokens SET uses = uses + 1, last_used_at = ?2 WHERE token_id = ?1 AND uses < max_uses",
                params![token_id, now],
            )?;
            if spent != 1 {
                record(&tx, Some(&token_id), "token_used_up")?;
                tx.commit()?;
                return Ok(Err(EnrollRefusal::TokenUsedUp));
            }
        }
        let node_id = existing
            .as_ref()
            .map(|n| n.node_id.clone())
            .unwrap_or_else(|| new_node_id.to_string());
        let enrolled_at = existing.as_ref().map(|n| n.enrolled_at).unwrap_or(now);
        tx.execute(
            "INSERT INTO nodes (node_id, peer_id, role, token_kind, token_id, labels, enrolled_at, last_seen, cred_expires_at, revoked)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0)
             ON CONFLICT(peer_id) DO UPDATE SET role = excluded.role, token_kind = excluded.token_kind,
               token_id = excluded.token_id, labels = excluded.labels, last_seen = excluded.last_seen,
               cred_expires_at = excluded.cred_expires_at",
            params![node_id, peer_id, role, kind, token_id, labels, enrolled_at, now.max(1), cred_expires_at],
        )?;
        record(
            &tx,
            Some(&token_id),
            if re_enrolled {
                "re_enrolled"
            } else {
                "enrolled"
            },
        )?;
        tx.commit()?;
        Ok(Ok(Enrolled {
            node: NodeRow {
                node_id,
                peer_id: peer_id.to_vec(),
                role,
                token_kind: kind,
                token_id,
                labels: parse_labels("tokens", &labels)?,
                enrolled_at,
                last_seen: now.max(1),
                cred_expires_at,
                revoked: false,
            },
            re_enrolled,
        }))
    }

    /// Checks and touches a node inside `tx`; `router` also requires its
    /// stored role to be router.
    pub(super) fn touch_in(
        tx: &rusqlite::Transaction<'_>,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
        router: bool,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let node = tx
            .query_row(
                &format!("SELECT {NODE_COLS} FROM nodes WHERE peer_id = ?1"),
                params![peer_id],
                node_from_row,
            )
            .optional()?
            .map(finish_node)
            .transpose()?;
        let Some(mut node) = node else {
            return Ok(Err(NodeRefusal::UnknownNode));
        };
        let revoked_now = exists(tx, PEER_REVOKED, params![peer_id, now])?;
        if node.revoked || revoked_now {
            return Ok(Err(NodeRefusal::Revoked));
        }
        if router && node.role != ROUTER_ROLE {
            return Ok(Err(NodeRefusal::NotARouter));
        }
        node.last_seen = now.max(1);
        if let Some(exp) = cred_expires_at {
            node.cred_expires_at = exp;
        }
        tx.execute(
            "UPDATE nodes SET last_seen = ?2, cred_expires_at = ?3 WHERE peer_id = ?1",
            params![peer_id, node.last_seen, node.cred_expires_at],
        )?;
        Ok(Ok(node))
    }

    pub(super) fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = Self::touch_in(&tx, peer_id, now, cred_expires_at, false)?;
        if out.is_ok() {
            tx.commit()?;
        }
        Ok(out)
    }
}

/// Inserts a token (on the writer, or inside a transaction).
pub(super) fn insert_token(
    conn: &rusqlite::Connection,
    digest: &[u8; 32],
    t: &TokenRow,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO tokens (token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8)",
        params![
            t.token_id,
            &digest[..],
            t.kind,
            t.role,
            labels_json(&t.labels),
            t.max_uses,
            t.created_at,
            t.expires_at
        ],
    )?;
    Ok(())
}

/// Whether `peer_id` (`?1`) has a revocation in force at `?2`.
const PEER_REVOKED: &str = "SELECT 1 FROM revocations WHERE peer_id = ?1 AND until > ?2";

/// Whether `sql` finds a row.
fn exists(
    conn: &rusqlite::Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<bool, StoreError> {
    Ok(conn.query_row(sql, args, |_| Ok(())).optional()?.is_some())
}

/// A token as enrollment reads it: (token_id, kind, role, labels JSON,
/// expires_at).
type TokenTerms = (String, i32, i32, String, i64);

/// The token behind `digest`.
fn token_by_digest(
    conn: &rusqlite::Connection,
    digest: &[u8; 32],
) -> Result<Option<TokenTerms>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT token_id, kind, role, labels, expires_at FROM tokens WHERE digest = ?1",
            params![&digest[..]],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?)
}
