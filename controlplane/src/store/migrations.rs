//! Schema migrations, one list for both dialects, applied in order.
//!
//! The version lives in a `schema_version` row (`version`, and
//! `oldest_compatible`: the oldest schema a binary may have and still use
//! the database). Migrations are expand/contract: an expanding migration
//! (a new table or a nullable column old binaries ignore) keeps
//! `oldest_compatible`, so during a rolling update the old processes keep
//! serving; a contracting one (old binaries would misread the data) raises
//! it, and an old binary then refuses the database with a clear error
//! instead of misreading it. A binary opening a database newer than itself
//! runs when its own version is at least `oldest_compatible`.
//!
//! Two processes may start at once: SQLite reads the version inside a
//! `BEGIN IMMEDIATE` transaction, PostgreSQL under a transaction-level
//! advisory lock, so the second waits and then finds nothing to do. On
//! SQLite `PRAGMA user_version` mirrors `oldest_compatible`, which is what
//! binaries from before the `schema_version` table check.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::StoreError;

/// One schema step, in both dialects.
pub(crate) struct Migration {
    /// SQLite statements.
    pub(crate) sqlite: &'static str,
    /// PostgreSQL statements (BIGINT for every integer, BYTEA for blobs).
    pub(crate) postgres: &'static str,
    /// The oldest schema version that can use the database after this step.
    pub(crate) oldest_compatible: u32,
}

/// Migration `i` brings the schema from version `i` to `i + 1`.
pub(crate) const MIGRATIONS: &[Migration] = &[
    // 1: the initial schema.
    Migration {
        sqlite: "
    CREATE TABLE tokens (
        token_id     TEXT PRIMARY KEY,
        digest       BLOB NOT NULL UNIQUE,
        kind         INTEGER NOT NULL,
        role         INTEGER NOT NULL,
        labels       TEXT NOT NULL,
        max_uses     INTEGER NOT NULL,
        uses         INTEGER NOT NULL DEFAULT 0,
        created_at   INTEGER NOT NULL,
        expires_at   INTEGER NOT NULL,
        last_used_at INTEGER
    );
    CREATE TABLE nodes (
        node_id         TEXT PRIMARY KEY,
        peer_id         BLOB NOT NULL UNIQUE,
        role            INTEGER NOT NULL,
        token_kind      INTEGER NOT NULL,
        token_id        TEXT NOT NULL,
        labels          TEXT NOT NULL,
        enrolled_at     INTEGER NOT NULL,
        last_seen       INTEGER NOT NULL CHECK (last_seen > 0),
        cred_expires_at INTEGER NOT NULL,
        revoked         INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX nodes_last_seen ON nodes (last_seen);
    CREATE TABLE enrollment_requests (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        peer_id  BLOB,
        token_id TEXT,
        source   TEXT NOT NULL,
        outcome  TEXT NOT NULL,
        at       INTEGER NOT NULL
    );
    CREATE INDEX enrollment_requests_at ON enrollment_requests (at);
    CREATE TABLE router_leases (
        peer_id    BLOB PRIMARY KEY,
        node_id    TEXT NOT NULL,
        addrs      TEXT NOT NULL,
        labels     TEXT NOT NULL,
        attached   INTEGER NOT NULL,
        transit    INTEGER NOT NULL,
        high       INTEGER NOT NULL,
        low        INTEGER NOT NULL,
        draining   INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    );
    CREATE TABLE signing_keys (
        key_id       TEXT PRIMARY KEY,
        secret       BLOB NOT NULL,
        public       BLOB NOT NULL,
        created_at   INTEGER NOT NULL,
        active_from  INTEGER NOT NULL,
        verify_until INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE rotation_state (
        id               INTEGER PRIMARY KEY CHECK (id = 1),
        next_rotation_at INTEGER NOT NULL
    );
    CREATE TABLE revocations (
        peer_id    BLOB PRIMARY KEY,
        until      INTEGER NOT NULL,
        reason     TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    ",
        postgres: "
    CREATE TABLE tokens (
        token_id     TEXT PRIMARY KEY,
        digest       BYTEA NOT NULL UNIQUE,
        kind         BIGINT NOT NULL,
        role         BIGINT NOT NULL,
        labels       TEXT NOT NULL,
        max_uses     BIGINT NOT NULL,
        uses         BIGINT NOT NULL DEFAULT 0,
        created_at   BIGINT NOT NULL,
        expires_at   BIGINT NOT NULL,
        last_used_at BIGINT
    );
    CREATE TABLE nodes (
        node_id         TEXT PRIMARY KEY,
        peer_id         BYTEA NOT NULL UNIQUE,
        role            BIGINT NOT NULL,
        token_kind      BIGINT NOT NULL,
        token_id        TEXT NOT NULL,
        labels          TEXT NOT NULL,
        enrolled_at     BIGINT NOT NULL,
        last_seen       BIGINT NOT NULL CHECK (last_seen > 0),
        cred_expires_at BIGINT NOT NULL,
        revoked         BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE INDEX nodes_last_seen ON nodes (last_seen);
    CREATE TABLE enrollment_requests (
        id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        peer_id  BYTEA,
        token_id TEXT,
        source   TEXT NOT NULL,
        outcome  TEXT NOT NULL,
        at       BIGINT NOT NULL
    );
    CREATE INDEX enrollment_requests_at ON enrollment_requests (at);
    CREATE TABLE router_leases (
        peer_id    BYTEA PRIMARY KEY,
        node_id    TEXT NOT NULL,
        addrs      TEXT NOT NULL,
        labels     TEXT NOT NULL,
        attached   BIGINT NOT NULL,
        transit    BIGINT NOT NULL,
        high       BIGINT NOT NULL,
        low        BIGINT NOT NULL,
        draining   BOOLEAN NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE TABLE signing_keys (
        key_id       TEXT PRIMARY KEY,
        secret       BYTEA NOT NULL,
        public       BYTEA NOT NULL,
        created_at   BIGINT NOT NULL,
        active_from  BIGINT NOT NULL,
        verify_until BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE rotation_state (
        id               BIGINT PRIMARY KEY CHECK (id = 1),
        next_rotation_at BIGINT NOT NULL
    );
    CREATE TABLE revocations (
        peer_id    BYTEA PRIMARY KEY,
        until      BIGINT NOT NULL,
        reason     TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );
    ",
        oldest_compatible: 1,
    },
    // 2: signing-key secrets are sealed with the key-encryption key (the
    // store seals existing rows when it opens). A contraction: a binary of
    // schema 1 would read a sealed secret as a keypair.
    Migration {
        sqlite: "",
        postgres: "",
        oldest_compatible: 2,
    },
    // 3: policy versions and the database's policy epoch (its row is made
    // by the store when it opens, with a random value). An expansion:
    // binaries of schema 2 ignore both tables.
    Migration {
        sqlite: "
    CREATE TABLE policy_epoch (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        epoch      INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE policies (
        version      INTEGER PRIMARY KEY CHECK (version > 0),
        text         TEXT NOT NULL,
        applied_at   INTEGER NOT NULL,
        applied_by   TEXT NOT NULL,
        applied_from TEXT NOT NULL,
        replaced_at  INTEGER
    );
    CREATE INDEX policies_replaced_at ON policies (replaced_at);
    ",
        postgres: "
    CREATE TABLE policy_epoch (
        id         BIGINT PRIMARY KEY CHECK (id = 1),
        epoch      BIGINT NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE TABLE policies (
        version      BIGINT PRIMARY KEY CHECK (version > 0),
        text         TEXT NOT NULL,
        applied_at   BIGINT NOT NULL,
        applied_by   TEXT NOT NULL,
        applied_from TEXT NOT NULL,
        replaced_at  BIGINT
    );
    CREATE INDEX policies_replaced_at ON policies (replaced_at);
    ",
        oldest_compatible: 2,
    },
    // 4: token revocations, and an index to find a token's nodes. An
    // expansion: a revocation also sets the token's expiry to its instant,
    // so binaries of schema 3, which ignore the table, refuse the token as
    // expired (its nodes are marked revoked, which they do read).
    Migration {
        sqlite: "
    CREATE TABLE token_revocations (
        token_id   TEXT PRIMARY KEY,
        until      INTEGER NOT NULL,
        reason     TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX nodes_token_id ON nodes (token_id);
    ",
        postgres: "
    CREATE TABLE token_revocations (
        token_id   TEXT PRIMARY KEY,
        until      BIGINT NOT NULL,
        reason     TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX nodes_token_id ON nodes (token_id);
    ",
        oldest_compatible: 2,
    },
    // 5: the revocation list's generation: one counter row, bumped by a
    // trigger on every row written to or deleted from `revocations` and
    // `token_revocations`, in the writing transaction. So it follows the
    // commit order of revocation writes whoever makes them (a revocation,
    // the reaper, a restore, a binary of schema 4 during a rolling
    // upgrade), and a list read with its generation in one snapshot is the
    // list of that generation. An expansion: older binaries ignore the
    // table, and the triggers count their writes too.
    Migration {
        sqlite: "
    CREATE TABLE revocation_generation (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        generation INTEGER NOT NULL
    );
    INSERT INTO revocation_generation (id, generation) VALUES (1, 0);
    CREATE TRIGGER revocations_generation_insert AFTER INSERT ON revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER revocations_generation_update AFTER UPDATE ON revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER revocations_generation_delete AFTER DELETE ON revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER token_revocations_generation_insert AFTER INSERT ON token_revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER token_revocations_generation_update AFTER UPDATE ON token_revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER token_revocations_generation_delete AFTER DELETE ON token_revocations
    BEGIN UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1; END;
    ",
        postgres: "
    CREATE TABLE revocation_generation (
        id         BIGINT PRIMARY KEY CHECK (id = 1),
        generation BIGINT NOT NULL
    );
    INSERT INTO revocation_generation (id, generation) VALUES (1, 0);
    CREATE FUNCTION bump_revocation_generation() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE revocation_generation SET generation = generation + 1 WHERE id = 1;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER revocations_generation AFTER INSERT OR UPDATE OR DELETE ON revocations
        FOR EACH ROW EXECUTE FUNCTION bump_revocation_generation();
    CREATE TRIGGER token_revocations_generation AFTER INSERT OR UPDATE OR DELETE ON token_revocations
        FOR EACH ROW EXECUTE FUNCTION bump_revocation_generation();
    ",
        oldest_compatible: 2,
    },
    // 6: admin requests recorded with their effect (request ids), and an
    // index for their reaper. An expansion: older binaries ignore the
    // table (and do not record their own admin calls in it).
    Migration {
        sqlite: "
    CREATE TABLE admin_requests (
        request_id TEXT PRIMARY KEY,
        method     TEXT NOT NULL,
        digest     BLOB NOT NULL,
        response   BLOB NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX admin_requests_created_at ON admin_requests (created_at);
    ",
        postgres: "
    CREATE TABLE admin_requests (
        request_id TEXT PRIMARY KEY,
        method     TEXT NOT NULL,
        digest     BYTEA NOT NULL,
        response   BYTEA NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX admin_requests_created_at ON admin_requests (created_at);
    ",
        oldest_compatible: 2,
    },
    // 7: duty leases: which replica does the work that must run once per
    // control plane (the reaper and the row counts), timed by the
    // database's clock so replicas' clocks never disagree about expiry
    // (`crate::store::duty`). An expansion: older binaries ignore it and
    // reap as before, which stays safe (every deletion is conditional).
    Migration {
        sqlite: "
    CREATE TABLE duty_leases (
        duty          TEXT PRIMARY KEY,
        holder        TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL
    );
    ",
        postgres: "
    CREATE TABLE duty_leases (
        duty          TEXT PRIMARY KEY,
        holder        TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL
    );
    ",
        oldest_compatible: 2,
    },
    // 8: change notifications (PostgreSQL only): every statement that
    // writes the signing keys, the policies, the revocations or the router
    // leases sends `NOTIFY agentmesh_changes` with what changed, delivered
    // to every replica's listener when the transaction commits, whichever
    // replica or binary wrote it (`crate::changes`). SQLite serves one
    // process; there the polls alone carry changes. An expansion.
    Migration {
        sqlite: "",
        postgres: "
    CREATE FUNCTION agentmesh_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('agentmesh_changes', TG_ARGV[0]);
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER signing_keys_changed AFTER INSERT OR UPDATE OR DELETE ON signing_keys
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('keys');
    CREATE TRIGGER rotation_state_changed AFTER INSERT OR UPDATE OR DELETE ON rotation_state
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('keys');
    CREATE TRIGGER policies_changed AFTER INSERT OR UPDATE OR DELETE ON policies
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('policy');
    CREATE TRIGGER revocations_changed AFTER INSERT OR UPDATE OR DELETE ON revocations
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('revocations');
    CREATE TRIGGER token_revocations_changed AFTER INSERT OR UPDATE OR DELETE ON token_revocations
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('revocations');
    CREATE TRIGGER router_leases_changed AFTER INSERT OR UPDATE OR DELETE ON router_leases
        FOR EACH STATEMENT EXECUTE FUNCTION agentmesh_notify_change('directory');
    ",
        oldest_compatible: 2,
    },
    // 9: the key set's generation, as the revocation list's (5): one
    // counter row, bumped by a trigger on every row written to or deleted
    // from `signing_keys`, in the writing transaction, whoever writes it
    // (a rotation, the reaper, a reseal, a restore, a binary of schema 8
    // during a rolling upgrade); the keys read with it in one snapshot
    // are the keys of that generation. It starts at the number of keys
    // stored, so an upgraded database holding keys starts above 0. An
    // expansion: older binaries ignore the table, and the triggers count
    // their writes too.
    Migration {
        sqlite: "
    CREATE TABLE key_generation (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        generation INTEGER NOT NULL
    );
    INSERT INTO key_generation (id, generation) SELECT 1, COUNT(*) FROM signing_keys;
    CREATE TRIGGER signing_keys_generation_insert AFTER INSERT ON signing_keys
    BEGIN UPDATE key_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER signing_keys_generation_update AFTER UPDATE ON signing_keys
    BEGIN UPDATE key_generation SET generation = generation + 1 WHERE id = 1; END;
    CREATE TRIGGER signing_keys_generation_delete AFTER DELETE ON signing_keys
    BEGIN UPDATE key_generation SET generation = generation + 1 WHERE id = 1; END;
    ",
        postgres: "
    CREATE TABLE key_generation (
        id         BIGINT PRIMARY KEY CHECK (id = 1),
        generation BIGINT NOT NULL
    );
    INSERT INTO key_generation (id, generation) SELECT 1, COUNT(*) FROM signing_keys;
    CREATE FUNCTION bump_key_generation() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE key_generation SET generation = generation + 1 WHERE id = 1;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER signing_keys_generation AFTER INSERT OR UPDATE OR DELETE ON signing_keys
        FOR EACH ROW EXECUTE FUNCTION bump_key_generation();
    ",
        oldest_compatible: 2,
    },
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The table holding the version, in both dialects.
pub(crate) const VERSION_TABLE_SQLITE: &str = "CREATE TABLE IF NOT EXISTS schema_version (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    version           INTEGER NOT NULL,
    oldest_compatible INTEGER NOT NULL
)";
/// See [`VERSION_TABLE_SQLITE`].
pub(crate) const VERSION_TABLE_POSTGRES: &str = "CREATE TABLE IF NOT EXISTS schema_version (
    id                BIGINT PRIMARY KEY CHECK (id = 1),
    version           BIGINT NOT NULL,
    oldest_compatible BIGINT NOT NULL
)";

/// The migrations to apply to a database at `found` (`version`,
/// `oldest_compatible`), as indexes into [`MIGRATIONS`]; refuses a database
/// this binary is too old for.
pub(crate) fn pending(found: (u32, u32)) -> Result<std::ops::Range<usize>, StoreError> {
    let (version, oldest) = found;
    if version > SCHEMA_VERSION {
        if oldest > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found: version,
                oldest_compatible: oldest,
                ours: SCHEMA_VERSION,
            });
        }
        return Ok(0..0);
    }
    Ok(version as usize..MIGRATIONS.len())
}

/// `oldest_compatible` after applying migrations up to `version`.
pub(crate) fn oldest_compatible(version: u32) -> u32 {
    MIGRATIONS[..version as usize]
        .iter()
        .map(|m| m.oldest_compatible)
        .max()
        .unwrap_or(0)
}

/// Brings a SQLite database up to this build's schema in one `BEGIN
/// IMMEDIATE` transaction. Returns the version found before.
pub(crate) fn migrate_sqlite(conn: &mut Connection) -> Result<u32, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(VERSION_TABLE_SQLITE)?;
    let stored: Option<(u32, u32)> = tx
        .query_row(
            "SELECT version, oldest_compatible FROM schema_version WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    // A database from before the table: its version is `user_version`.
    let found = match stored {
        Some(v) => v,
        None => {
            let v: u32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            (v, v)
        }
    };
    let steps = pending(found)?;
    if steps.is_empty() && stored.is_some() {
        return Ok(found.0);
    }
    for m in &MIGRATIONS[steps.clone()] {
        tx.execute_batch(m.sqlite)?;
    }
    let version = found.0.max(steps.end as u32);
    let oldest = oldest_compatible(version.min(SCHEMA_VERSION)).max(found.1);
    tx.execute(
        "INSERT INTO schema_version (id, version, oldest_compatible) VALUES (1, ?1, ?2)
         ON CONFLICT(id) DO UPDATE SET version = excluded.version,
           oldest_compatible = excluded.oldest_compatible",
        rusqlite::params![version, oldest],
    )?;
    tx.pragma_update(None, "user_version", oldest)?;
    tx.commit()?;
    Ok(found.0)
}

/// The schema version and `oldest_compatible` of a SQLite database, read
/// without changing it (`None` when it was never migrated).
pub(crate) fn read_sqlite(conn: &Connection) -> Result<Option<(u32, u32)>, StoreError> {
    let has_table: bool = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if has_table {
        return Ok(conn
            .query_row(
                "SELECT version, oldest_compatible FROM schema_version WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?);
    }
    let v: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    Ok((v > 0).then_some((v, v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_database_is_used_while_this_binary_is_compatible() {
        assert_eq!(pending((0, 0)).expect("new"), 0..MIGRATIONS.len());
        assert!(
            pending((SCHEMA_VERSION, SCHEMA_VERSION))
                .expect("current")
                .is_empty()
        );
        // An expansion by a newer binary: still usable.
        assert!(
            pending((SCHEMA_VERSION + 1, SCHEMA_VERSION))
                .expect("expanded")
                .is_empty()
        );
        // A contraction by a newer binary: refused, naming both versions.
        let e = pending((SCHEMA_VERSION + 2, SCHEMA_VERSION + 1)).expect_err("contracted");
        assert!(matches!(e, StoreError::SchemaTooNew { .. }), "{e}");
    }

    #[test]
    fn two_connections_migrating_at_once_apply_the_schema_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cp.db");
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut c = Connection::open(&path).expect("open");
                    c.busy_timeout(std::time::Duration::from_secs(10))
                        .expect("busy");
                    migrate_sqlite(&mut c).expect("migrate")
                })
            })
            .collect();
        let mut found: Vec<u32> = handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect();
        found.sort();
        assert_eq!(
            found,
            vec![0, SCHEMA_VERSION],
            "one migrated, one found it done"
        );
        let c = Connection::open(&path).expect("open");
        assert_eq!(
            read_sqlite(&c).expect("read"),
            Some((SCHEMA_VERSION, oldest_compatible(SCHEMA_VERSION)))
        );
    }
}
