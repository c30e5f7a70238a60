//! `agentmesh-node`: parses the command line, sets up logging and the
//! runtime, and runs the subcommand from `agentmesh_node::cli` (`run`
//! starts a member, `call NAME` pipes stdin/stdout to a service, `ping
//! NAME` reports route, round trip and verdict, `wait` waits until a node
//! is ready, `status` and `services` ask a running node).

use agentmesh_node::cli::{self, Cli, Command, StatusArgs};
use agentmesh_node::status::cmd::Ask;
use anyhow::Context as _;
use clap::Parser as _;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

fn main() -> std::process::ExitCode {
    // An expected error (a refused call, no node running, a bad flag
    // value) is one line, never a backtrace (see `exit_code`).
    agentmesh_runtime::exit_code("agentmesh-node", run(Cli::parse()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let log = cli.log;
    match cli.command {
        Command::Run(args) => agentmesh_runtime::block_on(async move {
            log.init(cli::DEFAULT_LOG_FILTER);
            cli::run(*args).await.map_err(anyhow::Error::from)
        }),
        Command::Call(args) => agentmesh_runtime::block_on_within(
            async move {
                log.init(cli::DEFAULT_LOG_FILTER);
                cli::call(args).await.map_err(anyhow::Error::from)
            },
            cli::CALL_EXIT_GRACE,
        ),
        Command::Ping(args) => agentmesh_runtime::block_on(async move {
            cli::ping(args, |line| {
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            })
            .await
            .map_err(anyhow::Error::from)
        }),
        Command::Wait(args) => {
            agentmesh_runtime::block_on(
                async move { args.wait().await.map_err(anyhow::Error::from) },
            )
        }
        Command::Status(args) => agentmesh_runtime::block_on(ask(args, Ask::Status)),
        Command::Services(args) => agentmesh_runtime::block_on(ask(args, Ask::Services)),
    }
    .context("building the async runtime")?
}

/// Prints the node's answer; an error is one line (see `main`).
async fn ask(args: StatusArgs, what: Ask) -> anyhow::Result<()> {
    let text = cli::ask(args, what).await?;
    print!("{text}");
    Ok(())
}
