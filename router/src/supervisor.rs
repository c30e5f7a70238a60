//! The supervisor: every long-lived task of the router is spawned through
//! [`Tasks`] under a name, and one task ([`supervise`]) joins them all.
//!
//! A task that ends or panics while the router is neither draining nor
//! shutting down leaves a half-dead router (a dead event loop still answers
//! `/readyz` otherwise). The supervisor logs which task stopped and why,
//! turns readiness false for good (`/readyz` says which task) and publishes
//! a [`TaskFailure`] on [`crate::RouterHandle::failed`]. It does not exit
//! the process: the owner of the handle decides (the binary shuts the router
//! down and exits non-zero; `agentmesh-one` and tests see the failure).
//! Task ends after cancellation or once a drain was requested are expected
//! and only logged at debug.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::{AbortHandle, Id, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::readiness::ReadinessState;

use agentmesh_runtime::supervise;
pub use agentmesh_runtime::supervise::TaskFailure;

/// The router's long-lived tasks, each under a name.
#[derive(Default)]
pub(crate) struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    aborts: Arc<Mutex<HashMap<&'static str, AbortHandle>>>,
}

impl Tasks {
    /// Spawns `fut` as the long-lived task `name`.
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        let abort = self.set.spawn(fut);
        self.names.insert(abort.id(), name);
        self.aborts.lock().insert(name, abort);
    }

    /// Abort handles by task name (the test hook
    /// [`crate::RouterHandle::stop_task_for_test`] uses them).
    pub(crate) fn aborts(&self) -> Arc<Mutex<HashMap<&'static str, AbortHandle>>> {
        self.aborts.clone()
    }
}

/// What the supervisor needs besides the tasks.
pub(crate) struct Supervisor {
    /// Cancelled by shutdown and at the end of a drain.
    pub(crate) cancel: CancellationToken,
    /// True once a drain was requested: task ends are expected afterwards.
    pub(crate) drain_requested: watch::Receiver<bool>,
    /// Turned false for good on a failure.
    pub(crate) readiness: Arc<ReadinessState>,
    /// Where the first failure is published.
    pub(crate) failed: watch::Sender<Option<TaskFailure>>,
}

/// Joins every task until none is left; reports the first one that stops
/// outside a drain or shutdown (see the module doc).
pub(crate) async fn supervise(mut tasks: Tasks, s: Supervisor) {
    while let Some(joined) = tasks.set.join_next_with_id().await {
        let (id, reason) = match joined {
            Ok((id, ())) => (id, "ended".to_string()),
            Err(e) => supervise::join_error(e),
        };
        let task = tasks.names.remove(&id).unwrap_or("unknown");
        tasks.aborts.lock().remove(task);
        let expected = s.cancel.is_cancelled() || *s.drain_requested.borrow();
        if expected {
            tracing::debug!(task, reason, "router task stopped");
            continue;
        }
        let failure = TaskFailure { task, reason };
        tracing::error!(task, reason = %failure.reason, "router task stopped outside a drain or shutdown; the router is no longer ready");
        s.readiness.update(|r| {
            if r.failed_task.is_none() {
                r.failed_task = Some(task);
            }
        });
        supervise::report_first(&s.failed, failure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    fn ready_state() -> Arc<ReadinessState> {
        let r = Arc::new(ReadinessState::new(Gauge::default()));
        r.update(|p| {
            p.listening = true;
            p.external_addr = true;
            p.keys = true;
            p.lease_accepted = true;
        });
        r
    }

    fn supervisor(readiness: &Arc<ReadinessState>) -> (Supervisor, watch::Sender<bool>) {
        let drain = watch::channel(false).0;
        let s = Supervisor {
            cancel: CancellationToken::new(),
            drain_requested: drain.subscribe(),
            readiness: readiness.clone(),
            failed: watch::channel(None).0,
        };
        (s, drain)
    }

    #[tokio::test]
    async fn a_panicking_task_is_named_and_unreadies_the_router() {
        let readiness = ready_state();
        let (s, _drain) = supervisor(&readiness);
        let mut failed = s.failed.subscribe();
        let cancel = s.cancel.clone();
        let mut tasks = Tasks::default();
        let c = cancel.clone();
        tasks.spawn("steady", async move { c.cancelled().await });
        tasks.spawn("boom", async { panic!("bad state") });
        let sup = tokio::spawn(supervise(tasks, s));
        failed.wait_for(Option::is_some).await.expect("failure");
        let f = failed.borrow().clone().expect("failure");
        assert_eq!(f.task, "boom");
        assert_eq!(f.reason, "panicked: bad state");
        assert!(!*readiness.watch().borrow());
        assert_eq!(
            readiness.get().reason().as_deref(),
            Some("router task boom stopped")
        );
        cancel.cancel();
        sup.await.expect("supervisor");
    }

    #[tokio::test]
    async fn ends_after_a_drain_or_shutdown_are_expected() {
        let readiness = ready_state();
        let (s, drain) = supervisor(&readiness);
        let failed = s.failed.subscribe();
        let cancel = s.cancel.clone();
        let mut tasks = Tasks::default();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("drained", async move {
            let _ = wait.await;
        });
        let c = cancel.clone();
        tasks.spawn("cancelled", async move { c.cancelled().await });
        let sup = tokio::spawn(supervise(tasks, s));
        drain.send_replace(true);
        go.send(()).expect("task waits");
        cancel.cancel();
        sup.await.expect("supervisor");
        assert!(failed.borrow().is_none());
        assert!(readiness.get().failed_task.is_none());
    }

    #[tokio::test]
    async fn an_aborted_task_is_reported() {
        let readiness = ready_state();
        let (s, _drain) = supervisor(&readiness);
        let mut failed = s.failed.subscribe();
        let mut tasks = Tasks::default();
        tasks.spawn("idle", std::future::pending());
        let aborts = tasks.aborts();
        let sup = tokio::spawn(supervise(tasks, s));
        aborts.lock().get("idle").expect("registered").abort();
        failed.wait_for(Option::is_some).await.expect("failure");
        assert_eq!(
            failed.borrow().clone(),
            Some(TaskFailure {
                task: "idle",
                reason: "aborted".into()
            })
        );
        sup.await.expect("supervisor");
    }
}
