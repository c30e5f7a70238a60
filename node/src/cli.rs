//! Command-line flags; `run`'s flags map one to one onto `Config` fields.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use agentmesh_node::config::{self, AllowRule, Config};
use anyhow::Context as _;

#[derive(Debug, clap::Parser)]
#[command(name = "agentmesh-node", version, about = "agentmesh member node")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Run a member node.
    Run(Box<RunArgs>),
    /// Pipe stdin/stdout to service NAME through a running node.
    Call(CallArgs),
    /// Show what a running node holds: routers and their state, readiness
    /// and why, credential expiry, services, recent calls.
    Status(StatusArgs),
    /// List the services a running node can see (exposed, forwarded,
    /// looked up).
    Services(StatusArgs),
}

fn label(s: &str) -> Result<(String, String), String> {
    agentmesh_proto::credential::parse_label(s)
}

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    #[arg(long, default_value = config::DEFAULT_CONTROL_PLANE)]
    control_plane: String,
    #[arg(long)]
    control_plane_ca: Option<PathBuf>,
    /// File holding the enrollment token (not needed while the data dir holds a valid credential).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    #[arg(long, default_value_t = Config::default().routers)]
    routers: usize,
    #[arg(long, value_parser = label)]
    router_selector: Vec<(String, String)>,
    #[arg(long, value_parser = label)]
    router_prefer: Vec<(String, String)>,
    #[arg(long, value_parser = config::parse_expose)]
    expose: Vec<(String, SocketAddr)>,
    #[arg(long, value_parser = config::parse_forward)]
    forward: Vec<(SocketAddr, String)>,
    #[arg(long)]
    allow: Vec<AllowRule>,
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Default: DATA_DIR/agentmesh.sock.
    #[arg(long)]
    socket_path: Option<PathBuf>,
    #[arg(long)]
    no_socket: bool,
    #[arg(long)]
    dial_source_ip: Option<IpAddr>,
    #[arg(long, default_value_t = Config::default().rpc_timeout_secs)]
    rpc_timeout_secs: u64,
    #[arg(long, default_value_t = Config::default().retry_budget_secs)]
    retry_budget_secs: u64,
    #[arg(long, default_value_t = Config::default().directory_interval_secs)]
    directory_interval_secs: u64,
    #[arg(long, default_value_t = Config::default().connect_timeout_secs)]
    connect_timeout_secs: u64,
    #[arg(long, default_value_t = Config::default().call_timeout_secs)]
    call_timeout_secs: u64,
    #[arg(long, default_value_t = Config::default().call_attempts)]
    call_attempts: usize,
    #[arg(long, default_value_t = Config::default().max_inbound_calls)]
    max_inbound_calls: usize,
    #[arg(long, default_value_t = Config::default().max_inbound_calls_per_caller)]
    max_inbound_calls_per_caller: usize,
    #[arg(long, default_value_t = Config::default().max_forward_connections)]
    max_forward_connections: usize,
    #[arg(long, default_value_t = Config::default().idle_connection_secs)]
    idle_connection_secs: u64,
    #[arg(long, default_value_t = Config::default().relayed_idle_secs)]
    relayed_idle_secs: u64,
    #[arg(long, default_value_t = Config::default().record_ttl_secs)]
    record_ttl_secs: u64,
    #[arg(long, default_value_t = Config::default().shutdown_grace_secs)]
    shutdown_grace_secs: u64,
    #[arg(long, default_value_t = Config::default().credential_skew_secs)]
    credential_skew_secs: u64,
    /// Inbound streams per protocol waiting for the accept loop (at least 1);
    /// more are dropped and counted in agentmesh_streams_inbound_dropped_total.
    #[arg(
        long,
        default_value_t = config::DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_inbound_queue_per_protocol: usize,
    /// Stream opens that may wait for a dial to one peer (at least 1); more
    /// are refused at once and counted in
    /// agentmesh_streams_pending_opens_refused_total{limit="per_peer"}.
    #[arg(
        long,
        default_value_t = config::DEFAULT_STREAM_MAX_PENDING_OPENS_PER_PEER,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together (at least
    /// 1); more are refused and counted with limit="total".
    #[arg(
        long,
        default_value_t = config::DEFAULT_STREAM_MAX_PENDING_OPENS_TOTAL,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_max_pending_opens_total: usize,
    /// Serve CPU and heap profiles here (binaries built with `--features pprof`).
    #[arg(long)]
    pub(crate) pprof_addr: Option<std::net::SocketAddr>,
}

impl RunArgs {
    pub(crate) fn into_config(self) -> anyhow::Result<Config> {
        let token = match &self.token_file {
            Some(p) => std::fs::read_to_string(p)
                .with_context(|| format!("read --token-file {}", p.display()))?
                .trim()
                .to_string(),
            None => String::new(),
        };
        Ok(Config {
            control_plane: self.control_plane,
            control_plane_ca: self.control_plane_ca,
            token,
            data_dir: self.data_dir,
            routers: self.routers,
            router_selector: self.router_selector.into_iter().collect(),
            router_prefer: self.router_prefer.into_iter().collect(),
            expose: self.expose,
            forward: self.forward,
            allow: self.allow,
            metrics_addr: self.metrics_addr,
            socket_path: self.socket_path,
            no_socket: self.no_socket,
            dial_source_ip: self.dial_source_ip,
            rpc_timeout_secs: self.rpc_timeout_secs,
            retry_budget_secs: self.retry_budget_secs,
            directory_interval_secs: self.directory_interval_secs,
            connect_timeout_secs: self.connect_timeout_secs,
            call_timeout_secs: self.call_timeout_secs,
            call_attempts: self.call_attempts,
            max_inbound_calls: self.max_inbound_calls,
            max_inbound_calls_per_caller: self.max_inbound_calls_per_caller,
            max_forward_connections: self.max_forward_connections,
            idle_connection_secs: self.idle_connection_secs,
            relayed_idle_secs: self.relayed_idle_secs,
            record_ttl_secs: self.record_ttl_secs,
            shutdown_grace_secs: self.shutdown_grace_secs,
            credential_skew_secs: self.credential_skew_secs,
            stream_inbound_queue_per_protocol: self.stream_inbound_queue_per_protocol,
            stream_max_pending_opens_per_peer: self.stream_max_pending_opens_per_peer,
            stream_max_pending_opens_total: self.stream_max_pending_opens_total,
            runtime_watchdog: true,
        })
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct CallArgs {
    /// The service to call.
    pub(crate) name: String,
    /// The node's socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    socket_path: Option<PathBuf>,
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
}

impl CallArgs {
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE))
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct StatusArgs {
    /// Print the node's JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// The node's socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    socket_path: Option<PathBuf>,
    /// The running node's data dir.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub(crate) data_dir: PathBuf,
    /// Longest wait for the node's answer, seconds.
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout_secs: u64,
}

impl StatusArgs {
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[test]
    fn no_flags_is_the_default_config() {
        let cli = Cli::try_parse_from(["agentmesh-node", "run"]).expect("parse");
        let Command::Run(args) = cli.command else {
            panic!("not run");
        };
        // The binary always runs the process's one stall watchdog; every
        // other field is the library default.
        let expected = Config {
            runtime_watchdog: true,
            ..Config::default()
        };
        assert_eq!(args.into_config().expect("config"), expected);
    }

    #[test]
    fn repeatable_flags_parse() {
        let cli = Cli::try_parse_from([
            "agentmesh-node",
            "run",
            "--router-selector",
            "region=eu",
            "--expose",
            "echo=127.0.0.1:7",
            "--allow",
            "echo=label:team=a",
            "--forward",
            "127.0.0.1:0=echo",
            "--dial-source-ip",
            "127.0.0.2",
        ])
        .expect("parse");
        let Command::Run(args) = cli.command else {
            panic!("not run");
        };
        let c = args.into_config().expect("config");
        assert_eq!(
            c.router_selector.get("region").map(String::as_str),
            Some("eu")
        );
        assert_eq!(c.expose.len(), 1);
        assert_eq!(c.allow.len(), 1);
        assert_eq!(c.forward[0].1, "echo");
        assert!(c.dial_source_ip.is_some());
        assert!(Cli::try_parse_from(["agentmesh-node", "run", "--expose", "bad"]).is_err());
    }

    #[test]
    fn stream_inbound_queue_flag_maps_and_refuses_zero() {
        let parse = |v: &str| {
            Cli::try_parse_from([
                "agentmesh-node",
                "run",
                "--stream-inbound-queue-per-protocol",
                v,
            ])
        };
        let Command::Run(args) = parse("3").expect("parse").command else {
            panic!("not run");
        };
        assert_eq!(
            args.into_config()
                .expect("config")
                .stream_inbound_queue_per_protocol,
            3
        );
        assert!(parse("0").is_err());
    }

    #[test]
    fn pending_open_flags_map_and_refuse_zero() {
        let parse = |flag: &str, v: &str| Cli::try_parse_from(["agentmesh-node", "run", flag, v]);
        let config = |flag: &str, v: &str| {
            let Command::Run(args) = parse(flag, v).expect("parse").command else {
                panic!("not run");
            };
            args.into_config().expect("config")
        };
        let c = config("--stream-max-pending-opens-per-peer", "5");
        assert_eq!(c.stream_max_pending_opens_per_peer, 5);
        let c = config("--stream-max-pending-opens-total", "7");
        assert_eq!(c.stream_max_pending_opens_total, 7);
        assert!(parse("--stream-max-pending-opens-per-peer", "0").is_err());
        assert!(parse("--stream-max-pending-opens-total", "0").is_err());
    }
}
