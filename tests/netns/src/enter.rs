//! A tokio runtime whose every thread lives in one network namespace, so
//! every socket a future or closure on it opens (connects, listeners, UDP,
//! a gRPC client's connections) is opened inside that namespace.
//!
//! A thread joins the namespace before it does any work (`setns` in
//! `on_thread_start`). A thread that cannot join aborts the process:
//! carrying on would open the socket in the machine's own network, which a
//! testbed must never use.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use nix::sched::{CloneFlags, setns};
use tokio::runtime::{Builder, Handle, Runtime};

use crate::error::Error;

/// Worker threads of one namespace's runtime: tests run little on it.
const WORKER_THREADS: usize = 1;
/// Blocking threads at most (connects and binds run there briefly).
const MAX_BLOCKING_THREADS: usize = 8;

/// A runtime inside one namespace; shut down in the background when dropped
/// (a runtime may not be dropped inside another's async context).
pub(crate) struct NsRuntime {
    rt: Option<Runtime>,
}

impl NsRuntime {
    /// A runtime whose threads join the namespace at `path` (`/run/netns/NAME`).
    pub(crate) fn start(path: &Path, name: &str) -> Result<Self, Error> {
        Ok(Self {
            rt: Some(runtime(path, name, WORKER_THREADS)?),
        })
    }

    /// Its handle.
    pub(crate) fn handle(&self) -> &Handle {
        self.rt.as_ref().expect("runtime until dropped").handle()
    }
}

/// A multi-threaded runtime of `worker_threads` whose every thread (workers
/// and blocking ones) joins the namespace at `path` before it runs anything.
pub(crate) fn runtime(path: &Path, name: &str, worker_threads: usize) -> Result<Runtime, Error> {
    let fd = Arc::new(
        File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?,
    );
    let ns = name.to_string();
    let thread_name: String = format!("ns-{name}").chars().take(15).collect();
    Builder::new_multi_thread()
        .worker_threads(worker_threads.max(1))
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name(thread_name)
        .enable_all()
        .on_thread_start(move || {
            if let Err(e) = setns(&*fd, CloneFlags::CLONE_NEWNET) {
                eprintln!(
                    "agentmesh-netns: a thread could not enter network namespace {ns} ({e}); \
                     aborting rather than use this machine's own network"
                );
                std::process::abort();
            }
        })
        .build()
        .map_err(|e| Error::io(format!("building the runtime of namespace {name}"), e))
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
