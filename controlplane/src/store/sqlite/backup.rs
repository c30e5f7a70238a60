//! `backup`: a consistent copy of the database while serving, through
//! `VACUUM INTO` on a read-only connection, into a file created 0600 first;
//! the copy gets a policy epoch of its own.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

use super::{io_err, open::open_reader};
use crate::store::{StoreError, migrations};

/// Writes a consistent copy of the SQLite database at `path` into the new
/// file `to`, opening the source read-only and never migrating it (a newer
/// binary must not change the schema under an older running server). The
/// target is created empty with mode 0600 first, so the copy is never
/// readable by others, not even for a moment. Blocking.
pub fn backup_file(path: &Path, to: &Path) -> Result<(), StoreError> {
    let conn = open_reader(path)?;
    conn.busy_timeout(crate::store::DEFAULT_WAIT)?;
    if migrations::read_sqlite(&conn)?.is_none() {
        return Err(StoreError::Config(format!(
            "{} holds no control-plane schema",
            path.display()
        )));
    }
    vacuum_into(&conn, to)
}

pub(super) fn vacuum_into(conn: &Connection, to: &Path) -> Result<(), StoreError> {
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
    if let Err(e) = new_epoch_in(to) {
        let _ = std::fs::remove_file(to);
        return Err(e);
    }
    Ok(())
}

/// Gives the copy a policy epoch of its own: a database restored from it
/// starts a new policy history, which members accept even though its
/// versions are lower than the ones they hold (a copy of a schema from
/// before policies has no epoch table and gets its epoch when served).
fn new_epoch_in(copy: &Path) -> Result<(), StoreError> {
    let conn = Connection::open(copy)?;
    conn.busy_timeout(crate::store::DEFAULT_WAIT)?;
    let has_table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'policy_epoch'",
            [],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    if has_table {
        super::policies::replace_epoch(&conn)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Kek, SigningKeyRow, SqliteStore, Store};

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
