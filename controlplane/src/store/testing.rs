//! Test support: a database of its own per test on a real PostgreSQL
//! server, named by [`URL_ENV`] (`.ci/postgres.sh` starts a throwaway
//! cluster and exports it). Outside CI a missing server skips the
//! PostgreSQL half of a test with a printed `SKIPPED:` line; in CI (`CI`
//! set) it fails the test, so the suite can never pass by not running.

use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// The variable holding an admin URL of the test server
/// (`postgres://postgres@127.0.0.1:PORT/postgres`).
pub const URL_ENV: &str = "AGENTMESH_TEST_POSTGRES_URL";

/// A fresh, empty database on the test server.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its `postgres://` URL.
    pub url: String,
    /// Its name.
    pub name: String,
}

/// The test server's admin URL; `None` (after printing why) outside CI
/// when there is none. Panics in CI when there is none.
pub fn server_url() -> Option<String> {
    match std::env::var(URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{URL_ENV} is not set in CI: .ci/run starts PostgreSQL with .ci/postgres.sh; \
             the PostgreSQL tests fail rather than skip"
        ),
        _ => {
            println!(
                "SKIPPED: {URL_ENV} is not set (run under .ci/postgres.sh for the PostgreSQL half)"
            );
            None
        }
    }
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_end = base[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i)
        .unwrap_or(base.len());
    format!("{}/{name}{query}", &base[..host_end])
}

/// Creates a fresh database on the test server; `None` when there is no
/// server outside CI (see [`server_url`]).
pub async fn fresh_database() -> Option<TestDb> {
    let admin = server_url()?;
    Some(
        create_database(&admin)
            .await
            .expect("create a test database"),
    )
}

/// Creates a database with a unique name on the server at `admin_url`.
pub async fn create_database(admin_url: &str) -> Result<TestDb, StoreError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "agentmesh_test_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    );
    let (client, conn) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    drop(client);
    let _ = task.await;
    Ok(TestDb {
        url: with_database(admin_url, &name),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_and_the_rest_kept() {
        assert_eq!(
            with_database(
                "postgres://pg@127.0.0.1:5432/postgres?sslmode=disable",
                "t1"
            ),
            "postgres://pg@127.0.0.1:5432/t1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://pg@127.0.0.1:5432", "t1"),
            "postgres://pg@127.0.0.1:5432/t1"
        );
    }
}
