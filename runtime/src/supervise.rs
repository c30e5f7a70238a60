//! What the programs' supervisors share: how a long-lived task's end is
//! named and told, and that only the first failure is reported.
//!
//! Each program keeps its own supervisor, because each owns different
//! state around it (the control plane's stop signal, the router's drain and
//! readiness, the node's status for its embedder), but a task that stopped
//! reads the same in all three logs and exit messages.

use std::any::Any;

use tokio::sync::watch;
use tokio::task::{Id, JoinError};

/// A long-lived task that stopped outside a drain or shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// The task's name (`event_loop`, `grpc`, `reaper`, ...).
    pub task: &'static str,
    /// How it stopped: `ended`, `aborted`, `panicked: <message>`, or the
    /// error it returned.
    pub reason: String,
}

impl std::fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} stopped: {}", self.task, self.reason)
    }
}

impl std::error::Error for TaskFailure {}

/// The text of a panic's payload (`panic!` with a literal or a format).
pub fn panic_text(payload: Box<dyn Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic payload".to_string())
}

/// The task and why it stopped, for a join that did not return a value:
/// `panicked: <message>` or `aborted`.
pub fn join_error(e: JoinError) -> (Id, String) {
    let id = e.id();
    if e.is_panic() {
        (id, format!("panicked: {}", panic_text(e.into_panic())))
    } else {
        (id, "aborted".to_string())
    }
}

/// Publishes `failure` unless one was published already: the first
/// failure is the one reported, later ones are only logged. Returns
/// whether this one was published.
pub fn report_first(to: &watch::Sender<Option<TaskFailure>>, failure: TaskFailure) -> bool {
    to.send_if_modified(|f| {
        if f.is_some() {
            return false;
        }
        *f = Some(failure);
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn panics_and_aborts_are_told_apart() {
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async { panic!("slot {} gone", 3) });
        let (_, why) = join_error(
            set.join_next()
                .await
                .expect("a task")
                .expect_err("did not return"),
        );
        assert_eq!(why, "panicked: slot 3 gone");
        set.spawn(std::future::pending::<()>()).abort();
        let (_, why) = join_error(
            set.join_next()
                .await
                .expect("a task")
                .expect_err("did not return"),
        );
        assert_eq!(why, "aborted");
    }

    #[test]
    fn only_the_first_failure_is_reported() {
        let (tx, rx) = watch::channel(None);
        let f = |task| TaskFailure {
            task,
            reason: "ended".into(),
        };
        assert!(report_first(&tx, f("a")));
        assert!(!report_first(&tx, f("b")));
        assert_eq!(rx.borrow().as_ref().map(|f| f.task), Some("a"));
        assert_eq!(f("a").to_string(), "task a stopped: ended");
    }
}
