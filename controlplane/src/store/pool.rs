//! SQLite connections handed out against a deadline.
//!
//! A [`Pool`] holds idle connections (one for the writer, a few read-only
//! ones for readers). [`Pool::get`] waits for one only until the deadline of
//! the operation, then gives SQLite's own busy handler only what is left of
//! it. So neither an operation holding the connection (a slow reap batch, a
//! checkpoint) nor another process holding the file lock (a second replica,
//! an offline `token create`) can keep a caller past `--db-wait-timeout-secs`.
//!
//! The deadline reaches the pool through a thread-local set by
//! [`with_deadline`] around exactly one closure on one blocking thread (the
//! SQLite store copies the operation's deadline there): that keeps it off
//! every method without letting it leak into the next operation on that
//! thread.
//!
//! Waits here use `std::time::Instant`: they block a thread of the blocking
//! pool on a `Condvar`, which tokio's (pausable) clock cannot drive.

use std::{
    cell::Cell,
    ops::{Deref, DerefMut},
    sync::{Condvar, Mutex, MutexGuard},
    time::Instant,
};

use rusqlite::Connection;

use super::{StoreError, Wait};

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `f` with every connection wait inside it bounded by `deadline`.
pub(super) fn with_deadline<R>(deadline: Instant, f: impl FnOnce() -> R) -> R {
    /// Restores the outer deadline, also when `f` panics.
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEADLINE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DEADLINE.with(|d| d.replace(Some(deadline))));
    f()
}

fn current_deadline() -> Instant {
    DEADLINE
        .with(Cell::get)
        .unwrap_or_else(|| Instant::now() + super::DEFAULT_WAIT)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only push and pop run under this lock; a panic cannot leave the list
    // half-changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Idle connections and a condition variable signalled when one comes back.
pub(super) struct Pool {
    idle: Mutex<Vec<Connection>>,
    returned: Condvar,
    /// What a timeout here is reported as.
    wait: Wait,
}

impl Pool {
    /// A pool over `conns`; timeouts are reported as `wait`.
    pub(super) fn new(conns: Vec<Connection>, wait: Wait) -> Self {
        Self {
            idle: Mutex::new(conns),
            returned: Condvar::new(),
            wait,
        }
    }

    /// A connection, waiting at most until the current deadline; its
    /// SQLite busy timeout is set to what is left of that deadline.
    pub(super) fn get(&self) -> Result<Pooled<'_>, StoreError> {
        let deadline = current_deadline();
        let mut idle = lock(&self.idle);
        let conn = loop {
            if let Some(conn) = idle.pop() {
                break conn;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout(self.wait));
            }
            idle = self
                .returned
                .wait_timeout(idle, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(idle);
        // From here on the connection goes back to the pool on every path.
        let pooled = Pooled {
            pool: self,
            conn: Some(conn),
        };
        pooled.busy_timeout(deadline.saturating_duration_since(Instant::now()))?;
        Ok(pooled)
    }
}

/// A connection taken from a [`Pool`]; dropping it gives it back. An open
/// transaction on it has been rolled back by then (rusqlite's `Transaction`
/// rolls back on drop, also during a panic).
pub(super) struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Connection>,
}

impl Deref for Pooled<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("present until dropped")
    }
}

impl DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("present until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            lock(&self.pool.idle).push(conn);
            self.pool.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pool() -> Pool {
        let conn = Connection::open_in_memory().expect("open");
        Pool::new(vec![conn], Wait::Writer)
    }

    #[test]
    fn a_held_connection_times_out_the_next_caller_then_comes_back() {
        let p = pool();
        let soon = Instant::now() + Duration::from_millis(50);
        let held = with_deadline(soon, || p.get()).expect("first caller gets it");
        let second = with_deadline(soon, || p.get().map(|_| ()));
        assert!(
            matches!(second, Err(StoreError::Timeout(Wait::Writer))),
            "{second:?}"
        );
        drop(held);
        let later = Instant::now() + Duration::from_secs(30);
        let again = with_deadline(later, || p.get().map(|c| c.is_autocommit()));
        assert!(again.expect("returned to the pool"));
    }

    #[test]
    fn the_deadline_is_restored_after_the_scope() {
        let inner = Instant::now() + Duration::from_secs(1);
        with_deadline(inner, || assert_eq!(DEADLINE.with(Cell::get), Some(inner)));
        assert_eq!(DEADLINE.with(Cell::get), None);
    }
}
