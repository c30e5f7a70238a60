//! The PostgreSQL store: a bounded pool of connections (deadpool), every
//! operation one transaction whose `statement_timeout` and `lock_timeout`
//! are what is left of the operation's deadline (`SET LOCAL`), so a call
//! never waits on the server past `--db-wait-timeout-secs` either.
//!
//! PostgreSQL's READ COMMITTED does not serialise writers the way SQLite's
//! `BEGIN IMMEDIATE` does, so every read-check-write here is safe on its
//! own: token uses are spent by `UPDATE … WHERE uses < max_uses`, a node
//! is touched by one conditional `UPDATE`, a lease is written after locking
//! its node's row (`FOR UPDATE`, the row a revocation updates first), the
//! first signing key and migrations run under transaction-level advisory
//! locks, and rotation is claimed by a conditional update.

mod options;
mod snapshot;

use std::{path::Path, time::Instant};

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, Timeouts,
};
use tokio_postgres::{NoTls, Row, error::SqlState, types::ToSql};

pub(crate) use options::process_env;
pub use options::{PgOptions, Tls};

use super::{
    Deleted, EnrollRefusal, Enrolled, Kek, LeaseRow, NodeRefusal, NodeRow, ROUTER_ROLE, ReapPolicy,
    RevocationRow, SigningKeyRow, Snapshot, Store, StoreError, TABLES, TokenRow, Wait, deadline,
    migrations, reap,
    snapshot::KeyEntry,
    sqlite::{NODE_COLS, labels_json, parse_addrs, parse_labels},
};

/// Default `--db-pool-connections`: PostgreSQL's default `max_connections`
/// is 100; 16 per control plane leaves room for several replicas and
/// operators, and is more than the control plane's few concurrent
/// transactions (enrollment is rate-limited) need.
pub const DEFAULT_POOL_CONNECTIONS: usize = 16;

/// Advisory lock keys (transaction level; per database).
const LOCK_MIGRATE: i64 = 0x616d_0001;
const LOCK_KEYS: i64 = 0x616d_0002;

/// PostgreSQL storage.
pub struct PostgresStore {
    pool: Pool,
    kek: Kek,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(c) if *c == SqlState::QUERY_CANCELED => Self::Timeout(Wait::Statement),
            Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE => Self::Timeout(Wait::Lock),
            _ if e.is_closed() => Self::Unreachable(e.to_string()),
            _ => match e.as_db_error() {
                Some(db) => Self::Query(format!("{}: {}", db.code().code(), db.message())),
                None => Self::Unreachable(e.to_string()),
            },
        }
    }
}

fn pool_err(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(_) => StoreError::Timeout(Wait::Connection),
        PoolError::Backend(e) => e.into(),
        other => StoreError::Unreachable(other.to_string()),
    }
}

fn int<T: TryFrom<i64>>(table: &'static str, col: &str, v: i64) -> Result<T, StoreError> {
    T::try_from(v).map_err(|_| StoreError::Corrupt {
        table,
        what: format!("{col} = {v} out of range"),
    })
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl PostgresStore {
    /// Connects with a pool of at most `pool_connections`, migrates (under
    /// an advisory lock) and seals signing keys not sealed with `kek` yet.
    pub async fn open(
        opts: PgOptions,
        pool_connections: usize,
        kek: Kek,
    ) -> Result<Self, StoreError> {
        let mgr_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let mgr = match &opts.tls {
            Tls::Disable => Manager::from_config(opts.config.clone(), NoTls, mgr_config),
            Tls::Verify(path) => {
                Manager::from_config(opts.config.clone(), PgOptions::rustls(path)?, mgr_config)
            }
        };
        let pool = Pool::builder(mgr)
            .max_size(pool_connections.max(1))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("database pool: {e}")))?;
        let store = Self { pool, kek };
        store.migrate().await?;
        store.reseal_keys().await?;
        Ok(store)
    }

    /// A connection within the deadline, and the milliseconds left.
    async fn conn(&self) -> Result<(deadpool_postgres::Object, u64), StoreError> {
        let deadline = deadline::current();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(StoreError::Timeout(Wait::Slot));
        }
        let timeouts = Timeouts {
            wait: Some(left),
            create: Some(left),
            recycle: Some(left),
        };
        let conn = self.pool.timeout_get(&timeouts).await.map_err(pool_err)?;
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis();
        if ms == 0 {
            return Err(StoreError::Timeout(Wait::Connection));
        }
        Ok((conn, u64::try_from(ms).unwrap_or(u64::MAX)))
    }

    /// Bounds the transaction's statements and lock waits by `ms`.
    async fn bound(tx: &Tx<'_>, ms: u64) -> Result<(), StoreError> {
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
        ))
        .await?;
        Ok(())
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        // The second process starting together waits here, then finds the
        // schema in place.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_MIGRATE])
            .await?;
        tx.batch_execute(migrations::VERSION_TABLE_POSTGRES).await?;
        let stored = tx
            .query_opt(
                "SELECT version, oldest_compatible FROM schema_version WHERE id = 1",
                &[],
            )
            .await?
            .map(|r| -> Result<(u32, u32), StoreError> {
                Ok((
                    int("schema_version", "version", r.get(0))?,
                    int("schema_version", "oldest_compatible", r.get(1))?,
                ))
            })
            .transpose()?;
        let found = stored.unwrap_or((0, 0));
        let steps = migrations::pending(found)?;
        if steps.is_empty() && stored.is_some() {
            return Ok(());
        }
        for m in &migrations::MIGRATIONS[steps.clone()] {
            if !m.postgres.trim().is_empty() {
                tx.batch_execute(m.postgres).await?;
            }
        }
        let version = found.0.max(steps.end as u32);
        let oldest =
            migrations::oldest_compatible(version.min(migrations::SCHEMA_VERSION)).max(found.1);
        tx.execute(
            "INSERT INTO schema_version (id, version, oldest_compatible) VALUES (1, $1, $2)
             ON CONFLICT (id) DO UPDATE SET version = excluded.version,
               oldest_compatible = excluded.oldest_compatible",
            &[&i64::from(version), &i64::from(oldest)],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn reseal_keys(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEYS])
            .await?;
        for r in tx
            .query("SELECT key_id, secret FROM signing_keys", &[])
            .await?
        {
            let (id, stored): (String, Vec<u8>) = (r.get(0), r.get(1));
            if self.kek.needs_reseal(&stored) {
                let sealed = self.kek.seal(&id, &self.kek.open(&id, &stored)?)?;
                tx.execute(
                    "UPDATE signing_keys SET secret = $2 WHERE key_id = $1",
                    &[&id, &sealed],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn insert_key(
        &self,
        tx: &Tx<'_>,
        k: &SigningKeyRow,
        created_at: i64,
    ) -> Result<(), StoreError> {
        let sealed = self.kek.seal(&k.key_id, &k.secret)?;
        tx.execute(
            "INSERT INTO signing_keys (key_id, secret, public, created_at, active_from, verify_until)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[&k.key_id, &sealed, &k.public, &created_at, &k.active_from, &k.verify_until],
        )
        .await?;
        Ok(())
    }

    async fn read_keys(&self, tx: &Tx<'_>) -> Result<Vec<KeyEntry>, StoreError> {
        let rows = tx
            .query(
                "SELECT key_id, secret, public, active_from, verify_until, created_at FROM signing_keys
                 ORDER BY active_from, created_at, key_id",
                &[],
            )
            .await?;
        rows.into_iter()
            .map(|r| {
                let key_id: String = r.get(0);
                let secret = self.kek.open(&key_id, &r.get::<_, Vec<u8>>(1))?;
                Ok(KeyEntry {
                    row: SigningKeyRow {
                        key_id,
                        secret,
                        public: r.get(2),
                        active_from: r.get(3),
                        verify_until: r.get(4),
                    },
                    created_at: r.get(5),
                })
            })
            .collect()
    }
}

fn node_from(r: &Row) -> Result<NodeRow, StoreError> {
    Ok(NodeRow {
        node_id: r.get(0),
        peer_id: r.get(1),
        role: int("nodes", "role", r.get(2))?,
        token_kind: int("nodes", "token_kind", r.get(3))?,
        token_id: r.get(4),
        labels: parse_labels("nodes", r.get(5))?,
        enrolled_at: r.get(6),
        last_seen: r.get(7),
        cred_expires_at: r.get(8),
        revoked: r.get(9),
    })
}

fn lease_from(r: &Row) -> Result<LeaseRow, StoreError> {
    Ok(LeaseRow {
        peer_id: r.get(0),
        node_id: r.get(1),
        addrs: parse_addrs(r.get(2))?,
        labels: parse_labels("router_leases", r.get(3))?,
        attached: int("router_leases", "attached", r.get(4))?,
        transit: int("router_leases", "transit", r.get(5))?,
        high: int("router_leases", "high", r.get(6))?,
        low: int("router_leases", "low", r.get(7))?,
        draining: r.get(8),
        expires_at: r.get(9),
    })
}

const LEASE_COLS: &str =
    "peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at";

async fn insert_lease(tx: &Tx<'_>, l: &LeaseRow, upsert: bool) -> Result<(), StoreError> {
    let on_conflict = if upsert {
        "ON CONFLICT (peer_id) DO UPDATE SET node_id = excluded.node_id, addrs = excluded.addrs,
           labels = excluded.labels, attached = excluded.attached, transit = excluded.transit,
           high = excluded.high, low = excluded.low, draining = excluded.draining,
           expires_at = excluded.expires_at"
    } else {
        ""
    };
    let addrs = serde_json::to_string(&l.addrs).unwrap_or_else(|_| "[]".into());
    let labels = labels_json(&l.labels);
    let (a, t, h, lo) = (
        i64::from(l.attached),
        i64::from(l.transit),
        i64::from(l.high),
        i64::from(l.low),
    );
    let sql = format!(
        "INSERT INTO router_leases ({LEASE_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) {on_conflict}"
    );
    let st = tx.prepare_cached(&sql).await?;
    tx.execute(
        &st,
        &[
            &l.peer_id,
            &l.node_id,
            &addrs,
            &labels,
            &a,
            &t,
            &h,
            &lo,
            &l.draining,
            &l.expires_at,
        ],
    )
    .await?;
    Ok(())
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

#[async_trait::async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn pool_connections(&self) -> Option<super::PoolConnections> {
        let s = self.pool.status();
        Some(super::PoolConnections {
            open: s.size,
            idle: s.available,
            max: s.max_size,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.query_one("SELECT 1", &[]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
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
        tx.commit().await?;
        Ok(())
    }

    async fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
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
            // `uses` and matches nothing.
            let st = tx
                .prepare_cached(
                    "UPDATE tokens SET uses = uses + 1, last_used_at = $2
                     WHERE token_id = $1 AND uses < max_uses RETURNING uses",
                )
                .await?;
            if tx.query_opt(&st, &[&token_id, &now]).await?.is_none() {
                record(&tx, peer_id, Some(&token_id), source, "token_used_up", now).await?;
                tx.commit().await?;
                return Ok(Err(EnrollRefusal::TokenUsedUp));
            }
        }
        let node_id = existing
            .as_ref()
            .map(|n| n.node_id.clone())
            .unwrap_or_else(|| new_node_id.to_string());
        let enrolled_at = existing.as_ref().map(|n| n.enrolled_at).unwrap_or(now);
        let last_seen = now.max(1);
        // RETURNING: a node inserted by a concurrent enrollment of the same
        // key keeps its id; the revoked flag is never reset here.
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
                    &node_id,
                    &peer_id,
                    &i64::from(role),
                    &i64::from(kind),
                    &token_id,
                    &labels,
                    &enrolled_at,
                    &last_seen,
                    &cred_expires_at,
                ],
            )
            .await?;
        let (node_id, enrolled_at, revoked): (String, i64, bool) =
            (row.get(0), row.get(1), row.get(2));
        if revoked {
            // Revoked between our check and our write: nothing is spent.
            tx.rollback().await?;
            return Ok(Err(EnrollRefusal::Revoked));
        }
        record(
            &tx,
            peer_id,
            Some(&token_id),
            source,
            if re_enrolled {
                "re_enrolled"
            } else {
                "enrolled"
            },
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(Ok(Enrolled {
            node: NodeRow {
                node_id,
                peer_id: peer_id.to_vec(),
                role,
                token_kind: kind,
                token_id,
                labels: parse_labels("tokens", &labels)?,
                enrolled_at,
                last_seen,
                cred_expires_at,
                revoked: false,
            },
            re_enrolled,
        }))
    }

    async fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
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

    async fn router_lease(
        &self,
        lease: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        // FOR UPDATE: a revocation (which updates this row first) either
        // commits before and is seen here, or waits and deletes our lease.
        let st = tx
            .prepare_cached(&format!(
                "SELECT {NODE_COLS} FROM nodes WHERE peer_id = $1 FOR UPDATE"
            ))
            .await?;
        let Some(row) = tx.query_opt(&st, &[&lease.peer_id]).await? else {
            return Ok(Err(NodeRefusal::UnknownNode));
        };
        let mut node = node_from(&row)?;
        let st = tx
            .prepare_cached("SELECT 1 FROM revocations WHERE peer_id = $1 AND until > $2")
            .await?;
        if node.revoked || tx.query_opt(&st, &[&lease.peer_id, &now]).await?.is_some() {
            return Ok(Err(NodeRefusal::Revoked));
        }
        if node.role != ROUTER_ROLE {
            return Ok(Err(NodeRefusal::NotARouter));
        }
        node.last_seen = now.max(1);
        let st = tx
            .prepare_cached("UPDATE nodes SET last_seen = $2 WHERE peer_id = $1")
            .await?;
        tx.execute(&st, &[&lease.peer_id, &node.last_seen]).await?;
        insert_lease(&tx, lease, true).await?;
        tx.commit().await?;
        Ok(Ok(node))
    }

    async fn directory(&self, now: i64) -> Result<(Vec<LeaseRow>, Vec<RevocationRow>), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        Self::bound(&tx, ms).await?;
        let st = tx
            .prepare_cached(&format!(
                "SELECT {LEASE_COLS} FROM router_leases WHERE expires_at > $1 ORDER BY node_id"
            ))
            .await?;
        let leases = tx
            .query(&st, &[&now])
            .await?
            .iter()
            .map(lease_from)
            .collect::<Result<Vec<_>, _>>()?;
        let st = tx
            .prepare_cached(
                "SELECT peer_id, until, reason FROM revocations WHERE until > $1 ORDER BY until",
            )
            .await?;
        let revs = tx
            .query(&st, &[&now])
            .await?
            .iter()
            .map(|r| RevocationRow {
                peer_id: r.get(0),
                until: r.get(1),
                reason: r.get(2),
            })
            .collect();
        tx.commit().await?;
        Ok((leases, revs))
    }

    async fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
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

    async fn keys(&self) -> Result<Vec<SigningKeyRow>, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        let keys = self.read_keys(&tx).await?;
        tx.commit().await?;
        Ok(keys.into_iter().map(|k| k.row).collect())
    }

    async fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        // Two processes starting on an empty database: the second waits
        // here for the first to commit, then counts its key.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEYS])
            .await?;
        let n: i64 = tx
            .query_one("SELECT COUNT(*) FROM signing_keys", &[])
            .await?
            .get(0);
        if n > 0 {
            tx.execute(
                "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                &[&next_rotation_at],
            )
            .await?;
            tx.commit().await?;
            return Ok(false);
        }
        self.insert_key(&tx, first, agentmesh_proto::unix_now())
            .await?;
        tx.execute(
            "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
            &[&next_rotation_at],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        let v = tx
            .query_opt(
                "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
                &[],
            )
            .await?
            .map(|r| r.get(0));
        tx.commit().await?;
        Ok(v)
    }

    async fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        // The claim: of two processes seeing the same deadline pass, the
        // second's UPDATE waits for the first's row lock and then matches
        // nothing, the deadline having moved.
        let claimed = match expected {
            Some(old) => {
                tx.execute(
                    "UPDATE rotation_state SET next_rotation_at = $2 WHERE id = 1 AND next_rotation_at = $1",
                    &[&old, &next],
                )
                .await?
            }
            None => {
                tx.execute(
                    "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, $1)
                     ON CONFLICT (id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
                    &[&next],
                )
                .await?
            }
        };
        if claimed != 1 {
            return Ok(false);
        }
        tx.execute(
            "UPDATE signing_keys SET verify_until = $1 WHERE verify_until = 0",
            &[&retire_until],
        )
        .await?;
        self.insert_key(&tx, new_key, agentmesh_proto::unix_now())
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        let mut left = max_rows;
        let mut out = Deleted::new();
        for r in reap::rules(now, policy) {
            let mut n = 0;
            if left > 0 {
                let limit = i64::try_from(left).unwrap_or(i64::MAX);
                let st = tx.prepare_cached(&r.postgres_sql()).await?;
                let mut args: Vec<&(dyn ToSql + Sync)> = vec![&limit];
                args.extend(r.args.iter().map(|a| a as &(dyn ToSql + Sync)));
                n = tx.execute(&st, &args).await?;
                left = left.saturating_sub(n);
            }
            out.push((r.table, r.reason, n));
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = TABLES
            .iter()
            .map(|t| format!("SELECT '{t}'::text, COUNT(*) FROM {t}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        let st = tx.prepare_cached(&sql).await?;
        let rows = tx
            .query(&st, &[])
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        tx.commit().await?;
        Ok(rows)
    }

    async fn backup_to(&self, _to: &Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "a PostgreSQL database is backed up with pg_dump (see docs/storage.md)",
        ))
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.snapshot_rows().await
    }

    async fn restore(&self, s: &Snapshot) -> Result<(), StoreError> {
        self.restore_rows(s).await
    }
}
