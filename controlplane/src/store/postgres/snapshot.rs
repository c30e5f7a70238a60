//! Every row of a PostgreSQL database, read in one REPEATABLE READ
//! transaction, and written into an empty one in one transaction (under a
//! new policy epoch): what `store copy` moves.

use super::{
    LOCK_KEYS, PostgresStore, Tx,
    leases::insert_lease,
    policies::{insert_policy, read_policies, replace_epoch},
    rows::{LEASE_COLS, int, lease_from, node_from},
};
use crate::store::{
    RevocationRow, Snapshot, StoreError, TokenRow,
    columns::{NODE_COLS, labels_json, parse_labels},
    snapshot::{EnrollmentEntry, RevocationEntry, TokenEntry},
};

impl PostgresStore {
    pub(super) async fn snapshot_rows(&self) -> Result<Snapshot, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = Self::read_snapshot(&mut conn, ms).await?;
        let tokens = read_tokens(&tx).await?;
        let nodes = tx
            .query(
                &format!("SELECT {NODE_COLS} FROM nodes ORDER BY node_id"),
                &[],
            )
            .await?
            .iter()
            .map(node_from)
            .collect::<Result<Vec<_>, _>>()?;
        let enrollment_requests = tx
            .query(
                "SELECT peer_id, token_id, source, outcome, at FROM enrollment_requests ORDER BY id",
                &[],
            )
            .await?
            .iter()
            .map(|r| EnrollmentEntry {
                peer_id: r.get(0),
                token_id: r.get(1),
                source: r.get(2),
                outcome: r.get(3),
                at: r.get(4),
            })
            .collect();
        let leases = tx
            .query(
                &format!("SELECT {LEASE_COLS} FROM router_leases ORDER BY node_id"),
                &[],
            )
            .await?
            .iter()
            .map(lease_from)
            .collect::<Result<Vec<_>, _>>()?;
        let keys = self.read_keys(&tx).await?;
        let next_rotation_at = tx
            .query_opt(
                "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
                &[],
            )
            .await?
            .map(|r| r.get(0));
        let (revocations, token_revocations) = read_revocations(&tx).await?;
        let policies = read_policies(&tx).await?;
        tx.commit().await?;
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

    pub(super) async fn restore_rows(&self, s: &Snapshot) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEYS])
            .await?;
        let held: i64 = tx
            .query_one(
                "SELECT (SELECT COUNT(*) FROM nodes) + (SELECT COUNT(*) FROM tokens) + (SELECT COUNT(*) FROM signing_keys) + (SELECT COUNT(*) FROM policies)",
                &[],
            )
            .await?
            .get(0);
        if held > 0 {
            return Err(StoreError::Config(
                "the target database already holds nodes, tokens, keys or policies; copy into an empty one"
                    .into(),
            ));
        }
        for t in &s.tokens {
            tx.execute(
                "INSERT INTO tokens (token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at, last_used_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &[
                    &t.row.token_id,
                    &t.digest,
                    &i64::from(t.row.kind),
                    &i64::from(t.row.role),
                    &labels_json(&t.row.labels),
                    &i64::from(t.row.max_uses),
                    &i64::from(t.row.uses),
                    &t.row.created_at,
                    &t.row.expires_at,
                    &t.last_used_at,
                ],
            )
            .await?;
        }
        for n in &s.nodes {
            tx.execute(
                &format!("INSERT INTO nodes ({NODE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
                &[
                    &n.node_id,
                    &n.peer_id,
                    &i64::from(n.role),
                    &i64::from(n.token_kind),
                    &n.token_id,
                    &labels_json(&n.labels),
                    &n.enrolled_at,
                    &n.last_seen,
                    &n.cred_expires_at,
                    &n.revoked,
                ],
            )
            .await?;
        }
        for e in &s.enrollment_requests {
            tx.execute(
                "INSERT INTO enrollment_requests (peer_id, token_id, source, outcome, at) VALUES ($1, $2, $3, $4, $5)",
                &[&e.peer_id, &e.token_id, &e.source, &e.outcome, &e.at],
            )
            .await?;
        }
        for l in &s.leases {
            insert_lease(&tx, l, false).await?;
        }
        for k in &s.keys {
            self.insert_key(&tx, &k.row, k.created_at).await?;
        }
        if let Some(at) = s.next_rotation_at {
            tx.execute(
                "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1)
                 ON CONFLICT (id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
                &[&at],
            )
            .await?;
        }
        for r in &s.revocations {
            tx.execute(
                "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES ($1, $2, $3, $4)",
                &[&r.row.peer_id, &r.row.until, &r.row.reason, &r.created_at],
            )
            .await?;
        }
        for r in &s.token_revocations {
            tx.execute(
                "INSERT INTO token_revocations (token_id, until, reason, created_at) VALUES ($1, $2, $3, $4)",
                &[&r.row.token_id, &r.row.until, &r.row.reason, &r.created_at],
            )
            .await?;
        }
        for p in &s.policies {
            insert_policy(&tx, p).await?;
        }
        replace_epoch(&tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Every token with its digest and last use, oldest first.
async fn read_tokens(tx: &Tx<'_>) -> Result<Vec<TokenEntry>, StoreError> {
    let mut tokens = Vec::new();
    for r in tx
        .query(
            "SELECT token_id, digest, kind, role, labels, max_uses, uses, created_at, expires_at, last_used_at
             FROM tokens ORDER BY created_at, token_id",
            &[],
        )
        .await?
    {
        tokens.push(TokenEntry {
            digest: r.get(1),
            row: TokenRow {
                token_id: r.get(0),
                kind: int("tokens", "kind", r.get(2))?,
                role: int("tokens", "role", r.get(3))?,
                labels: parse_labels("tokens", r.get(4))?,
                max_uses: int("tokens", "max_uses", r.get(5))?,
                uses: int("tokens", "uses", r.get(6))?,
                created_at: r.get(7),
                expires_at: r.get(8),
            },
            last_used_at: r.get(9),
        });
    }
    Ok(tokens)
}

/// Every PeerId revocation, then every token revocation.
async fn read_revocations(
    tx: &Tx<'_>,
) -> Result<(Vec<RevocationEntry>, Vec<RevocationEntry>), StoreError> {
    let revocations = tx
        .query(
            "SELECT peer_id, until, reason, created_at FROM revocations ORDER BY peer_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| RevocationEntry {
            row: RevocationRow {
                peer_id: r.get(0),
                token_id: String::new(),
                until: r.get(1),
                reason: r.get(2),
            },
            created_at: r.get(3),
        })
        .collect();
    let token_revocations = tx
        .query(
            "SELECT token_id, until, reason, created_at FROM token_revocations ORDER BY token_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| RevocationEntry {
            row: RevocationRow {
                peer_id: Vec::new(),
                token_id: r.get(0),
                until: r.get(1),
                reason: r.get(2),
            },
            created_at: r.get(3),
        })
        .collect();
    Ok((revocations, token_revocations))
}
