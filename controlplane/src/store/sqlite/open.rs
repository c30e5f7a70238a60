//! Opening the database file: created with mode 0600 in a directory
//! created 0700, put in WAL mode with `synchronous=FULL`, migrated, given
//! a policy epoch if it has none, its signing keys sealed with the current
//! key-encryption key; then the read-only connections, opened after the
//! writer so they see all of it.

use std::{path::Path, sync::Arc};

use rusqlite::{Connection, OpenFlags};

use super::{Inner, SqliteStore, io_err, keys::reseal_keys};
use crate::store::{Kek, StoreError, Wait, migrations, pool::Pool};

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

pub(super) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
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
        conn.busy_timeout(crate::store::DEFAULT_WAIT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: a committed enrollment survives power loss too (rates here are low).
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations::migrate_sqlite(&mut conn)?;
        super::policies::ensure_epoch(&conn)?;
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
