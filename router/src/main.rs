//! `agentmesh-router`: parses the flags, sets up logging and the runtime,
//! and runs [`agentmesh_router::cli::run`]. The flags are in
//! `agentmesh_router::cli` (`--help` lists them).

use agentmesh_router::cli::{Cli, DEFAULT_LOG_FILTER};
use anyhow::Context as _;
use clap::Parser as _;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // One line on an error, never a backtrace (see `exit_code`).
    agentmesh_runtime::exit_code("agentmesh-router", run(cli))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    agentmesh_runtime::block_on(async move {
        init_logs(cli.log.log_format);
        agentmesh_router::cli::run(cli).await
    })
    .context("building the async runtime")??;
    Ok(())
}

fn init_logs(format: agentmesh_runtime::logging::LogFormat) {
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(agentmesh_runtime::logging::layer(
            format,
            DEFAULT_LOG_FILTER,
        ))
        // Counts libp2p-relay's silent STOP-stream drops (its log is the
        // only trace of them).
        .with(agentmesh_router::relay_capacity_layer())
        .init();
}
