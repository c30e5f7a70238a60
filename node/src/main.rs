//! `agentmesh-node`: parses the command line, sets up logging and the
//! runtime, and runs the subcommand from `agentmesh_node::cli` (`run`
//! starts a member, `call NAME` pipes stdin/stdout to a service).

use agentmesh_node::cli::{self, Cli, Command};
use anyhow::Context as _;
use clap::Parser as _;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => agentmesh_runtime::block_on(async move {
            init_logs();
            cli::run(*args).await.map_err(anyhow::Error::from)
        }),
        Command::Call(args) => agentmesh_runtime::block_on_within(
            async move {
                init_logs();
                cli::call(args).await.map_err(anyhow::Error::from)
            },
            cli::CALL_EXIT_GRACE,
        ),
    }
    .context("building the async runtime")?
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| cli::DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .init();
}
