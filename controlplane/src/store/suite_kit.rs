//! What every two-backend store suite (`suite`, `policy_suite`,
//! `token_revocation_suite`) starts from: the backend a case runs on and a
//! database of its own there (a SQLite file in a temp dir, or a fresh
//! PostgreSQL database from `testing`), with its own key-encryption key.

use std::sync::Arc;

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The other backend (a copy's destination).
    pub(super) fn other(self) -> Backend {
        match self {
            Backend::Sqlite => Backend::Postgres,
            Backend::Postgres => Backend::Sqlite,
        }
    }
}

/// One database and a way to open more stores on it.
pub(super) struct Target {
    pub(super) url: String,
    _dir: tempfile::TempDir,
    pub(super) kek: Kek,
}

impl Target {
    pub(super) async fn new(b: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = match b {
            Backend::Sqlite => format!("sqlite://{}", dir.path().join("cp.db").display()),
            Backend::Postgres => testing::fresh_database().await?.url,
        };
        Some(Self {
            url,
            _dir: dir,
            kek: Kek::from_hex(&Kek::generate_hex()).expect("kek"),
        })
    }

    pub(super) async fn open(&self) -> Arc<dyn Store> {
        open(&OpenOptions {
            url: self.url.clone(),
            read_connections: 2,
            pool_connections: 4,
            kek: self.kek.clone(),
        })
        .await
        .expect("open store")
    }
}

/// Runs each named case (an `async fn(Backend)` of the invoking module)
/// as two tests, `sqlite::NAME` and `postgres::NAME`.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::Backend::Sqlite).await
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::Backend::Postgres).await
            })*
        }
    };
}
pub(super) use on_both;
