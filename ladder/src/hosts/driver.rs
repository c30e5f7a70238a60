//! The coordinator inside a host of its own: a runtime whose threads all
//! live in the `ladder` host's namespace, so every socket the ladder opens
//! (gRPC to the control plane, `/readyz` and `/metrics` of every program)
//! crosses the testbed's network like an operator's would. The process's
//! main thread stays in the machine's own namespace, so removing the
//! testbed's namespaces never counts the ladder among their processes.

use std::future::Future;

use agentmesh_netns::Host;
use tokio::runtime::Runtime;
use tokio::task::AbortHandle;

use crate::error::{LadderError, Result};

/// A runtime inside one host, shut down when dropped.
pub struct Driver {
    host: Host,
    rt: Option<Runtime>,
}

/// Aborts a task when dropped: an interrupted run stops its coordinator
/// (whose children are killed on drop) instead of leaving it running.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Driver {
    /// A runtime on `host` with a worker thread per CPU (as the ladder's own).
    pub fn new(host: Host) -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = host.runtime(threads).map_err(testbed_error)?;
        Ok(Self { host, rt: Some(rt) })
    }

    /// Its host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Runs `fut` on the host's runtime until it finishes; dropping the
    /// returned future aborts it. A panic in `fut` is resumed here, so the
    /// caller unwinds (and its testbed is removed) as if it had panicked.
    pub async fn run<T, F>(&self, fut: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| LadderError::Process("the driver's runtime is gone".into()))?;
        let handle = rt.spawn(fut);
        let _abort = AbortOnDrop(handle.abort_handle());
        match handle.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(LadderError::Process(format!(
                "the coordinator on host {} stopped: {e}",
                self.host.name()
            ))),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // A runtime may not be dropped inside async code.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A testbed error as the ladder's: no namespaces here is a usage error.
pub fn testbed_error(e: agentmesh_netns::Error) -> LadderError {
    match e {
        agentmesh_netns::Error::Unavailable(why) => LadderError::Args(format!(
            "--hosts needs network namespaces, which are unavailable here: {why}"
        )),
        other => LadderError::Process(format!("building the hosts: {other}")),
    }
}
