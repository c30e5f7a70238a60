//! One test body on both backends. [`on_both!`] turns each listed
//! `async fn name(db: TestDb)` into two tests, `sqlite::name` on a SQLite
//! file of its own and `postgres::name` on a PostgreSQL database of its own
//! (`CREATE DATABASE` on the server `AGENTMESH_TEST_POSTGRES_URL` names, see
//! `agentmesh_controlplane::store::testing`). Without that server the
//! PostgreSQL half fails in CI (`CI` set or `AGENTMESH_REQUIRE_POSTGRES=1`)
//! and elsewhere prints a one-line note saying how to run it.
//!
//! [`TestDb`] is everything a test needs from its database without knowing
//! the backend: the control plane's config, the environment the real binary
//! needs, the store opened as the control plane opens it, and SQL run beside
//! the control plane (as an operator, or a clock in the future, would):
//! statements in the SQL both dialects share, with blobs written by
//! [`TestDb::blob`].

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use agentmesh_controlplane::{
    Config, Handle, spawn,
    store::{self, OpenOptions, Store, testing},
};

use super::ADMIN;

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in the test's temporary directory.
    Sqlite,
    /// A fresh database on the test PostgreSQL server.
    Postgres,
}

/// A database of the test's own on one backend, and a temporary directory
/// for everything else the test writes (certificates, key files).
pub struct TestDb {
    backend: Backend,
    dir: tempfile::TempDir,
    url: String,
    /// PostgreSQL: the key-encryption key (64 hex digits) every control
    /// plane on this database is given. SQLite: none, the control plane
    /// creates `cp.db.kek` beside the file.
    kek: Option<String>,
}

impl TestDb {
    /// A new, empty database; `None` only for PostgreSQL when there is no
    /// test server outside CI (after printing the note).
    pub async fn new(backend: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, kek) = match backend {
            Backend::Sqlite => (
                format!("sqlite://{}", dir.path().join("cp.db").display()),
                None,
            ),
            Backend::Postgres => (
                testing::fresh_database().await?.url,
                Some(store::Kek::generate_hex()),
            ),
        };
        Some(Self {
            backend,
            dir,
            url,
            kek,
        })
    }

    /// Another new, empty database on the same backend.
    pub async fn another(&self) -> Self {
        Self::new(self.backend)
            .await
            .expect("a second database where the first one was made")
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The `--db` URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The test's temporary directory (it holds the SQLite file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The SQLite file, for what only SQLite has (a file to back up).
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        (self.backend == Backend::Sqlite).then(|| self.dir.path().join("cp.db"))
    }

    /// A control plane on this database: loopback port 0, the test admin
    /// token, the KEK on PostgreSQL, the allow-all policy when none is
    /// applied (the policy tests choose their own).
    pub fn config(&self) -> Config {
        Config {
            admin_token: Some(ADMIN.into()),
            policy_allow_all: true,
            db: self.url.clone(),
            key_encryption_key: self.kek.clone(),
            ..Config::ephemeral(&self.dir.path().join("cp.db"))
        }
    }

    /// Starts a control plane with [`TestDb::config`].
    pub async fn start(&self) -> Handle {
        spawn(self.config()).await.expect("control plane starts")
    }

    /// What the real binary needs in its environment for this database.
    pub fn binary_env(&self) -> Vec<(&'static str, String)> {
        self.kek
            .iter()
            .map(|k| (store::KEK_ENV, k.clone()))
            .collect()
    }

    /// The store, opened as a control plane on this database opens it (the
    /// same key-encryption key).
    pub async fn store(&self) -> Arc<dyn Store> {
        let kek = store::resolve_kek(&self.url, None, self.kek.as_deref(), None).expect("the KEK");
        store::open(&OpenOptions {
            url: self.url.clone(),
            read_connections: 1,
            pool_connections: 2,
            kek,
        })
        .await
        .expect("open the store")
    }

    /// Runs one statement; returns the rows it changed.
    pub async fn exec(&self, sql: &str) -> u64 {
        match self.backend {
            Backend::Sqlite => {
                let (path, sql) = (self.dir.path().join("cp.db"), sql.to_string());
                tokio::task::spawn_blocking(move || {
                    let c = rusqlite::Connection::open(path).expect("open db");
                    c.busy_timeout(Duration::from_secs(10))
                        .expect("busy timeout");
                    c.execute(&sql, []).expect("sql runs") as u64
                })
                .await
                .expect("join")
            }
            Backend::Postgres => {
                let (client, task) = self.pg_client().await;
                let n = client.execute(sql, &[]).await.expect("sql runs");
                drop(client);
                let _ = task.await;
                n
            }
        }
    }

    /// The integer in the first column of the one row `sql` returns.
    pub async fn count(&self, sql: &str) -> i64 {
        match self.backend {
            Backend::Sqlite => {
                let (path, sql) = (self.dir.path().join("cp.db"), sql.to_string());
                tokio::task::spawn_blocking(move || {
                    let c = rusqlite::Connection::open(path).expect("open db");
                    c.busy_timeout(Duration::from_secs(10))
                        .expect("busy timeout");
                    c.query_row(&sql, [], |r| r.get(0)).expect("one integer")
                })
                .await
                .expect("join")
            }
            Backend::Postgres => {
                let (client, task) = self.pg_client().await;
                let n = client
                    .query_one(sql, &[])
                    .await
                    .expect("one row")
                    .get::<_, i64>(0);
                drop(client);
                let _ = task.await;
                n
            }
        }
    }

    /// `bytes` as a literal of this dialect (`X'..'` or `'\x..'::bytea`).
    pub fn blob(&self, bytes: &[u8]) -> String {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        match self.backend {
            Backend::Sqlite => format!("X'{hex}'"),
            Backend::Postgres => format!("'\\x{hex}'::bytea"),
        }
    }

    /// Another connection, as a second process or an operator would open
    /// one, holding what a write needs: SQLite's file write lock
    /// (`BEGIN IMMEDIATE`), or on PostgreSQL a lock on `tokens` that blocks
    /// writes to it and not reads. Held until [`WriteLock::release`].
    pub async fn hold_write_lock(&self) -> WriteLock {
        match self.backend {
            Backend::Sqlite => {
                let c = rusqlite::Connection::open(self.dir.path().join("cp.db")).expect("open");
                c.execute_batch("BEGIN IMMEDIATE").expect("write lock");
                WriteLock::Sqlite(c)
            }
            Backend::Postgres => {
                let (client, task) = self.pg_client().await;
                client
                    .batch_execute("BEGIN; LOCK TABLE tokens IN EXCLUSIVE MODE")
                    .await
                    .expect("lock");
                WriteLock::Postgres(client, task)
            }
        }
    }

    /// The `wait` labels of `db_wait_timeouts_total` a write blocked by a
    /// [`WriteLock`] may be counted under: SQLite's busy handler gives up on
    /// the file lock; on PostgreSQL `statement_timeout` and `lock_timeout`
    /// are both what is left of the deadline, and which fires first is the
    /// server's (the statement's timer starts a moment before the lock wait).
    /// On SQLite also `writer`: a background write (the replica heartbeat,
    /// the reaper's duty claim) may hold the one writer connection while it
    /// waits for the file lock, and the request then waits for the writer.
    pub fn lock_waits(&self) -> &'static [&'static str] {
        match self.backend {
            Backend::Sqlite => &["lock", "writer"],
            Backend::Postgres => &["lock", "statement"],
        }
    }

    async fn pg_client(&self) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        (client, task)
    }
}

/// A write lock held by a connection apart from the control plane's.
pub enum WriteLock {
    Sqlite(rusqlite::Connection),
    Postgres(tokio_postgres::Client, tokio::task::JoinHandle<()>),
}

impl WriteLock {
    /// Rolls the holding transaction back.
    pub async fn release(self) {
        match self {
            WriteLock::Sqlite(c) => c.execute_batch("ROLLBACK").expect("unlock"),
            WriteLock::Postgres(client, task) => {
                client.batch_execute("ROLLBACK").await.expect("unlock");
                drop(client);
                let _ = task.await;
            }
        }
    }
}

/// Runs each test body listed (`async fn name(db: TestDb)` in the invoking
/// module) on both backends, as `sqlite::name` and `postgres::name`, each
/// under the test attribute its group names:
///
/// ```ignore
/// on_both!(
///     #[tokio::test] first_body, second_body;
///     #[tokio::test(flavor = "multi_thread", worker_threads = 2)] a_racing_body;
/// );
/// ```
macro_rules! on_both {
    ($(#[$test:meta] $($name:ident),+ $(,)?);+ $(;)?) => {
        mod sqlite {
            $($(
                #[$test]
                async fn $name() {
                    let db = $crate::common::TestDb::new($crate::common::Backend::Sqlite)
                        .await
                        .expect("a SQLite file");
                    super::$name(db).await
                }
            )+)+
        }
        mod postgres {
            $($(
                #[$test]
                async fn $name() {
                    if let Some(db) =
                        $crate::common::TestDb::new($crate::common::Backend::Postgres).await
                    {
                        super::$name(db).await
                    }
                }
            )+)+
        }
    };
}
