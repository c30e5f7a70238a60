//! The SQLite store, the file created with mode 0600, in WAL mode: one
//! writer connection and a few read-only ones, so reads (the directory,
//! keys, row counts, `/readyz`, backups) never queue behind a write; WAL
//! lets readers run beside the one writer. Callers are on the blocking pool
//! and wait for a connection no longer than their deadline (see [`super::pool`]).

use std::{collections::BTreeMap, path::Path};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};

use super::{
    Deleted, EnrollRefusal, Enrolled, LeaseRow, NodeRefusal, NodeRow, ReapPolicy, RevocationRow,
    SigningKeyRow, Store, StoreError, TABLES, TokenRow, Wait, migrations,
    pool::{Pool, Pooled},
    reap,
};

/// Default `--db-read-connections`: reads are short and few (the directory is
/// cached, keys and counts are read every half minute), so four let
/// `/readyz`, a directory read, a key reload and a backup run at once.
pub const DEFAULT_READ_CONNECTIONS: usize = 4;

/// SQLite storage.
pub struct SqliteStore {
    writer: Pool,
    readers: Pool,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn labels_json(l: &BTreeMap<String, String>) -> String {
    serde_json::to_string(l).unwrap_or_else(|_| "{}".into())
}

fn parse_labels(table: &'static str, s: &str) -> Result<BTreeMap<String, String>, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table,
        what: format!("labels: {e}"),
    })
}

const NODE_COLS: &str = "node_id, peer_id, role, token_kind, token_id, labels, enrolled_at, last_seen, cred_expires_at, revoked";

fn node_from_row(r: &Row<'_>) -> rusqlite::Result<(NodeRow, String)> {
    Ok((
        NodeRow {
            node_id: r.get(0)?,
            peer_id: r.get(1)?,
            role: r.get(2)?,
            token_kind: r.get(3)?,
            token_id: r.get(4)?,
            labels: BTreeMap::new(),
            enrolled_at: r.get(6)?,
            last_seen: r.get(7)?,
            cred_expires_at: r.get(8)?,
            revoked: r.get::<_, i64>(9)? != 0,
        },
        r.get(5)?,
    ))
}

fn finish_node((mut n, labels): (NodeRow, String)) -> Result<NodeRow, StoreError> {
    n.labels = parse_labels("nodes", &labels)?;
    Ok(n)
}

impl SqliteStore {
    /// Opens (creating with mode 0600) and migrates the database at `path`,
    /// with one read connection (offline commands and tests).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, 1)
    }

    /// Opens (creating with mode 0600) and migrates the database at `path`,
    /// with `read_connections` (at least one) read-only connections.
    pub fn open_with(path: &Path, read_connections: usize) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            // A directory we create is private; an existing one is left alone.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io_err(dir, e))?;
        }
        create_private(path)?;
        let mut conn = Connection::open(path)?;
        // Opening waits for a lock as long as a store used on its own does.
        conn.busy_timeout(super::pool::DEFAULT_WAIT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: a committed enrollment survives power loss too (rates here are low).
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations::migrate(&mut conn)?;
        // Opened after the writer set WAL mode and migrated, so they see it.
        let readers = (0..read_connections.max(1))
            .map(|_| {
                Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY
                        | OpenFlags::SQLITE_OPEN_URI
                        | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            writer: Pool::new(vec![conn], Wait::Writer),
            readers: Pool::new(readers, Wait::Reader),
        })
    }

    /// The writer connection, within the deadline.
    pub(super) fn writer(&self) -> Result<Pooled<'_>, StoreError> {
        self.writer.get()
    }

    /// A read-only connection, within the deadline.
    pub(super) fn reader(&self) -> Result<Pooled<'_>, StoreError> {
        self.readers.get()
    }
}

/// Creates `path` with mode 0600 if missing; tightens it if present.
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io_err(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_err(path, e))
}

impl Store for SqliteStore {
    fn ping(&self) -> Result<(), StoreError> {
        self.reader()?.query_row("SELECT 1", [], |_| Ok(()))?;
        Ok(())
    }

    fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        self.writer()?.execute(
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

    fn enroll(
        &self,
        digest: &[u8; 32],
        peer_id: &[u8],
        new_node_id: &str,
        source: &str,
        now: i64,
        cred_expires_at: i64,
    ) -> Result<Result<Enrolled, EnrollRefusal>, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let token = tx
            .query_row(
                "SELECT token_id, kind, role, labels, max_uses, uses, expires_at FROM tokens WHERE digest = ?1",
                params![&digest[..]],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i32>(1)?,
                        r.get::<_, i32>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, u32>(4)?,
                        r.get::<_, u32>(5)?,
                        r.get::<_, i64>(6)?,
                    ))
                },
            )
            .optional()?;
        let record = |tx: &rusqlite::Transaction<'_>, token_id: Option<&str>, outcome: &str| {
            tx.execute(
                "INSERT INTO enrollment_requests (peer_id, token_id, source, outcome, at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![peer_id, token_id, source, outcome, now],
            )
        };
        let Some((token_id, kind, role, labels, max_uses, uses, expires_at)) = token else {
            record(&tx, None, "unknown_token")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::UnknownToken));
        };
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
        let revoked_now: bool = tx
            .query_row(
                "SELECT 1 FROM revocations WHERE peer_id = ?1 AND until > ?2",
                params![peer_id, now],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if revoked_now || existing.as_ref().is_some_and(|n| n.revoked) {
            record(&tx, Some(&token_id), "revoked")?;
            tx.commit()?;
            return Ok(Err(EnrollRefusal::Revoked));
        }
        // The same key with the same token: a fresh credential, no use spent.
        let re_enrolled = existing.as_ref().is_some_and(|n| n.token_id == token_id);
        if !re_enrolled {
            if uses >= max_uses {
                record(&tx, Some(&token_id), "token_used_up")?;
                tx.commit()?;
                return Ok(Err(EnrollRefusal::TokenUsedUp));
            }
            tx.execute(
                "UPDATE tokens SET uses = uses + 1, last_used_at = ?2 WHERE token_id = ?1",
                params![token_id, now],
            )?;
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

    fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
        let revoked_now = tx
            .query_row(
                "SELECT 1 FROM revocations WHERE peer_id = ?1 AND until > ?2",
                params![peer_id, now],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if node.revoked || revoked_now {
            return Ok(Err(NodeRefusal::Revoked));
        }
        node.last_seen = now.max(1);
        if let Some(exp) = cred_expires_at {
            node.cred_expires_at = exp;
        }
        tx.execute(
            "UPDATE nodes SET last_seen = ?2, cred_expires_at = ?3 WHERE peer_id = ?1",
            params![peer_id, node.last_seen, node.cred_expires_at],
        )?;
        tx.commit()?;
        Ok(Ok(node))
    }

    fn upsert_lease(&self, l: &LeaseRow) -> Result<(), StoreError> {
        self.writer()?.execute(
            "INSERT INTO router_leases (peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT(peer_id) DO UPDATE SET node_id = excluded.node_id, addrs = excluded.addrs,
               labels = excluded.labels, attached = excluded.attached, transit = excluded.transit,
               high = excluded.high, low = excluded.low, draining = excluded.draining,
               expires_at = excluded.expires_at",
            params![
                l.peer_id,
                l.node_id,
                serde_json::to_string(&l.addrs).unwrap_or_else(|_| "[]".into()),
                labels_json(&l.labels),
                l.attached,
                l.transit,
                l.high,
                l.low,
                l.draining,
                l.expires_at
            ],
        )?;
        Ok(())
    }

    fn directory(&self, now: i64) -> Result<(Vec<LeaseRow>, Vec<RevocationRow>), StoreError> {
        let conn = self.reader()?;
        let mut st = conn.prepare_cached(
            "SELECT peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at
             FROM router_leases WHERE expires_at > ?1 ORDER BY node_id",
        )?;
        let raw = st
            .query_map(params![now], |r| {
                Ok((
                    LeaseRow {
                        peer_id: r.get(0)?,
                        node_id: r.get(1)?,
                        addrs: Vec::new(),
                        labels: BTreeMap::new(),
                        attached: r.get(4)?,
                        transit: r.get(5)?,
                        high: r.get(6)?,
                        low: r.get(7)?,
                        draining: r.get(8)?,
                        expires_at: r.get(9)?,
                    },
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut leases = Vec::with_capacity(raw.len());
        for (mut l, addrs, labels) in raw {
            l.addrs = serde_json::from_str(&addrs).map_err(|e| StoreError::Corrupt {
                table: "router_leases",
                what: format!("addrs: {e}"),
            })?;
            l.labels = parse_labels("router_leases", &labels)?;
            leases.push(l);
        }
        let mut st = conn.prepare_cached(
            "SELECT peer_id, until, reason FROM revocations WHERE until > ?1 ORDER BY until",
        )?;
        let revs = st
            .query_map(params![now], |r| {
                Ok(RevocationRow {
                    peer_id: r.get(0)?,
                    until: r.get(1)?,
                    reason: r.get(2)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok((leases, revs))
    }

    fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let last_expiry: Option<i64> = tx
            .query_row(
                "SELECT cred_expires_at FROM nodes WHERE peer_id = ?1",
                params![peer_id],
                |r| r.get(0),
            )
            .optional()?;
        let until = last_expiry.unwrap_or(0).max(default_until);
        tx.execute(
            "UPDATE nodes SET revoked = 1 WHERE peer_id = ?1",
            params![peer_id],
        )?;
        tx.execute(
            "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(peer_id) DO UPDATE SET until = MAX(until, excluded.until), reason = excluded.reason",
            params![peer_id, until, reason, now],
        )?;
        tx.execute(
            "DELETE FROM router_leases WHERE peer_id = ?1",
            params![peer_id],
        )?;
        let until: i64 = tx.query_row(
            "SELECT until FROM revocations WHERE peer_id = ?1",
            params![peer_id],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(until)
    }

    fn keys(&self) -> Result<Vec<SigningKeyRow>, StoreError> {
        let conn = self.reader()?;
        let mut st = conn.prepare_cached(
            "SELECT key_id, secret, public, active_from, verify_until FROM signing_keys ORDER BY active_from, created_at, rowid",
        )?;
        let rows = st
            .query_map([], |r| {
                Ok(SigningKeyRow {
                    key_id: r.get(0)?,
                    secret: r.get(1)?,
                    public: r.get(2)?,
                    active_from: r.get(3)?,
                    verify_until: r.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn init_keys(&self, first: &SigningKeyRow, next_rotation_at: i64) -> Result<bool, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n: i64 = tx.query_row("SELECT COUNT(*) FROM signing_keys", [], |r| r.get(0))?;
        if n > 0 {
            tx.execute(
                "INSERT OR IGNORE INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)",
                params![next_rotation_at],
            )?;
            tx.commit()?;
            return Ok(false);
        }
        insert_key(&tx, first)?;
        tx.execute(
            "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)
             ON CONFLICT(id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
            params![next_rotation_at],
        )?;
        tx.commit()?;
        Ok(true)
    }

    fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        Ok(self
            .reader()?
            .query_row(
                "SELECT next_rotation_at FROM rotation_state WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let claimed = match expected {
            Some(old) => tx.execute(
                "UPDATE rotation_state SET next_rotation_at = ?2 WHERE id = 1 AND next_rotation_at = ?1",
                params![old, next],
            )?,
            None => tx.execute(
                "INSERT INTO rotation_state (id, next_rotation_at) VALUES (1, ?1)
                 ON CONFLICT(id) DO UPDATE SET next_rotation_at = excluded.next_rotation_at",
                params![next],
            )?,
        };
        if claimed != 1 {
            return Ok(false);
        }
        tx.execute(
            "UPDATE signing_keys SET verify_until = ?1 WHERE verify_until = 0",
            params![retire_until],
        )?;
        insert_key(&tx, new_key)?;
        tx.commit()?;
        Ok(true)
    }

    fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let mut conn = self.writer()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = reap::batch(&tx, now, policy, max_rows)?;
        tx.commit()?;
        Ok(out)
    }

    fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = TABLES
            .iter()
            .map(|t| format!("SELECT '{t}', COUNT(*) FROM {t}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let conn = self.reader()?;
        let mut st = conn.prepare_cached(&sql)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    fn backup_to(&self, to: &Path) -> Result<(), StoreError> {
        if to.exists() {
            return Err(io_err(
                to,
                std::io::Error::new(std::io::ErrorKind::AlreadyExists, "backup target exists"),
            ));
        }
        let target = to.to_str().ok_or_else(|| {
            io_err(
                to,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "path is not UTF-8"),
            )
        })?;
        self.reader()?.execute("VACUUM INTO ?1", params![target])?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_err(to, e))
    }
}

fn insert_key(tx: &rusqlite::Transaction<'_>, k: &SigningKeyRow) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO signing_keys (key_id, secret, public, created_at, active_from, verify_until)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            k.key_id,
            k.secret,
            k.public,
            agentmesh_proto::unix_now(),
            k.active_from,
            k.verify_until
        ],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, active_from: i64) -> SigningKeyRow {
        SigningKeyRow {
            key_id: id.into(),
            secret: vec![1; 64],
            public: vec![2; 32],
            active_from,
            verify_until: 0,
        }
    }

    #[test]
    fn file_is_private_and_rotation_is_claimed_once_across_two_connections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/cp.db");
        let a = SqliteStore::open(&path).expect("open a");
        let b = SqliteStore::open(&path).expect("open b (second replica)");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(a.init_keys(&key("k1", 100), 1000).expect("init"));
        assert!(!b.init_keys(&key("k1b", 100), 1000).expect("init b"));
        let deadline = a.next_rotation_at().expect("read").expect("set");
        assert_eq!(deadline, 1000);
        // Both replicas see the deadline pass and race to claim it: one wins.
        let won_a = a
            .rotate(Some(deadline), 2000, &key("k2", 1600), 9000)
            .expect("a");
        let won_b = b
            .rotate(Some(deadline), 2000, &key("k3", 1600), 9000)
            .expect("b");
        assert!(won_a ^ won_b, "exactly one claims: a={won_a} b={won_b}");
        let keys = a.keys().expect("keys");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].verify_until, 9000, "old key got its grace end");
        assert_eq!(keys[1].verify_until, 0);
        let counts = a.counts().expect("counts");
        assert!(counts.contains(&("signing_keys".to_string(), 2)));
    }
}
