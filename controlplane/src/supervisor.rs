//! The control plane's long-lived tasks and the one task that watches them.
//!
//! Every subsystem spawns its tasks into [`Tasks`] under a name. Once the
//! program is built, [`Tasks::supervise`] hands them to a supervisor that
//! joins them: a task that ends (returns, fails or panics) while no
//! shutdown was asked for leaves a half-dead process, so the supervisor
//! logs its name and why, and records a [`TaskFailure`]. The library stops
//! nothing else: `/readyz` turns not ready at once, and the embedding
//! program (the binary's `main`) learns of it through
//! [`crate::Handle::failed`] and decides to stop. The supervisor is the one
//! writer of the failure.

use std::{collections::HashMap, future::Future, pin::Pin};

use agentmesh_runtime::supervise;
use tokio::{
    sync::{mpsc, watch},
    task::{JoinHandle, JoinSet},
};

/// What a supervised task returns: `Err` says why it failed.
pub type TaskResult = Result<(), String>;

type BoxedTask = Pin<Box<dyn Future<Output = TaskResult> + Send + 'static>>;

/// Tasks added after start that the supervisor has not joined yet; a full
/// queue makes [`SupervisorHandle::add`] wait (it is only used at start).
const ADD_QUEUE: usize = 16;

pub use agentmesh_runtime::supervise::TaskFailure;

/// The named tasks of a control plane being built, with the stop signal
/// they all watch.
pub struct Tasks {
    set: JoinSet<TaskResult>,
    names: HashMap<tokio::task::Id, &'static str>,
    stop_tx: watch::Sender<bool>,
    failure_tx: watch::Sender<Option<TaskFailure>>,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl Default for Tasks {
    fn default() -> Self {
        Self::new()
    }
}

impl Tasks {
    /// No tasks yet; not stopping.
    pub fn new() -> Self {
        Self {
            set: JoinSet::new(),
            names: HashMap::new(),
            stop_tx: watch::channel(false).0,
            failure_tx: watch::channel(None).0,
        }
    }

    /// The stop signal: it turns `true` when a shutdown starts.
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop_tx.subscribe()
    }

    /// The failure the supervisor records (`None` while every task runs).
    pub fn failure(&self) -> watch::Receiver<Option<TaskFailure>> {
        self.failure_tx.subscribe()
    }

    /// Spawns `task` under `name`; it must run until the stop signal.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = TaskResult> + Send + 'static,
    {
        let id = self.set.spawn(task).id();
        self.names.insert(id, name);
    }

    /// Hands the tasks to a supervisor task; dropping the returned handle
    /// aborts the supervisor and with it every task.
    pub fn supervise(self) -> SupervisorHandle {
        let (add_tx, add_rx) = mpsc::channel(ADD_QUEUE);
        let stop_tx = self.stop_tx.clone();
        let failure = self.failure_tx.subscribe();
        let task = tokio::spawn(self.run(add_rx));
        SupervisorHandle {
            stop_tx,
            failure,
            add_tx,
            task,
        }
    }

    async fn run(mut self, mut add: mpsc::Receiver<(&'static str, BoxedTask)>) {
        let mut stop = self.stop_tx.subscribe();
        loop {
            if *stop.borrow() && self.set.is_empty() {
                return;
            }
            tokio::select! {
                biased;
                Some((name, task)) = add.recv() => self.spawn(name, task),
                Some(joined) = self.set.join_next_with_id() => self.joined(joined),
                // Nothing left to join: wait for more or the stop.
                _ = stop.changed(), if self.set.is_empty() => {}
            }
        }
    }

    fn joined(&mut self, joined: Result<(tokio::task::Id, TaskResult), tokio::task::JoinError>) {
        let (id, reason) = match joined {
            Ok((id, Ok(()))) => (id, "ended".to_string()),
            Ok((id, Err(e))) => (id, e),
            Err(e) => supervise::join_error(e),
        };
        let task = self.names.remove(&id).unwrap_or("unnamed");
        if *self.stop_tx.borrow() {
            tracing::debug!(task, %reason, "task stopped in shutdown");
            return;
        }
        tracing::error!(
            task,
            %reason,
            "a long-lived control-plane task stopped outside a shutdown; not ready from now on"
        );
        supervise::report_first(&self.failure_tx, TaskFailure { task, reason });
    }
}

/// The running supervisor: stop signal, failure, and a way to add tasks.
#[derive(Debug)]
pub struct SupervisorHandle {
    stop_tx: watch::Sender<bool>,
    failure: watch::Receiver<Option<TaskFailure>>,
    add_tx: mpsc::Sender<(&'static str, BoxedTask)>,
    task: JoinHandle<()>,
}

impl Drop for SupervisorHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SupervisorHandle {
    /// Supervises `task` under `name` like the program's own tasks.
    pub async fn add<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = TaskResult> + Send + 'static,
    {
        // The supervisor only ends after a stop; then the task is not needed.
        let _ = self.add_tx.send((name, Box::pin(task))).await;
    }

    /// The first task that stopped outside a shutdown, if any.
    pub fn failure(&self) -> Option<TaskFailure> {
        self.failure.borrow().clone()
    }

    /// Waits until a task stops outside a shutdown.
    pub async fn failed(&self) -> TaskFailure {
        let mut rx = self.failure.clone();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                // The supervisor is gone (aborted): never resolves.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Signals the stop, then waits up to `grace` for every task to end;
    /// past it the supervisor and every task are aborted. Returns whether
    /// they all ended in time.
    pub async fn stop(&mut self, grace: std::time::Duration) -> bool {
        let _ = self.stop_tx.send(true);
        match tokio::time::timeout(grace, &mut self.task).await {
            Ok(_) => true,
            Err(_) => {
                self.task.abort();
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn until_stopped(mut stop: watch::Receiver<bool>) -> TaskResult {
        let _ = stop.wait_for(|s| *s).await;
        Ok(())
    }

    #[tokio::test]
    async fn a_task_that_ends_outside_shutdown_is_reported_by_name() {
        let mut tasks = Tasks::new();
        tasks.spawn("steady", until_stopped(tasks.stop_signal()));
        tasks.spawn("short", async { Ok(()) });
        let mut sup = tasks.supervise();
        assert_eq!(sup.failure(), None);
        let f = sup.failed().await;
        assert_eq!(
            f,
            TaskFailure {
                task: "short",
                reason: "ended".into()
            }
        );
        assert!(
            sup.stop(Duration::from_secs(1)).await,
            "steady stops in time"
        );
    }

    #[tokio::test]
    async fn errors_and_panics_are_reported_with_their_reason() {
        let mut tasks = Tasks::new();
        tasks.spawn("failing", async { Err("listener closed".to_string()) });
        let sup = tasks.supervise();
        assert_eq!(sup.failed().await.reason, "listener closed");

        let tasks = Tasks::new();
        let sup = tasks.supervise();
        sup.add("panicking", async { panic!("boom") }).await;
        let f = sup.failed().await;
        assert_eq!((f.task, f.reason.as_str()), ("panicking", "panicked: boom"));
    }

    #[tokio::test]
    async fn tasks_ending_in_shutdown_are_no_failure() {
        let mut tasks = Tasks::new();
        tasks.spawn("a", until_stopped(tasks.stop_signal()));
        tasks.spawn("b", until_stopped(tasks.stop_signal()));
        let failure = tasks.failure();
        let mut sup = tasks.supervise();
        assert!(sup.stop(Duration::from_secs(30)).await);
        assert_eq!(*failure.borrow(), None);
    }

    #[tokio::test]
    async fn a_task_that_ignores_the_stop_is_aborted_after_the_grace() {
        let mut tasks = Tasks::new();
        tasks.spawn("stuck", std::future::pending());
        let mut sup = tasks.supervise();
        assert!(!sup.stop(Duration::from_millis(50)).await);
    }
}
