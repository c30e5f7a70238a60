//! What a PostgreSQL failure means for the caller, by class, so every
//! client gets a status it can act on and never `INTERNAL`:
//!
//! - the transaction lost a conflict the server resolved by aborting it
//!   (serialization failure `40001`, deadlock `40P01`): nothing was
//!   written, the same request a moment later succeeds, so
//!   [`StoreError::Conflict`] (UNAVAILABLE with retry-after);
//! - a wait ran out (`57014` statement timeout, `55P03` lock timeout):
//!   [`StoreError::Timeout`] (UNAVAILABLE with retry-after);
//! - the connection is gone or going (the socket closed, class `08`
//!   connection exception, `57P01`..`57P03` the server terminating the
//!   backend or shutting down, `25P03` our idle-in-transaction timeout):
//!   [`StoreError::Unreachable`], UNAVAILABLE *without* a retry promise,
//!   because a COMMIT that was in flight may or may not have committed:
//!   the caller retries with a request id or re-reads, not blindly;
//! - anything else the server refused: [`StoreError::Query`].
//!
//! A connection is never handed to the next operation unchecked: the
//! pool verifies each with an empty query before reuse ([`super::open`]),
//! so one whose backend was terminated is replaced rather than failing a
//! second operation; a transaction that failed is rolled back on drop.

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;

use crate::store::{StoreError, Wait};

/// `25P03`: the backend ended a session idle in a transaction past
/// `idle_in_transaction_session_timeout` (tokio-postgres has no constant).
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        let Some(code) = e.code() else {
            // No SQLSTATE: the socket, TLS or the protocol failed.
            return Self::Unreachable(e.to_string());
        };
        if *code == SqlState::QUERY_CANCELED {
            Self::Timeout(Wait::Statement)
        } else if *code == SqlState::LOCK_NOT_AVAILABLE {
            Self::Timeout(Wait::Lock)
        } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            Self::Conflict(format!("{}: {}", code.code(), message(&e)))
        } else if e.is_closed() || connection_lost(code) {
            Self::Unreachable(format!("{}: {}", code.code(), message(&e)))
        } else {
            Self::Query(format!("{}: {}", code.code(), message(&e)))
        }
    }
}

/// Whether `code` says the session is over (or never began).
fn connection_lost(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || c == IDLE_IN_TRANSACTION_TIMEOUT
}

fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_string())
}

/// A pool's failure to hand out a connection.
pub(super) fn pool_err(e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(_) => StoreError::Timeout(Wait::Connection),
        PoolError::Backend(e) => e.into(),
        other => StoreError::Unreachable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    //! Each class provoked on a real server: a serialization failure, a
    //! backend terminated mid-transaction and during COMMIT, a session
    //! ended for idling in a transaction; and what the client is told.
    use std::time::Duration;

    use super::*;
    use crate::store::{Kek, PgOptions, PostgresStore, postgres::process_env, testing};

    async fn client(url: &str) -> tokio_postgres::Client {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        c
    }

    async fn pid(c: &tokio_postgres::Client) -> i32 {
        c.query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0)
    }

    async fn terminate(admin: &tokio_postgres::Client, pid: i32) {
        let done: bool = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .expect("terminate")
            .get(0);
        assert!(done, "backend {pid} terminated");
    }

    #[tokio::test]
    async fn a_serialization_failure_is_a_conflict() {
        let Some(db) = testing::fresh_database().await else {
            return;
        };
        let (a, b) = (client(&db.url).await, client(&db.url).await);
        a.batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
            .await
            .expect("table");
        a.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT v FROM t")
            .await
            .expect("begin");
        b.execute("UPDATE t SET v = 1 WHERE id = 1", &[])
            .await
            .expect("concurrent update");
        let e = a
            .execute("UPDATE t SET v = 2 WHERE id = 1", &[])
            .await
            .expect_err("serialization failure");
        let e = StoreError::from(e);
        assert!(matches!(e, StoreError::Conflict(_)), "{e:?}");
    }

    #[tokio::test]
    async fn a_deadlock_is_a_conflict() {
        let Some(db) = testing::fresh_database().await else {
            return;
        };
        let (a, b) = (client(&db.url).await, client(&db.url).await);
        a.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0), (2, 0)",
        )
        .await
        .expect("table");
        a.batch_execute("BEGIN; UPDATE t SET v = 1 WHERE id = 1")
            .await
            .expect("a locks 1");
        b.batch_execute("BEGIN; UPDATE t SET v = 1 WHERE id = 2")
            .await
            .expect("b locks 2");
        // Each now waits for the other's row; the server aborts one.
        let (ra, rb) = tokio::join!(
            a.execute("UPDATE t SET v = 2 WHERE id = 2", &[]),
            b.execute("UPDATE t SET v = 2 WHERE id = 1", &[]),
        );
        let e = ra.err().or(rb.err()).expect("one of the two aborted");
        let e = StoreError::from(e);
        assert!(matches!(e, StoreError::Conflict(_)), "{e:?}");
    }

    #[tokio::test]
    async fn a_backend_terminated_mid_transaction_or_in_commit_is_unreachable() {
        let Some(db) = testing::fresh_database().await else {
            return;
        };
        let admin = client(&db.url).await;
        admin
            .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
            .await
            .expect("table");
        for step in ["SELECT 1", "COMMIT"] {
            let a = client(&db.url).await;
            a.batch_execute("BEGIN; INSERT INTO t VALUES (1)")
                .await
                .expect("begin");
            terminate(&admin, pid(&a).await).await;
            let e = a.batch_execute(step).await.expect_err("connection gone");
            let e = StoreError::from(e);
            assert!(matches!(e, StoreError::Unreachable(_)), "{step}: {e:?}");
        }
    }

    async fn store(url: &str, pool: usize) -> PostgresStore {
        let env = process_env();
        let opts = PgOptions::from_url_and_env(url, &env).expect("options");
        let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
        PostgresStore::open(opts, pool, kek).await.expect("open")
    }

    #[tokio::test]
    async fn a_pooled_connection_whose_backend_was_terminated_is_replaced() {
        let Some(db) = testing::fresh_database().await else {
            return;
        };
        let s = store(&db.url, 1).await;
        let admin = client(&db.url).await;
        crate::store::Store::ping(&s).await.expect("first ping");
        let me = pid(&admin).await;
        let killed: i64 = admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> $1) k",
                &[&me],
            )
            .await
            .expect("terminate the pool's backend")
            .get(0);
        assert_eq!(killed, 1, "the pool held one connection");
        // The pool checks the connection before reuse and opens another.
        crate::store::Store::ping(&s)
            .await
            .expect("a fresh connection after the terminated one");
    }

    #[tokio::test]
    async fn a_session_idle_in_a_transaction_is_ended_by_the_server() {
        let Some(db) = testing::fresh_database().await else {
            return;
        };
        let s = store(&db.url, 1).await;
        let admin = client(&db.url).await;
        let (mut conn, _) = s.conn().await.expect("conn");
        let tx = conn.transaction().await.expect("begin");
        PostgresStore::bound(&tx, 100).await.expect("bound");
        let held: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        // The transaction now idles as a stopped replica's would: the
        // server ends its session (the wait below is a deadline, not the
        // expectation).
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let n: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                        &[&held],
                    )
                    .await
                    .expect("activity")
                    .get(0);
                if n == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the idle transaction's session was ended");
        let e = tx
            .query_one("SELECT 1", &[])
            .await
            .expect_err("session over");
        let e = StoreError::from(e);
        assert!(matches!(e, StoreError::Unreachable(_)), "{e:?}");
    }
}
