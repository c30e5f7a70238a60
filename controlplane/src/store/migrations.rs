//! Schema migrations, applied in order and tracked with `PRAGMA user_version`.

use rusqlite::Connection;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "
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
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Applies the migrations the database has not seen, each in a transaction.
/// A database newer than this build is refused.
pub(crate) fn migrate(conn: &mut Connection) -> Result<u32, rusqlite::Error> {
    let current: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > SCHEMA_VERSION {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "database schema version {current} is newer than this build ({SCHEMA_VERSION})"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as u32 + 1)?;
        tx.commit()?;
    }
    Ok(SCHEMA_VERSION)
}
