//! `agentmesh-hostile`: runs one attack of the hostile-peer harness against
//! a running mesh and prints what it did: its counts as text, or with
//! `--json` as one line of JSON (`agentmesh_hostile::summary`) for the
//! program that started it.
//!
//! One subcommand per attack; each attack module owns its `Args` and their
//! `run`, so adding an attack is one variant and one match arm here.

use std::{net::IpAddr, time::Duration};

use agentmesh_hostile::control_plane::{FloodConfig, FloodKind, flood};
use agentmesh_hostile::counts::Counted;
use agentmesh_hostile::summary::Summary;
use clap::Parser as _;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "agentmesh-hostile",
    version,
    about = "Dev-only hostile-peer harness: attacks on a router, the control plane or a provider"
)]
struct Cli {
    /// Print what the attack did as one line of JSON (attack name and counts).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Strangers holding a router's auth slots with stalling auth streams.
    RouterAuth(agentmesh_hostile::router_auth::Args),
    /// A stranger reopening streams the router refuses it, in a loop.
    RouterRefusedStreams(agentmesh_hostile::router_refused::Args),
    /// TCP connections from one address, as fast as the machine allows,
    /// that stall the noise handshake or never start it.
    HandshakeFlood(agentmesh_hostile::handshake_flood::Args),
    /// Floods the control plane's unauthenticated RPCs from one source address.
    ControlPlaneFlood(ControlPlaneFlood),
    /// As an enrolled member, hold silent call streams to one provider
    /// through a relayed circuit, renewing them as they close.
    ProviderCalls(agentmesh_hostile::provider_calls::Args),
    /// As several identities enrolled with one token, hold accepted calls
    /// to one provider's service silent, renewing them as they end.
    ProviderHeldCalls(agentmesh_hostile::held_calls::Args),
    /// As an enrolled member, hold as many circuits to one provider through
    /// a router as it lets you, dialing new ones as they close.
    ProviderCircuits(agentmesh_hostile::provider_circuits::Args),
    /// As an enrolled member, open policy push and go-away streams to
    /// another member over one circuit (it takes them only from its routers).
    MemberNoise(agentmesh_hostile::member_noise::Args),
}

#[derive(Debug, clap::Args)]
struct ControlPlaneFlood {
    /// The control plane's gRPC URL (also what bad enrollments' proofs sign).
    #[arg(long, default_value = "http://127.0.0.1:7400")]
    control_plane: String,
    /// Local address the attack's connections are bound to. Default 127.0.0.77.
    #[arg(long, default_value = "127.0.0.77")]
    source_addr: IpAddr,
    /// Requests per second, all connections together. Default 1000.
    #[arg(long, default_value_t = 1_000)]
    rate_per_sec: u32,
    /// How long to send, seconds. Default 30.
    #[arg(long, default_value_t = 30)]
    duration_secs: u64,
    /// Request kinds sent in turn, comma-separated: empty-refresh, garbage-refresh,
    /// empty-lease, bad-enroll, get-keys, get-directory. Default empty-refresh.
    #[arg(long, value_delimiter = ',', default_value = "empty-refresh", value_parser = parse_kind)]
    kinds: Vec<FloodKind>,
    /// HTTP/2 connections the requests are spread over. Default 2.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Requests in flight at most (more are skipped, not queued). Default 256.
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// Deadline of one request, milliseconds. Default 5000.
    #[arg(long, default_value_t = 5_000)]
    rpc_timeout_ms: u64,
}

impl ControlPlaneFlood {
    async fn run(self) -> anyhow::Result<agentmesh_hostile::control_plane::FloodReport> {
        let cfg = FloodConfig {
            url: self.control_plane,
            source: self.source_addr,
            rate_per_sec: self.rate_per_sec,
            duration: Duration::from_secs(self.duration_secs),
            kinds: self.kinds,
            connections: self.connections,
            max_in_flight: self.max_in_flight,
            rpc_timeout: Duration::from_millis(self.rpc_timeout_ms),
        };
        flood(cfg).await
    }
}

fn parse_kind(s: &str) -> Result<FloodKind, String> {
    FloodKind::parse(s).ok_or_else(|| {
        let names: Vec<&str> = FloodKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("unknown kind {s:?}; one of {}", names.join(", "))
    })
}

/// What an attack's report prints: `ATTACK name=value ...` and its summary.
fn text_and_counts(r: impl Counted) -> (String, Summary) {
    let summary = r.counts();
    (format!("{} {r}\n", summary.attack), summary)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (text, summary) = match cli.command {
        Command::RouterAuth(args) => text_and_counts(args.run().await?),
        Command::RouterRefusedStreams(args) => text_and_counts(args.run().await?),
        Command::HandshakeFlood(args) => text_and_counts(args.run().await?),
        Command::ControlPlaneFlood(args) => {
            let r = args.run().await?;
            (r.summary(), r.counts())
        }
        Command::ProviderCalls(args) => text_and_counts(args.run().await?),
        Command::ProviderHeldCalls(args) => text_and_counts(args.run().await?),
        Command::ProviderCircuits(args) => text_and_counts(args.run().await?),
        Command::MemberNoise(args) => text_and_counts(args.run().await?),
    };
    if cli.json {
        println!("{}", summary.to_json());
    } else {
        print!("{text}");
    }
    Ok(())
}
