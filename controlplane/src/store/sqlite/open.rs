//! Opening the database file: created with mode 0600 in a directory
//! created 0700, put in WAL mode with `synchronous=FULL`, migrated, given
//! a policy epoch if it has none, its signing keys sealed with the current
//! key-encryption key; then the read-only connections, opened after the
//! writer so they see all of it.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

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
        let deadline = Instant::now() + crate::store::DEFAULT_WAIT;
        retry_busy(deadline, || prepare_writer(&mut conn, &kek))?;
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

/// Puts the writer in WAL mode and migrates, epochs and reseals the file.
fn prepare_writer(conn: &mut Connection, kek: &Kek) -> Result<(), StoreError> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a committed enrollment survives power loss too (rates here are low).
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    migrations::migrate_sqlite(conn)?;
    super::policies::ensure_epoch(conn)?;
    reseal_keys(conn, kek)
}

/// Runs `step` again while it fails with `SQLITE_BUSY` and `deadline` is
/// ahead, after a jittered pause of 5–25 ms.
///
/// The busy handler does not cover every lock: while another process turns
/// a new file into WAL mode or recovers its WAL index, SQLite answers
/// `SQLITE_BUSY` at once (a deadlock it will not wait out), and its
/// documented remedy is to try the whole step again. Two control planes
/// (or a server and `store` command) starting together on an empty file hit
/// it; every step here is idempotent.
fn retry_busy(
    deadline: Instant,
    mut step: impl FnMut() -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    loop {
        match step() {
            Err(StoreError::Timeout(Wait::Lock)) if Instant::now() < deadline => {
                let pause =
                    Duration::from_millis(rand::Rng::gen_range(&mut rand::thread_rng(), 5..=25));
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            }
            other => return other,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_step_is_tried_again_until_it_succeeds_or_the_deadline_passes() {
        let mut tries = 0;
        let far = Instant::now() + Duration::from_secs(5);
        let r = retry_busy(far, || {
            tries += 1;
            if tries < 3 {
                Err(StoreError::Timeout(Wait::Lock))
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(tries, 3);

        let mut tries = 0;
        let r = retry_busy(Instant::now(), || {
            tries += 1;
            Err(StoreError::Timeout(Wait::Lock))
        });
        assert!(matches!(r, Err(StoreError::Timeout(Wait::Lock))), "{r:?}");
        assert_eq!(tries, 1, "no time left: tried once");

        // Other errors are never retried.
        let mut tries = 0;
        let r = retry_busy(far, || {
            tries += 1;
            Err(StoreError::Query("no such table".into()))
        });
        assert!(matches!(r, Err(StoreError::Query(_))));
        assert_eq!(tries, 1);
    }

    #[test]
    fn many_stores_opening_one_new_file_together_all_open() {
        for round in 0..20 {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("cp.db");
            let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
            let opened: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| SqliteStore::open(&path, kek.clone()).map(|_| ())))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("join")).collect()
            });
            for r in opened {
                assert!(r.is_ok(), "round {round}: {r:?}");
            }
        }
    }
}
