//! `agentmesh-hostile`: runs one attack of the harness against a running
//! mesh, bounded in count and duration, and prints what it did.

use clap::Parser as _;

/// The attacks, one subcommand each.
#[derive(Debug, clap::Parser)]
#[command(
    name = "agentmesh-hostile",
    about = "Dev-only hostile-peer harness: one bounded attack per run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// As an enrolled member, hold silent call streams to one provider
    /// through a relayed circuit, renewing them as they close.
    ProviderCalls(agentmesh_hostile::provider_calls::Args),
    /// As an enrolled member, hold as many circuits to one provider through
    /// a router as it lets you, dialing new ones as they close.
    ProviderCircuits(agentmesh_hostile::provider_circuits::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,libp2p=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::ProviderCalls(args) => {
            let r = args.run().await?;
            println!(
                "provider-calls opened={} open_failed={} closed_by_provider={} answered={} held_max={} circuits={}",
                r.opened, r.open_failed, r.closed_by_provider, r.answered, r.held_max, r.circuits
            );
        }
        Command::ProviderCircuits(args) => {
            let r = args.run().await?;
            println!(
                "provider-circuits dialed={} established={} denied={} held_max={}",
                r.dialed, r.established, r.denied, r.held_max
            );
        }
    }
    Ok(())
}
