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
        init_logs();
        agentmesh_router::cli::run(cli).await
    })
    .context("building the async runtime")??;
    Ok(())
}

fn init_logs() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .log_internal_errors(false)
                .with_filter(filter),
        )
        // Counts libp2p-relay's silent STOP-stream drops (its log is the
        // only trace of them).
        .with(agentmesh_router::relay_capacity_layer())
        .init();
}
