//! What `agentmesh-router` does with its flags: start the router, serve
//! until SIGINT, SIGTERM or `POST /drain`, drain, stop.

use agentmesh_runtime::cli::TokenFileError;
use agentmesh_runtime::profiling::ProfilingError;
use agentmesh_runtime::signals::StopSignals;

use super::Cli;
use crate::SpawnError;

/// Why the router binary stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `--token-file` could not be read.
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    /// `--pprof-addr` could not be served.
    #[error(transparent)]
    Profiling(#[from] ProfilingError),
    /// The router did not start.
    #[error("starting the router: {0}")]
    Spawn(#[from] SpawnError),
    /// A long-lived task stopped outside a drain or shutdown.
    #[error("router {0}")]
    TaskFailed(#[from] crate::TaskFailure),
    /// The signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(#[source] std::io::Error),
}

/// Runs the router the command line describes, with the process's stall
/// watchdog, until a signal or `POST /drain`; a drain then takes up to
/// `--drain-grace-secs`, and a second signal stops at once.
pub async fn run(cli: Cli) -> Result<(), RunError> {
    // Handlers first: a SIGTERM as soon as the address is logged must
    // still drain, not meet the signal's default action.
    let mut stop = StopSignals::install().map_err(RunError::Signal)?;
    let listeners = cli.args.listeners.clone();
    let stop_task = cli.test_stop_task_when_ready.clone();
    let mut config = cli.args.into_config()?;
    if let Some(bound) = listeners.serve_pprof().await? {
        tracing::info!(%bound, "profiles on /debug/pprof/profile and /debug/pprof/heap");
    }
    // The binary runs the process's one stall watchdog.
    config.runtime_watchdog = true;
    let router = crate::spawn(config).await?;
    tracing::info!(peer_id = %router.peer_id(), "running");
    if let Some(addr) = router.metrics_addr() {
        tracing::info!("metrics on http://{addr}");
    }
    let mut drained = router.drained();
    let mut failed = router.failed();
    if let Some(task) = stop_task {
        let mut ready = router.ready();
        let router = &router;
        if ready.wait_for(|r| *r).await.is_ok() && !router.stop_task_for_test(&task) {
            tracing::warn!(task, "--test-stop-task-when-ready: no such task");
        }
    }
    tokio::select! {
        _ = stop.recv() => router.drain(),
        _ = drained.wait_for(|d| *d) => {} // POST /drain
        f = failed.wait_for(Option::is_some) => {
            let failure = f.ok().and_then(|f| (*f).clone());
            router.shutdown().await;
            return match failure {
                Some(failure) => Err(failure.into()),
                None => Ok(()),
            };
        }
    }
    // Drain (go-away, grace, close); a second signal stops at once.
    tokio::select! {
        _ = drained.wait_for(|d| *d) => {}
        _ = stop.recv() => tracing::warn!("second signal: stopping without waiting"),
    }
    router.shutdown().await;
    Ok(())
}
