//! The watch over a node's long-lived tasks. A node is embedded thousands
//! of times per process (the ladder), so none of its tasks may end the
//! process; but a node one of whose tasks died must not look alive. Every
//! long-lived task (the engine, the inbound-call acceptor, each local
//! listener, the metrics server, the watchdog probe) runs under
//! [`Tasks::spawn`] with its name: when it ends or panics outside shutdown,
//! the node says so to its embedder: not ready, [`NodeStatus::failed`]
//! naming the task and why (`/readyz` prints it; the handle's `failed()`
//! resolves with it; the binary exits non-zero), an error in the log. The
//! first failure is kept; the node's other tasks go on (calls in flight
//! finish) until the embedder stops it.

use std::future::Future;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::status::NodeStatus;

/// Characters kept of a failure's text.
const MAX_FAILURE_CHARS: usize = 240;

/// A node's long-lived tasks, watched.
pub(crate) struct Tasks {
    set: JoinSet<()>,
    watch: Watch,
    span: tracing::Span,
}

/// What a watched task reports its end to.
#[derive(Clone)]
struct Watch {
    status: watch::Sender<NodeStatus>,
    shutdown: watch::Receiver<bool>,
    ready: Gauge,
}

impl Tasks {
    /// Tasks reporting to `status` (and the `ready` gauge), unless
    /// `shutdown` says the node is stopping; each runs inside `span`.
    pub(crate) fn new(
        status: watch::Sender<NodeStatus>,
        shutdown: watch::Receiver<bool>,
        ready: Gauge,
        span: tracing::Span,
    ) -> Self {
        Self {
            set: JoinSet::new(),
            watch: Watch {
                status,
                shutdown,
                ready,
            },
            span,
        }
    }

    /// Runs `task`, named `name`, until the node stops; its end or panic
    /// before then fails the node (see the module doc).
    pub(crate) fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let watch = self.watch.clone();
        self.set.spawn(
            async move {
                let end = catch_panic(task).await;
                if *watch.shutdown.borrow() {
                    return;
                }
                let why = match end {
                    Ok(()) => format!("task {name} ended"),
                    Err(panic) => format!("task {name} panicked: {panic}"),
                };
                tracing::error!(task = name, %why, "a long-lived task of the node ended outside shutdown: the node is not ready");
                watch.fail(why);
            }
            .instrument(self.span.clone()),
        );
    }

    /// Waits for every task to end.
    pub(crate) async fn join_all(&mut self) {
        while self.set.join_next().await.is_some() {}
    }

    /// Aborts every task and waits for them.
    pub(crate) async fn abort_all(&mut self) {
        self.set.abort_all();
        self.join_all().await;
    }
}

impl Watch {
    /// Marks the node failed (the first failure is kept) and not ready.
    fn fail(&self, why: String) {
        self.ready.set(0);
        self.status.send_modify(|s| {
            s.ready = false;
            if s.failed.is_none() {
                s.failed = Some(why.chars().take(MAX_FAILURE_CHARS).collect());
            }
        });
    }
}

/// `fresh`, a status the engine computed, keeping a failure `old` carries:
/// a failed node stays failed and not ready whatever its routers say.
pub(crate) fn keep_failure(mut fresh: NodeStatus, old: &NodeStatus) -> NodeStatus {
    if old.failed.is_some() {
        fresh.failed = old.failed.clone();
        fresh.ready = false;
    }
    fresh
}

/// Runs `fut`; a panic comes back as its message.
async fn catch_panic(fut: impl Future<Output = ()>) -> Result<(), String> {
    use futures::FutureExt as _;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(agentmesh_runtime::supervise::panic_text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_core_comes_back_as_its_message() {
        assert_eq!(catch_panic(async {}).await, Ok(()));
        let text = catch_panic(async { panic!("Relay connection exist") }).await;
        assert_eq!(text, Err("Relay connection exist".to_string()));
        let n = 3;
        let formatted = catch_panic(async move { panic!("slot {n} gone") }).await;
        assert_eq!(formatted, Err("slot 3 gone".to_string()));
    }

    #[test]
    fn a_failed_node_is_not_ready_and_readyz_names_the_panic() {
        let s = NodeStatus {
            failed: Some("Relay connection exist".into()),
            stopping: true,
            ..Default::default()
        };
        assert_eq!(
            s.readyz_line(),
            "not ready: failed: Relay connection exist\n"
        );
    }

    /// Tasks over a ready node's status, and the handles to watch it.
    fn tasks() -> (
        Tasks,
        watch::Receiver<NodeStatus>,
        watch::Sender<bool>,
        Gauge,
    ) {
        let (status, seen) = watch::channel(NodeStatus {
            ready: true,
            ..Default::default()
        });
        let (stop, shutdown) = watch::channel(false);
        let ready = Gauge::default();
        ready.set(1);
        let t = Tasks::new(status, shutdown, ready.clone(), tracing::Span::none());
        (t, seen, stop, ready)
    }

    #[tokio::test]
    async fn a_task_that_ends_outside_shutdown_fails_the_node_naming_it() {
        let (mut t, mut seen, _stop, ready) = tasks();
        t.spawn("forward", async {});
        t.join_all().await;
        let s = seen.wait_for(|s| s.failed.is_some()).await.expect("status");
        assert!(!s.ready);
        assert_eq!(s.failed.as_deref(), Some("task forward ended"));
        assert_eq!(s.readyz_line(), "not ready: failed: task forward ended\n");
        assert_eq!(ready.get(), 0);
    }

    #[tokio::test]
    async fn a_panicking_task_fails_the_node_with_its_message_and_the_first_failure_stays() {
        let (mut t, seen, _stop, _ready) = tasks();
        t.spawn("inbound_calls", async { panic!("accept loop gone") });
        t.join_all().await;
        t.spawn("metrics_http", async {});
        t.join_all().await;
        assert_eq!(
            seen.borrow().failed.as_deref(),
            Some("task inbound_calls panicked: accept loop gone")
        );
    }

    #[tokio::test]
    async fn tasks_ending_in_shutdown_fail_nothing() {
        let (mut t, seen, stop, ready) = tasks();
        stop.send(true).expect("shutdown");
        t.spawn("engine", async {});
        t.join_all().await;
        assert!(seen.borrow().failed.is_none());
        assert_eq!(ready.get(), 1);
    }

    #[test]
    fn the_engine_keeps_a_failure_when_it_recomputes_the_status() {
        let failed = NodeStatus {
            failed: Some("task socket ended".into()),
            ..Default::default()
        };
        let fresh = NodeStatus {
            ready: true,
            ..Default::default()
        };
        let kept = keep_failure(fresh.clone(), &failed);
        assert!(!kept.ready);
        assert_eq!(kept.failed, failed.failed);
        assert_eq!(keep_failure(fresh.clone(), &NodeStatus::default()), fresh);
    }
}
