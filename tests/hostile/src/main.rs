//! `agentmesh-hostile`: runs one attack of the hostile-peer harness against
//! a running mesh and prints what it did (one line of counts).
//!
//! One subcommand per attack; each attack module owns its `Args` and their
//! `run`, so adding an attack is one variant and one match arm here.

use clap::Parser as _;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "agentmesh-hostile",
    version,
    about = "Dev-only hostile-peer harness: attacks on a router, the control plane or a provider"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Strangers holding a router's auth slots with stalling auth streams.
    RouterAuth(agentmesh_hostile::router_auth::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let report = match Cli::parse().command {
        Command::RouterAuth(args) => args.run().await?,
    };
    println!("{report}");
    Ok(())
}
