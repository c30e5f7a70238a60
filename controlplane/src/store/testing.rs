//! Test support: a database of its own per test on a real PostgreSQL
//! server, named by [`URL_ENV`] (`.ci/postgres.sh` starts a throwaway
//! cluster and exports it). Without a server, the PostgreSQL half of a test
//! fails where PostgreSQL is required (`CI` set, or [`REQUIRE_ENV`]`=1`,
//! which `.ci/run` and `.ci/postgres.sh` export), so CI can never pass by
//! not running it; elsewhere it returns after a one-line note saying that
//! it did not run and how to run it. One test,
//! `store::testing::tests::the_postgres_half_runs_or_a_note_says_how_to_run_it`,
//! has its output shown by nextest even when it passes
//! (`.config/nextest.toml`), so a run says once which it was.

use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;

/// The variable holding an admin URL of the test server
/// (`postgres://postgres@127.0.0.1:PORT/postgres`).
pub const URL_ENV: &str = "AGENTMESH_TEST_POSTGRES_URL";

/// Set to `1` where the PostgreSQL half of the tests must run (as `CI` does).
pub const REQUIRE_ENV: &str = "AGENTMESH_REQUIRE_POSTGRES";

/// How to run the PostgreSQL half, for the note and the failure.
pub const HOW_TO_RUN: &str = "bash .ci/postgres.sh cargo nextest run -p agentmesh-controlplane";

/// A fresh, empty database on the test server.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its `postgres://` URL.
    pub url: String,
    /// Its name.
    pub name: String,
}

/// Whether a missing server fails the test: `CI` is set, or
/// [`REQUIRE_ENV`] is `1`.
pub fn required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// The test server's admin URL; `None`, after the note, when there is none
/// and PostgreSQL is not [`required`]. Panics when it is required and there
/// is none.
pub fn server_url() -> Option<String> {
    match std::env::var(URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if required() => panic!(
            "{URL_ENV} is not set, and PostgreSQL is required here (CI or {REQUIRE_ENV}=1): \
             the PostgreSQL half of the tests fails rather than skips; run `{HOW_TO_RUN}`"
        ),
        _ => {
            eprintln!(
                "note: the PostgreSQL half of the storage tests did not run ({URL_ENV} is unset); \
                 run it with `{HOW_TO_RUN}`"
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
/// server and PostgreSQL is not [`required`] (see [`server_url`]).
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

    /// Says, once per run, whether the PostgreSQL half runs: nextest shows
    /// this test's output even when it passes. Fails where PostgreSQL is
    /// required and missing, like every PostgreSQL half.
    #[test]
    fn the_postgres_half_runs_or_a_note_says_how_to_run_it() {
        if let Some(url) = server_url() {
            let server = url.rsplit_once('@').map_or(url.as_str(), |(_, s)| s);
            eprintln!("the PostgreSQL half of the storage tests runs on {server}");
        }
    }

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
