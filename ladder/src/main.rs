//! `agentmesh-ladder`: the member ladder (see the library docs and issue 5).

use std::future::Future;
use std::pin::Pin;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use agentmesh_ladder::config::{FleetConfig, LocalConfig, RemoteConfig, WorkerConfig};

#[derive(Parser)]
#[command(
    name = "agentmesh-ladder",
    about = "Drive fleets of members in steps against a mesh and report"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Start a control plane and routers, then run the ladder against them.
    Local {
        #[command(flatten)]
        mesh: LocalConfig,
        #[command(flatten)]
        fleet: FleetConfig,
        #[command(flatten)]
        hosts: agentmesh_ladder::hosts::HostsConfig,
    },
    /// Run the fleet against an existing mesh.
    Remote {
        #[command(flatten)]
        mesh: RemoteConfig,
        #[command(flatten)]
        fleet: FleetConfig,
    },
    /// Start a control plane and routers on namespace hosts (needs root) and
    /// keep them up for `remote` runs on a member host, described in
    /// WORK_DIR/testbed.json, until SIGINT or SIGTERM.
    // The local mesh flags a testbed refuses are hidden from its help.
    #[command(
        mut_arg("restart_routers", |a| a.hide(true)),
        mut_arg("control_plane_db", |a| a.hide(true)),
        mut_arg("control_plane_store", |a| a.hide(true)),
        mut_arg("control_planes", |a| a.hide(true)),
        mut_arg("postgres_bin_dir", |a| a.hide(true)),
        mut_arg("cpu_quota", |a| a.help(
            "Cap the testbed and its mesh (control plane, routers; not the remote runs' \
             fleets) at this many CPU cores, e.g. 1.4, in a cgroup of its own created and \
             removed (cgroup v2 `cpu.max` or v1 CFS quota). Default: no cap"
        )),
    )]
    Testbed(agentmesh_ladder::hosts::testbed::TestbedConfig),
    /// Measure the data path side by side: plain TCP, bare libp2p (direct and
    /// through a relay circuit), agentmesh relayed calls (issue 19).
    Bench(agentmesh_ladder::bench::BenchConfig),
    /// Internal: one process of the bench (floor peer, backend, client).
    #[command(hide = true)]
    BenchPeer(agentmesh_ladder::bench::peer::PeerConfig),
    /// Internal: host members for a coordinator (JSON lines on stdin/stdout).
    #[command(hide = true)]
    Worker(WorkerConfig),
}

type Run = Pin<Box<dyn Future<Output = agentmesh_ladder::Result<agentmesh_ladder::Report>>>>;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    rt.block_on(async move {
        let (run, path) = match cli.mode {
            Mode::Worker(cfg) => return agentmesh_ladder::worker::run(cfg).await.context("worker"),
            Mode::BenchPeer(cfg) => return agentmesh_ladder::bench::peer::run(cfg).await,
            Mode::Bench(cfg) => return agentmesh_ladder::bench::main(cfg).await,
            // Handles SIGINT and SIGTERM itself: they are how it stops.
            Mode::Testbed(cfg) => {
                return agentmesh_ladder::hosts::testbed::run(cfg)
                    .await
                    .context("testbed");
            }
            Mode::Local { mesh, fleet, hosts } => {
                let path = fleet.report.clone();
                let run = agentmesh_ladder::hosts::run_local(hosts, mesh, fleet);
                (Box::pin(run) as Run, path)
            }
            Mode::Remote { mesh, fleet } => {
                let path = fleet.report.clone();
                (Box::pin(agentmesh_ladder::run_remote(mesh, fleet)) as Run, path)
            }
        };
        // On SIGINT/SIGTERM the run is dropped: every child (control plane,
        // routers, workers) is started with kill_on_drop, so none is left behind.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let report = tokio::select! {
            r = run => r?,
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; children stopped, no report"),
            _ = term.recv() => anyhow::bail!("terminated; children stopped, no report"),
        };
        println!("{}", report.markdown());
        if let Some(path) = path {
            let json = serde_json::to_string_pretty(&report).context("encoding the report")?;
            std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("ladder: report written to {}", path.display());
        }
        Ok(())
    })
}
