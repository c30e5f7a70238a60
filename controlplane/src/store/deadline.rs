//! The deadline of the store operation running on this task.
//!
//! [`super::Db::run`] sets it around exactly one operation with
//! [`within`]; the backends read it with [`current`] for their own waits (a
//! pooled connection, SQLite's busy handler, PostgreSQL's
//! `statement_timeout`). A store used on its own (offline commands, `store
//! copy`, tests) gets [`DEFAULT_WAIT`] from the start of each wait instead.
//!
//! It is a `std::time::Instant`: SQLite's waits block a thread of the
//! blocking pool on a `Condvar`, which tokio's (pausable) clock cannot drive.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// The wait for a store used outside [`within`]: the same 5 s the server's
/// `--db-wait-timeout-secs` defaults to.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

tokio::task_local! {
    static DEADLINE: Instant;
}

/// Runs `op` with every database wait inside it bounded by `deadline`.
pub(super) async fn within<R>(deadline: Instant, op: impl Future<Output = R>) -> R {
    DEADLINE.scope(deadline, op).await
}

/// The deadline of the operation on this task, or [`DEFAULT_WAIT`] from now.
pub(super) fn current() -> Instant {
    DEADLINE
        .try_with(|d| *d)
        .unwrap_or_else(|_| Instant::now() + DEFAULT_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_deadline_holds_inside_the_scope_only() {
        let inner = Instant::now() + Duration::from_secs(1);
        within(inner, async { assert_eq!(current(), inner) }).await;
        assert!(current() > inner + Duration::from_secs(2));
    }
}
