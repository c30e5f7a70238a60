//! `agentmesh-one`: control plane + N routers (+ demo members) in one process.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_one::demo::{Demo, DemoConfig};
use agentmesh_runtime::signals::StopSignals;
use clap::Parser;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

/// A local mesh in one process: control plane, routers and, optionally,
/// demo members calling each other.
#[derive(Debug, Parser)]
#[command(name = "agentmesh-one", version = agentmesh_runtime::cli::VERSION)]
struct Args {
    /// Folder for the SQLite file, router keys, the member token and demo members.
    #[arg(long, default_value = "./agentmesh-data")]
    data_dir: PathBuf,
    /// Number of routers.
    #[arg(long, default_value_t = 2)]
    routers: usize,
    /// Demo members exposing echo and calling each other (0: none).
    #[arg(long, default_value_t = 0)]
    demo_members: usize,
    /// Average pause between one demo member's calls, milliseconds.
    #[arg(long, default_value_t = 1000)]
    demo_call_interval_ms: u64,
    /// Control plane gRPC address.
    #[arg(long, default_value = "127.0.0.1:7400")]
    grpc_addr: SocketAddr,
    /// Control plane HTTP address (/info, /metrics, /healthz, /readyz).
    #[arg(long, default_value = "127.0.0.1:7401")]
    http_addr: SocketAddr,
    /// First router's TCP port; router i uses base + i (0: any free port).
    #[arg(long, default_value_t = 7410)]
    router_base_port: u16,
    /// First router's metrics port; router i uses base + i (0: any free port).
    #[arg(long, default_value_t = 7420)]
    router_metrics_base_port: u16,
    /// Stop after this many seconds (0: run until SIGINT or SIGTERM; either drains the routers).
    #[arg(long, default_value_t = 0)]
    run_for_secs: u64,
    /// Policy file (TOML) the control plane applies at start (default: none, the built-in allow-all policy while the database holds none).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// `--log-format`.
    #[command(flatten)]
    log: agentmesh_runtime::cli::LogArgs,
}

fn main() -> std::process::ExitCode {
    // One line on an error, never a backtrace (see `exit_code`).
    agentmesh_runtime::exit_code(
        "agentmesh-one",
        agentmesh_runtime::block_on(async_main())
            .map_err(|e| anyhow::anyhow!("building the async runtime: {e}"))
            .and_then(|r| r),
    )
}

async fn async_main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.log
        .init("warn,agentmesh_one=info,libp2p_kad::behaviour=error,yamux::connection=error");
    // Registered once, first: a SIGINT or SIGTERM from here on drains the
    // mesh (see `agentmesh_runtime::signals`).
    let mut stop = StopSignals::install()?;
    let mesh = agentmesh_one::spawn(agentmesh_one::Config {
        data_dir: args.data_dir.clone(),
        routers: args.routers,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        router_base_port: args.router_base_port,
        router_metrics_base_port: args.router_metrics_base_port,
        policy: args.policy.clone(),
    })
    .await?;
    print!("{}", mesh.banner());

    let mut why = None;
    let demo = if args.demo_members > 0 {
        let config = DemoConfig {
            members: args.demo_members,
            control_plane: mesh.control_plane_url.clone(),
            token: mesh.member_token.clone(),
            data_dir: args.data_dir.join("demo"),
            call_interval: Duration::from_millis(args.demo_call_interval_ms.max(10)),
            routers: args.routers.min(2),
        };
        tokio::select! {
            d = Demo::start(config) => Some(d?),
            s = stop.recv() => { why = Some(s); None }
        }
    } else {
        None
    };
    let why = match why {
        Some(s) => s,
        None => run(&mut stop, demo.as_ref(), args.run_for_secs).await,
    };

    tracing::info!(
        why,
        "stopping: demo members first, then draining the routers"
    );
    if let Some(d) = demo {
        let s = d.stats();
        eprintln!("\nfinal: {s}");
        if let Some(e) = &s.last_error {
            eprintln!("last call error: {e}");
        }
        d.shutdown().await;
    }
    tokio::select! {
        n = mesh.drain(agentmesh_one::DRAIN_LIMIT) => {
            tracing::info!(drained = n, routers = mesh.routers.len(), "routers drained");
        }
        s = stop.recv() => tracing::warn!(signal = s, "second signal: stopping without waiting for the drain"),
    }
    mesh.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Shows the demo's progress every second until a stop signal or, with
/// `run_for_secs` > 0, until that time is up; says which.
async fn run(stop: &mut StopSignals, demo: Option<&Demo>, run_for_secs: u64) -> &'static str {
    let tty = std::io::stderr().is_terminal();
    let deadline =
        (run_for_secs > 0).then(|| tokio::time::Instant::now() + Duration::from_secs(run_for_secs));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            s = stop.recv() => return s,
            _ = tick.tick() => {}
        }
        n += 1;
        if let Some(d) = demo {
            let s = d.stats();
            if tty {
                eprint!("\r\x1b[2K{s}");
            } else if n.is_multiple_of(2) {
                eprintln!("{s}");
            }
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return "--run-for-secs elapsed";
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn every_flag_has_a_one_line_help_with_unit_and_default() {
        let problems = agentmesh_runtime::cli::help_problems(&super::Args::command());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
