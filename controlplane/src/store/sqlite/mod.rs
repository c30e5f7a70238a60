//! The SQLite store, the file created with mode 0600, in WAL mode: one
//! writer connection and a few read-only ones, so reads (the directory,
//! keys, row counts, `/readyz`, backups) never queue behind a write; WAL
//! lets readers run beside the one writer. Every operation runs on the
//! blocking pool and waits for a connection no longer than its deadline
//! (see [`super::pool`]); `BEGIN IMMEDIATE` serialises writers, also across
//! processes sharing the file.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};

use super::{
    Deleted, EnrollRefusal, Enrolled, Kek, LeaseRow, NodeRefusal, NodeRow, ROUTER_ROLE, ReapPolicy,
    RevocationRow, SigningKeyRow, Snapshot, Store, StoreError, TABLES, TokenRow, Wait, deadline,
    migrations, pool::Pool, reap, snapshot::KeyEntry,
};

mod snapshot;

/// Default `--db-read-connections`: reads are short and few (the directory is
/// cached, keys and counts are read every half minute), so four let
/// `/readyz`, a directory read, a key reload and a backup run at once.
pub const DEFAULT_READ_CONNECTIONS: usize = 4;

impl From<rusqlite::Error> for StoreError {
    /// `SQLITE_BUSY` means the busy handler gave up, and it is given only
    /// what is left of the deadline: that is a timeout like the others.
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            Self::Timeout(Wait::Lock)
        } else {
            Self::Query(e.to_string())
        }
    }
}

/// SQLite storage.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// The connections, used on blocking threads.
pub(super) struct Inner {
    writer: Pool,
    readers: Pool,
    kek: Kek,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

pub(super) fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

pub(super) fn labels_json(l: &BTreeMap<String, String>) -> String {
    serde_json::to_string(l).unwrap_or_else(|_| "{}".into())
}

pub(super) fn parse_labels(
    table: &'static str,
    s: &str,
) -> Result<BTreeMap<String, String>, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table,
        what: format!("labels: {e}"),
    })
}

pub(super) fn parse_addrs(s: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table: "router_leases",
        what: format!("addrs: {e}"),
    })
}

pub(super) const NODE_COLS: &str = "node_id, peer_id, role, token_kind, token_id, labels, enrolled_at, last_seen, cred_expires_at, revoked";

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

/// Creates the directory of `path` (0700) if missing.
fn private_dir(path: &Path) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        // A directory we create is private; an existing one is left alone.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io_err(dir, e))?;
    }
    Ok(())
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

impl SqliteStore {
    /// Opens (creating with mode 0600) and migrates the database at `path`,
    /// with one read connection (offline commands and tests).
    pub fn open(path: &Path, kek: Kek) -> Result<Self, StoreError> {
        Self::open_with(path, 1, kek)
    }

    /// Opens (creating with mode 0600) and migrates the database at `path`,
    /// with `read_connections` (at least one) read-only connections; seals
    /// any signing key not sealed with `kek` yet. Blocking.
    pub fn open_with(path: &Path, read_connections: usize, kek: Kek) -> Result<Self, StoreError> {
        private_dir(path)?;
        create_private(path)?;
        let mut conn = Connection::open(path)?;
        // Opening waits for a lock as long as a store used on its own does.
        conn.busy_timeout(super::DEFAULT_WAIT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: a committed enrollment survives power loss too (rates here are low).
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations::migrate_sqlite(&mut conn)?;
        reseal_keys(&mut conn, &kek)?;
        // Opened after the writer set WAL mode and migrated, so they see it.
        let readers = (0..read_connections.max(1))
            .map(|_| open_reader(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                writer: Pool::new(vec![conn], Wait::Writer),
                readers: Pool::new(readers, Wait::Reader),
                kek,
            }),
        })
    }

    /// The writer connection, within the deadline (blocking; tests).
    #[cfg(test)]
    pub(super) fn writer(&self) -> Result<super::pool::Pooled<'_>, StoreError> {
        self.inner.writer.get()
    }

    /// Runs `f` on the blocking pool under the operation's deadline.
    async fn blocking<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Inner) -> Result<R, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        let deadline = deadline::current();
        tokio::task::spawn_blocking(move || super::pool::with_deadline(deadline, || f(&inner)))
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?
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

/// Seals, in one transaction, every signing key stored in the clear or
/// under a previous key-encryption key.
fn reseal_keys(conn: &mut Connection, kek: &Kek) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let rows = tx
        .prepare("SELECT key_id, secret FROM signing_keys")?
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, stored) in rows.into_iter().filter(|(_, s)| kek.needs_reseal(s)) {
        let sealed = kek.seal(&id, &kek.open(&id, &stored)?)?;
        tx.execute(
            "UPDATE signing_keys SET secret = ?2 WHERE key_id = ?1",
            params![id, sealed],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Writes a consistent copy of the SQLite database at `path` into the new
/// file `to`, opening the source read-only and never migrating it (a newer
/// binary must not change the schema under an older running server). The
/// target is created empty with mode 0600 first, so the copy is never
/// readable by others, not even for a moment. Blocking.
pub fn backup_file(path: &Path, to: &Path) -> Result<(), StoreError> {
    let conn = open_reader(path)?;
    conn.busy_timeout(super::DEFAULT_WAIT)?;
    if migrations::read_sqlite(&conn)?.is_none() {
        return Err(StoreError::Config(format!(
            "{} holds no control-plane schema",
            path.display()
        )));
    }
    vacuum_into(&conn, to)
}

fn vacuum_into(conn: &Connection, to: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let target = to.to_str().ok_or_else(|| {
        io_err(
            to,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "path is not UTF-8"),
        )
    })?;
    // create_new: an existing file (or a symlink planted there) is refused.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| io_err(to, e))?;
    // VACUUM INTO accepts an empty file and keeps its mode.
    if let Err(e) = conn.execute("VACUUM INTO ?1", params![target]) {
        let _ = std::fs::remove_file(to);
        return Err(e.into());
    }
    Ok(())
}

impl Inner {
    fn enroll(
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
        let token = tx
            .query_row(
                "SELECT token_id, kind, role, labels, expires_at FROM tokens WHERE digest = ?1",
                params![&digest[..]],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i32>(1)?,
                        r.get::<_, i32>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
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
        let Some((token_id, kind, role, labels, expires_at)) = token else {
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
    fn touch_in(
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

    fn touch_node(
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

    fn router_lease(
        &self,
        l: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = Self::touch_in(&tx, &l.peer_id, now, None, true)?;
        if out.is_ok() {
            insert_lease(&tx, l, true)?;
            tx.commit()?;
        }
        Ok(out)
    }

    fn directory(&self, now: i64) -> Result<(Vec<LeaseRow>, Vec<RevocationRow>), StoreError> {
        let conn = self.readers.get()?;
        let leases = read_leases(&conn, Some(now))?;
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
        let mut conn = self.writer.get()?;
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
        let until: i64 = tx.query_row(
            "INSERT INTO revocations (peer_id, until, reason, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(peer_id) DO UPDATE SET until = MAX(until, excluded.until), reason = excluded.reason
             RETURNING until",
            params![peer_id, until, reason, now],
            |r| r.get(0),
        )?;
        tx.execute(
            "DELETE FROM router_leases WHERE peer_id = ?1",
            params![peer_id],
        )?;
        tx.commit()?;
        Ok(until)
    }

    fn keys(&self) -> Result<Vec<SigningKeyRow>, StoreError> {
        let conn = self.readers.get()?;
        Ok(read_keys(&conn, &self.kek)?
            .into_iter()
            .map(|k| k.row)
            .collect())
    }

    fn init_keys(&self, first: &SigningKeyRow, next_rotation_at: i64) -> Result<bool, StoreError> {
        let mut conn = self.writer.get()?;
        // IMMEDIATE takes the file's write lock before the count: a second
        // process waits here and then finds the first one's key.
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
        insert_key(&tx, &self.kek, first, agentmesh_proto::unix_now())?;
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
            .readers
            .get()?
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
        let mut conn = self.writer.get()?;
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
        insert_key(&tx, &self.kek, new_key, agentmesh_proto::unix_now())?;
        tx.commit()?;
        Ok(true)
    }

    fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let mut conn = self.writer.get()?;
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
        let conn = self.readers.get()?;
        let mut st = conn.prepare_cached(&sql)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

fn insert_lease(conn: &Connection, l: &LeaseRow, upsert: bool) -> Result<(), StoreError> {
    let on_conflict = if upsert {
        "ON CONFLICT(peer_id) DO UPDATE SET node_id = excluded.node_id, addrs = excluded.addrs,
           labels = excluded.labels, attached = excluded.attached, transit = excluded.transit,
           high = excluded.high, low = excluded.low, draining = excluded.draining,
           expires_at = excluded.expires_at"
    } else {
        ""
    };
    conn.execute(
        &format!(
            "INSERT INTO router_leases (peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) {on_conflict}"
        ),
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

/// Leases live at `now`, or all of them.
fn read_leases(conn: &Connection, now: Option<i64>) -> Result<Vec<LeaseRow>, StoreError> {
    let mut st = conn.prepare_cached(
        "SELECT peer_id, node_id, addrs, labels, attached, transit, high, low, draining, expires_at
         FROM router_leases WHERE expires_at > ?1 ORDER BY node_id",
    )?;
    let raw = st
        .query_map(params![now.unwrap_or(i64::MIN)], |r| {
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
    raw.into_iter()
        .map(|(mut l, addrs, labels)| {
            l.addrs = parse_addrs(&addrs)?;
            l.labels = parse_labels("router_leases", &labels)?;
            Ok(l)
        })
        .collect()
}

/// Every key, opened, in signing order.
fn read_keys(conn: &Connection, kek: &Kek) -> Result<Vec<KeyEntry>, StoreError> {
    let mut st = conn.prepare_cached(
        "SELECT key_id, secret, public, active_from, verify_until, created_at FROM signing_keys ORDER BY active_from, created_at, rowid",
    )?;
    let rows = st
        .query_map([], |r| {
            Ok(KeyEntry {
                row: SigningKeyRow {
                    key_id: r.get(0)?,
                    secret: r.get(1)?,
                    public: r.get(2)?,
                    active_from: r.get(3)?,
                    verify_until: r.get(4)?,
                },
                created_at: r.get(5)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|mut k| {
            k.row.secret = kek.open(&k.row.key_id, &k.row.secret)?;
            Ok(k)
        })
        .collect()
}

fn insert_key(
    tx: &rusqlite::Transaction<'_>,
    kek: &Kek,
    k: &SigningKeyRow,
    created_at: i64,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO signing_keys (key_id, secret, public, created_at, active_from, verify_until)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            k.key_id,
            kek.seal(&k.key_id, &k.secret)?,
            k.public,
            created_at,
            k.active_from,
            k.verify_until
        ],
    )?;
    Ok(())
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(|s| {
            s.readers.get()?.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
        .await
    }

    async fn create_token(&self, digest: &[u8; 32], t: &TokenRow) -> Result<(), StoreError> {
        let (digest, t) = (*digest, t.clone());
        self.blocking(move |s| {
            s.writer.get()?.execute(
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
        })
        .await
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
        let (digest, peer, id, src) = (
            *digest,
            peer_id.to_vec(),
            new_node_id.to_string(),
            source.to_string(),
        );
        self.blocking(move |s| s.enroll(&digest, &peer, &id, &src, now, cred_expires_at))
            .await
    }

    async fn touch_node(
        &self,
        peer_id: &[u8],
        now: i64,
        cred_expires_at: Option<i64>,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let peer = peer_id.to_vec();
        self.blocking(move |s| s.touch_node(&peer, now, cred_expires_at))
            .await
    }

    async fn router_lease(
        &self,
        lease: &LeaseRow,
        now: i64,
    ) -> Result<Result<NodeRow, NodeRefusal>, StoreError> {
        let lease = lease.clone();
        self.blocking(move |s| s.router_lease(&lease, now)).await
    }

    async fn directory(&self, now: i64) -> Result<(Vec<LeaseRow>, Vec<RevocationRow>), StoreError> {
        self.blocking(move |s| s.directory(now)).await
    }

    async fn revoke(
        &self,
        peer_id: &[u8],
        reason: &str,
        now: i64,
        default_until: i64,
    ) -> Result<i64, StoreError> {
        let (peer, reason) = (peer_id.to_vec(), reason.to_string());
        self.blocking(move |s| s.revoke(&peer, &reason, now, default_until))
            .await
    }

    async fn keys(&self) -> Result<Vec<SigningKeyRow>, StoreError> {
        self.blocking(|s| s.keys()).await
    }

    async fn init_keys(
        &self,
        first: &SigningKeyRow,
        next_rotation_at: i64,
    ) -> Result<bool, StoreError> {
        let first = first.clone();
        self.blocking(move |s| s.init_keys(&first, next_rotation_at))
            .await
    }

    async fn next_rotation_at(&self) -> Result<Option<i64>, StoreError> {
        self.blocking(|s| s.next_rotation_at()).await
    }

    async fn rotate(
        &self,
        expected: Option<i64>,
        next: i64,
        new_key: &SigningKeyRow,
        retire_until: i64,
    ) -> Result<bool, StoreError> {
        let key = new_key.clone();
        self.blocking(move |s| s.rotate(expected, next, &key, retire_until))
            .await
    }

    async fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let policy = *policy;
        self.blocking(move |s| s.reap_batch(now, &policy, max_rows))
            .await
    }

    async fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.blocking(|s| s.counts()).await
    }

    async fn backup_to(&self, to: &Path) -> Result<(), StoreError> {
        let to = to.to_path_buf();
        self.blocking(move |s| vacuum_into(&*s.readers.get()?, &to))
            .await
    }

    async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.blocking(|s| s.snapshot()).await
    }

    async fn restore(&self, snap: &Snapshot) -> Result<(), StoreError> {
        let snap = snap.clone();
        self.blocking(move |s| s.restore(&snap)).await
    }
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

    #[tokio::test]
    async fn the_file_is_private_and_a_backup_is_private_read_only_and_never_migrates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/cp.db");
        let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
        let a = SqliteStore::open(&path, kek).expect("open");
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert!(a.init_keys(&key("k1", 100), 1000).await.expect("init"));
        let to = dir.path().join("backup.db");
        backup_file(&path, &to).expect("backup");
        assert_eq!(mode(&to), 0o600);
        let copy = Connection::open(&to).expect("open copy");
        let n: i64 = copy
            .query_row("SELECT COUNT(*) FROM signing_keys", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 1);
        assert!(
            backup_file(&path, &to).is_err(),
            "an existing target is refused"
        );
        // A database of an unknown, newer schema is copied as it is, never migrated.
        let newer = dir.path().join("newer.db");
        Connection::open(&newer)
            .expect("create")
            .execute_batch(
                "CREATE TABLE schema_version (id INTEGER PRIMARY KEY, version INTEGER, oldest_compatible INTEGER);
                 INSERT INTO schema_version VALUES (1, 99, 99);",
            )
            .expect("newer schema");
        backup_file(&newer, &dir.path().join("newer-backup.db")).expect("backup of a newer schema");
        let v: i64 = Connection::open(&newer)
            .expect("reopen")
            .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(v, 99, "untouched");
        let e = SqliteStore::open(&newer, Kek::absent()).expect_err("too new to serve");
        assert!(matches!(e, StoreError::SchemaTooNew { .. }), "{e}");
    }
}
