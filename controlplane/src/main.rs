//! `agentmesh-control-plane`: serve (default), `token create`, `backup`.
//! Flags are documented in `--help` and controlplane/README.md.

use agentmesh_controlplane::cli::Cli;
use clap::Parser;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

fn main() -> std::process::ExitCode {
    // One line on an error, never a backtrace (see `exit_code`).
    agentmesh_runtime::exit_code(
        "agentmesh-control-plane",
        agentmesh_runtime::block_on(async_main())
            .map_err(|e| anyhow::anyhow!("building the async runtime: {e}"))
            .and_then(|r| r),
    )
}

async fn async_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli.log.init("info");
    cli.run().await?;
    Ok(())
}
