//! Every row of a SQLite database, read in one transaction, and written
//! into an empty one in one transaction (under a new policy epoch): what
//! `store copy` moves.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::{
    Inner,
    keys::{insert_key, read_keys},
    leases::{insert_lease, read_leases},
    policies::{insert_policy, read_policies, replace_epoch},
    rows::{finish_node, node_from_row},
};
use crate::store::{
    RevocationRow, Snapshot, StoreError, TokenRow,
    columns::{NODE_COLS, labels_json, parse_labels},
    snapshot::{EnrollmentEntry, RevocationEntry, TokenEntry},
};

impl Inner {
    pub(super) fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let mut conn = self.readers.get()?;
        // One read transaction: every table as of one instant.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let tokens = tx
            .prepare("SELECT token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at, last_used_at FROM tokens ORDER BY created_at, token_id")?
            .query_map([], |r| {
                Ok((
                    TokenEntry {
                        digest: r.get(1)?,
                        row: TokenRow {
                            token_id: r.get(0)?,
                            kind: r.get(2)?,
                            role: r.get(3)?,
                            labels: BTreeMap::new(),
                            max_uses: r.get(5)?,
                            uses: r.get(6)?,
                            created_at: r.get(7)?,
                            expires_at: r.get(8)?,
                        },
                        last_used_at: r.get(9)?,
                    },
                    r.get::<_, String>(4)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|(mut t, labels)| {
                t.row.labels = parse_labels("tokens", &labels)?;
                Ok(t)
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let nodes = tx
            .prepare(&format!("SELECT {NODE_COLS} FROM nodes ORDER BY node_id"))?
            .query_map([], node_from_row)?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(finish_node)
            .collect::<Result<Vec<_>, _>>()?;
        let enrollment_requests = tx
            .prepare("SELECT peer_id, token_id, source, outcome, at FROM enrollment_requests ORDER BY id")?
            .query_map([], |r| {
                Ok(EnrollmentEntry {
                    peer_id: r.get(0)?,
                    token_id: r.get(1)?,
                    source: r.get(2)?,
                    outcome: r.get(3)?,
                    at: r.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let leases = read_leases(&tx, None)?;
        let keys = read_keys(&tx, &self.kek)?;
        let next_rotation_at = tx
            .query_row(
                "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let revocations = tx
            .prepare("SELECT peer_id, until, reason, created_at FROM revocations ORDER BY peer_id")?
            .query_map([], |r| {
                Ok(RevocationEntry {
                    row: RevocationRow {
                        peer_id: r.get(0)?,
                        token_id: String::new(),
                        until: r.get(1)?,
                        reason: r.get(2)?,
                    },
                    created_at: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let token_revocations = tx
            .prepare(
                "SELECT token_id, until, reason, created_at FROM token_revocations ORDER BY token_id",
            )?
            .query_map([], |r| {
                Ok(RevocationEntry {
                    row: RevocationRow {
                        peer_id: Vec::new(),
                        token_id: r.get(0)?,
                        until: r.get(1)?,
                        reason: r.get(2)?,
                    },
                    created_at: r.get(3)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let policies = read_policies(&tx)?;
        tx.commit()?;
        Ok(Snapshot {
            tokens,
            nodes,
            enrollment_requests,
            leases,
            keys,
            next_rotation_at,
            revocations,
            policies,
            token_revocations,
        })
    }

    pub(super) fn restore(&self, s: &Snapshot) -> Result<(), StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let held: i64 = tx.query_row(
            "SELECT (SELECT COUNT(*) FROM nodes) + (SELECT COUNT(*) FROM tokens) + (SELECT COUNT(*) FROM signing_keys) + (SELECT COUNT(*) FROM policies)",
            [],
            |r| r.get(0),
        )?;
        if held > 0 {
            return Err(StoreError::Config(
                "the target database already holds nodes, tokens, keys or policies; copy into an empty one"
                    .into(),
            ));
        }
        for t in &s.tokens {
            tx.execute(
                "INSERT INTO tokens (token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at, last_used_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![t.row.token_id, t.digest, t.row.kind, t.row.role, labels_json(&t.row.labels),
                    t.row.max_uses, t.row.uses, t.row.created_at, t.row.expires_at, t.last_used_at],
            )?;
        }
        for n in &s.nodes {
            tx.execute(
                &format!("INSERT INTO nodes ({NODE_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                params![n.node_id, n.peer_id, n.role, n.token_kind, n.token_id, labels_json(&n.labels),
                    n.enrolled_at, n.last_seen, n.cred_expires_at, n.revoked],
            )?;
        }
        for e in &s.enrollment_requests {
            tx.execute(
                "INSERT INTO enrollment_requests (peer_id, token_id, source, outcome, at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![e.peer_id, e.token_id, e.source, e.outcome, e.at],
            )?;
        }
        for l in &s.leases {
            insert_lease(&tx, l, false)?;
        }
        for k in &s.keys {
            insert_key(&tx, &self.kek, &k.row, k.created_at)?;
        }
        if let Some(at) = s.next_rotation_at {
            tx.execute(
                "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)
                 ON CONFLICT(id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
                params![at],
            )?;
        }
        for r in &s.revocations {
            tx.execute(
                "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![r.row.peer_id, r.row.until, r.row.reason, r.created_at],
            )?;
        }
        for r in &s.token_revocations {
            tx.execute(
                "INSERT INTO token_revocations (token_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![r.row.token_id, r.row.until, r.row.reason, r.created_at],
            )?;
        }
        for p in &s.policies {
            insert_policy(&tx, p)?;
        }
        replace_epoch(&tx)?;
        tx.commit()?;
        Ok(())
    }
}
