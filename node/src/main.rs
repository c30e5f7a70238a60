//! `agentmesh-node run ...` runs a member; `agentmesh-node call NAME` pipes
//! stdin/stdout to a service through a running node's Unix socket;
//! `status` and `services` ask a running node what it holds and sees.

mod cli;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

use anyhow::Context as _;
use clap::Parser as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

/// Once `call` has its answer, how long tokio's blocking stdin read may
/// take to end before the process exits without it: that read ends only
/// with input or EOF, so with stdin left open it never would.
const CALL_EXIT_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::Run(args) => agentmesh_runtime::block_on(async move {
            init_logs();
            run(*args).await
        }),
        cli::Command::Call(args) => agentmesh_runtime::block_on_within(
            async move {
                init_logs();
                call(args).await
            },
            CALL_EXIT_GRACE,
        ),
        cli::Command::Status(args) => {
            agentmesh_runtime::block_on(ask(args, agentmesh_node::status_cmd::Ask::Status))
        }
        cli::Command::Services(args) => {
            agentmesh_runtime::block_on(ask(args, agentmesh_node::status_cmd::Ask::Services))
        }
    }
    .context("building the async runtime")?
}

/// `status` / `services`: prints the answer, or one line saying why not
/// (exit status 1, whatever `RUST_BACKTRACE` says).
async fn ask(args: cli::StatusArgs, what: agentmesh_node::status_cmd::Ask) -> anyhow::Result<()> {
    let limit = std::time::Duration::from_secs(args.timeout_secs.max(1));
    let socket = args.socket_path();
    match agentmesh_node::status_cmd::ask(&socket, &args.data_dir, what, args.json, limit).await {
        Ok(text) => {
            print!("{text}");
            Ok(())
        }
        Err(e) => {
            eprintln!("agentmesh-node: {e}");
            std::process::exit(1);
        }
    }
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,libp2p=warn".into()),
        )
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .init();
}

async fn run(args: cli::RunArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.pprof_addr {
        let bound = agentmesh_runtime::profiling::serve(addr).await?;
        tracing::info!(%bound, "profiles on /debug/pprof/profile and /debug/pprof/heap");
    }
    let config = args.into_config()?;
    let node = agentmesh_node::spawn(config, None).await?;
    tracing::info!(peer = %node.peer_id(), "node running");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = node.failed() => {
            // Exit so the supervisor restarts a node that can no longer attach.
            anyhow::bail!("node core failed: {why}");
        }
    }
    tracing::info!("stopping: withdrawing records, finishing calls");
    node.shutdown().await;
    Ok(())
}

async fn call(args: cli::CallArgs) -> anyhow::Result<()> {
    let path = args.socket_path();
    let conn = tokio::net::UnixStream::connect(&path)
        .await
        .with_context(|| format!("connect to the node's socket {}", path.display()))?;
    let (r, mut w) = conn.into_split();
    w.write_all(format!("CALL {}\n", args.name).as_bytes())
        .await?;
    let mut r = tokio::io::BufReader::new(r);
    let mut line = String::new();
    r.read_line(&mut line).await?;
    if line.trim_end() != "OK" {
        anyhow::bail!("call {} failed: {}", args.name, line.trim_end());
    }
    let up = async {
        tokio::io::copy(&mut tokio::io::stdin(), &mut w).await?;
        w.shutdown().await
    };
    let down = async {
        let mut out = tokio::io::stdout();
        tokio::io::copy(&mut r, &mut out).await?;
        out.flush().await
    };
    // The answer ends the call: once the service has closed its side and
    // the answer is on stdout, stop, whether or not stdin is still open
    // (`main` then leaves the blocked stdin read behind). A closed stdin
    // only half-closes the call.
    tokio::pin!(up, down);
    let down = tokio::select! {
        d = &mut down => d,
        _ = &mut up => down.await,
    };
    down?;
    Ok(())
}
