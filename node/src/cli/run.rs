//! What `agentmesh-node run` does with its flags: start the node, serve
//! until SIGINT or SIGTERM, then stop gracefully.

use agentmesh_runtime::cli::TokenFileError;
use agentmesh_runtime::profiling::ProfilingError;
use agentmesh_runtime::signals::StopSignals;

use super::RunArgs;
use crate::SpawnError;

/// Why `agentmesh-node run` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `--token-file` could not be read.
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    /// `--pprof-addr` could not be served.
    #[error(transparent)]
    Profiling(#[from] ProfilingError),
    /// The node did not start.
    #[error("starting the node: {0}")]
    Spawn(#[from] SpawnError),
    /// The signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(#[source] std::io::Error),
    /// A long-lived task of the node ended or panicked (the failure names
    /// it); exiting non-zero lets a supervisor restart the node.
    #[error("node failed: {0}")]
    TaskFailed(String),
}

/// Runs the node `args` describe, with the process's stall watchdog, until
/// SIGINT or SIGTERM; then withdraws its records and finishes its calls
/// within `--shutdown-grace-secs`.
pub async fn run(args: RunArgs) -> Result<(), RunError> {
    // Handlers first: a SIGTERM as soon as the address is logged must
    // still withdraw the records, not meet the signal's default action.
    let mut stop = StopSignals::install().map_err(RunError::Signal)?;
    let listeners = args.listeners.clone();
    let mut config = args.into_config()?;
    if let Some(bound) = listeners.serve_pprof().await? {
        tracing::info!(%bound, "profiles on /debug/pprof/profile and /debug/pprof/heap");
    }
    // The binary runs the process's one stall watchdog.
    config.runtime_watchdog = true;
    let node = crate::spawn(config, None).await?;
    tracing::info!(peer = %node.peer_id(), "node running");
    if let Some(addr) = node.metrics_addr() {
        tracing::info!("metrics on http://{addr}");
    }
    tokio::select! {
        _ = stop.recv() => {}
        why = node.failed() => return Err(RunError::TaskFailed(why)),
    }
    tracing::info!("stopping: withdrawing records, finishing calls");
    node.shutdown().await;
    Ok(())
}
