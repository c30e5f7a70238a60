//! The command line of `agentmesh-node`: `run` starts a member, its flat
//! flags mapping one to one onto [`Config`] fields, sorted into its
//! sections once ([`RunArgs::into_config`]);
//! `call NAME` pipes stdin and stdout to a service through a running node's
//! Unix socket (after waiting for the node to be ready with
//! `--wait-ready-secs`); `ping NAME` sets up calls and reports their route,
//! round trip and verdict; `wait` waits until a node is ready; `status`
//! and `services` ask a running node what it holds and what it sees.
//!
//! Flags shared with the router (control-plane client, listeners, stream
//! limits) come from `agentmesh_runtime::cli`.

mod call;
mod ping;
mod run;
mod wait;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_runtime::cli::{ControlPlaneArgs, ListenerArgs, StreamLimitArgs, TokenFileError};

use crate::config::{self, AllowRule, Config};

pub use call::{CALL_EXIT_GRACE, CallError, call};
pub use ping::{PingError, ping};
pub use run::{RunError, run};
pub use wait::{WaitError, wait_ready};

/// Log filter when `RUST_LOG` is unset.
/// yamux warns when closing a connection whose socket the peer already
/// dropped (a race every shutdown and every vanished peer can cause; not
/// rate-limited, nothing to act on): errors only from it.
pub const DEFAULT_LOG_FILTER: &str = "info,libp2p=warn,yamux::connection=error";

/// The parsed command line of `agentmesh-node`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "agentmesh-node",
    version = agentmesh_runtime::cli::VERSION,
    about = "agentmesh member node"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// `--log-format`.
    #[command(flatten)]
    pub log: agentmesh_runtime::cli::LogArgs,
}

/// The subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run a member node.
    Run(Box<RunArgs>),
    /// Pipe stdin/stdout to service NAME through a running node.
    Call(CallArgs),
    /// Set up calls to service NAME and close them: route, round trip, verdict per attempt.
    Ping(PingArgs),
    /// Wait until a running node is ready (its socket answers /readyz 200).
    Wait(WaitArgs),
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

/// The flags of `run`, one per [`Config`] field (`--token-file` is read
/// into [`config::ControlPlaneConfig::token`]; `--pprof-addr` is the
/// binary's own).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Control plane, CA and token file.
    #[command(flatten)]
    pub control_plane: ControlPlaneArgs,
    /// Data directory: key, credential, key set, Unix socket.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Routers to hold at once (K), routers.
    #[arg(long, default_value_t = config::DEFAULT_ROUTERS)]
    pub routers: usize,
    /// Only routers carrying label k=v, repeatable (default: any router).
    #[arg(long, value_parser = label)]
    pub router_selector: Vec<(String, String)>,
    /// Routers carrying label k=v first, repeatable (default: no preference).
    #[arg(long, value_parser = label)]
    pub router_prefer: Vec<(String, String)>,
    /// Local TCP backend served as a service, NAME=HOST:PORT, repeatable (default: none).
    #[arg(long, value_parser = config::parse_expose)]
    pub expose: Vec<(String, SocketAddr)>,
    /// Local listener forwarded to a service, LISTEN_ADDR=NAME, repeatable (default: none).
    #[arg(long, value_parser = config::parse_forward)]
    pub forward: Vec<(SocketAddr, String)>,
    /// Who may call an exposed service, NAME=label:k=v|peer:ID|any, repeatable (default: any admitted member).
    #[arg(long)]
    pub allow: Vec<AllowRule>,
    /// Metrics and profiling listeners.
    #[command(flatten)]
    pub listeners: ListenerArgs,
    /// The node's Unix socket for `agentmesh-node call` (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// Serve no Unix socket at all (default: off, the socket is served).
    #[arg(long)]
    pub no_socket: bool,
    /// Local IP outgoing TCP and QUIC connections leave from (default: none, the system's choice).
    #[arg(long)]
    pub dial_source_ip: Option<IpAddr>,
    /// Deadline of one control-plane RPC, seconds.
    #[arg(long, default_value_t = Config::default().control_plane.rpc_timeout.as_secs())]
    pub rpc_timeout_secs: u64,
    /// Time budget of the retries of one control-plane operation, seconds.
    #[arg(long, default_value_t = Config::default().control_plane.retry_budget.as_secs())]
    pub retry_budget_secs: u64,
    /// How often the key set and router directory are re-read (±20% jitter), seconds.
    #[arg(long, default_value_t = Config::default().control_plane.directory_interval.as_secs())]
    pub directory_interval_secs: u64,
    /// Longest random wait before replacing a lost router while another still serves, milliseconds (spreads a killed router's members over the survivors; 0 = at once; a node left with no router replaces at once).
    #[arg(long, default_value_t = config::DEFAULT_ROUTER_REPLACE_SPREAD_MS)]
    pub router_replace_spread_ms: u64,
    /// Longest random wait, once a node that had lost every router (a whole mesh restarting) holds one again, before it attaches the other K - 1, milliseconds (until one serves it dials one router at a time; 0 = at once).
    #[arg(long, default_value_t = config::DEFAULT_ROUTER_REJOIN_SPREAD_MS)]
    pub router_rejoin_spread_ms: u64,
    /// Deadline to connect to a router or a provider, seconds.
    #[arg(long, default_value_t = Config::default().connect_timeout.as_secs())]
    pub connect_timeout_secs: u64,
    /// Deadline of one request/response exchange (auth, catalog, call set-up), seconds.
    #[arg(long, default_value_t = Config::default().call_timeout.as_secs())]
    pub call_timeout_secs: u64,
    /// Providers tried per call before giving up, within the call's budget, attempts.
    #[arg(long, default_value_t = Config::default().calls.attempts)]
    pub call_attempts: usize,
    /// Inbound calls served at once, all callers together, calls; shared by the callers' enrollment tokens once all are taken (a caller whose token holds fewer takes the heaviest token's idlest call).
    #[arg(long, default_value_t = Config::default().calls.max_inbound)]
    pub max_inbound_calls: usize,
    /// Inbound calls served at once per caller, calls.
    #[arg(long, default_value_t = Config::default().calls.max_inbound_per_caller)]
    pub max_inbound_calls_per_caller: usize,
    /// A call (inbound, --forward, the Unix socket) that moves no byte either way for this long is ended, seconds (0: no idle deadline; a call always ends with its connection).
    #[arg(long, default_value_t = config::DEFAULT_CALL_IDLE_TIMEOUT_SECS)]
    pub call_idle_timeout_secs: u64,
    /// Policy pushes from routers read at once; more are dropped unread (counted as overflow), pushes.
    #[arg(long, default_value_t = config::DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT)]
    pub max_policy_pushes_in_flight: usize,
    /// Inbound call streams still sending their request, all callers, shared fairly by caller PeerId when all are taken, streams.
    #[arg(long, default_value_t = config::DEFAULT_MAX_INBOUND_CALL_REQUESTS)]
    pub max_inbound_call_requests: usize,
    /// A call stream that sends no byte within this is closed (counted as silent), milliseconds.
    #[arg(long, default_value_t = config::DEFAULT_CALL_FIRST_BYTE_TIMEOUT_MS)]
    pub call_first_byte_timeout_ms: u64,
    /// Forwarded local connections open at once across every --forward listener, connections; more wait in the backlog.
    #[arg(long, default_value_t = Config::default().local.max_forward_connections)]
    pub max_forward_connections: usize,
    /// Connections (transit, finished circuits) idle this long are closed, seconds.
    #[arg(long, default_value_t = Config::default().connections.idle.as_secs())]
    pub idle_connection_secs: u64,
    /// A relayed connection closes this long after the last call with its peer (provider side: twice), seconds (0: off).
    #[arg(long, default_value_t = config::DEFAULT_RELAYED_IDLE.as_secs())]
    pub relayed_idle_secs: u64,
    /// Interval between pings on every connection, seconds; two failed pings in a row close it.
    #[arg(long, default_value_t = config::DEFAULT_PING_INTERVAL.as_secs())]
    pub ping_interval_secs: u64,
    /// How long a ping may go unanswered, seconds.
    #[arg(long, default_value_t = config::DEFAULT_PING_TIMEOUT.as_secs())]
    pub ping_timeout_secs: u64,
    /// Lifetime of published service records, republished at a third of it, seconds.
    #[arg(long, default_value_t = Config::default().services.record_ttl.as_secs())]
    pub record_ttl_secs: u64,
    /// Grace for calls in flight on shutdown, seconds.
    #[arg(long, default_value_t = Config::default().shutdown_grace.as_secs())]
    pub shutdown_grace_secs: u64,
    /// Clock skew tolerated when verifying callers' credentials, seconds.
    #[arg(long, default_value_t = Config::default().control_plane.credential_skew.as_secs())]
    pub credential_skew_secs: u64,
    /// Streams open at once on one yamux connection (to a router or a relayed peer), streams; yamux resets more.
    #[arg(long, default_value_t = config::DEFAULT_YAMUX_MAX_STREAMS)]
    pub yamux_max_streams: usize,
    /// Receive window of one yamux connection, all its streams together, KiB: what a peer may make this node buffer on it; at least 256 KiB × --yamux-max-streams.
    #[arg(long, default_value_t = config::DEFAULT_YAMUX_CONNECTION_WINDOW_KIB)]
    pub yamux_connection_window_kib: u64,
    /// Buffer of each direction of a call's splice between its stream and the local TCP connection (--forward, --expose), KiB; two per live call.
    #[arg(long, default_value_t = config::DEFAULT_SPLICE_BUFFER_KIB, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16384))]
    pub splice_buffer_kib: usize,
    /// Services given a label of their own in agentmesh_node_call_duration_seconds (the --forward ones first), services; the rest count as service="other".
    #[arg(long, default_value_t = crate::metrics::DEFAULT_MAX_CALL_METRIC_SERVICES)]
    pub max_call_metric_services: usize,
    /// Inbound queue and pending-open bounds of the streams behaviour.
    #[command(flatten)]
    pub streams: StreamLimitArgs,
    /// Direct connections between members.
    #[command(flatten)]
    pub direct: DirectArgs,
}

/// The flags of direct connections ([`config::DirectConfig`]).
#[derive(Debug, Clone, clap::Args)]
pub struct DirectArgs {
    /// Direct connections: listen on one TCP port, dial from it, learn the address routers observe and upgrade relayed connections by hole punching, true|false (default: true; false: every call relayed, nothing listens).
    #[arg(long, default_value_t = config::DirectConfig::default().enabled, action = clap::ArgAction::Set)]
    pub direct: bool,
    /// TCP port of direct connections, for listening and every dial, port (default: 0, any free port).
    #[arg(long, default_value_t = 0)]
    pub listen_port: u16,
    /// Address the direct-connection port binds (default: 0.0.0.0).
    #[arg(long, default_value = "0.0.0.0")]
    pub listen_ip: IpAddr,
    /// Pause before punching a peer again after its punch failed, doubled per failure up to --punch-backoff-max-secs, plus 0-50% jitter, seconds.
    #[arg(long, default_value_t = config::DEFAULT_PUNCH_BACKOFF_MIN_SECS)]
    pub punch_backoff_min_secs: u64,
    /// Longest pause between punches to one peer, seconds.
    #[arg(long, default_value_t = config::DEFAULT_PUNCH_BACKOFF_MAX_SECS)]
    pub punch_backoff_max_secs: u64,
    /// Inbound connections in their handshake on the direct-connection port at once, all sources together, connections; when all are taken a newcomer closes the least progressed handshake of the source holding most (or of its own, when it holds its fair share), or is refused at accept when its source holds none and every source holds its share.
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_MAX_PENDING_INBOUND)]
    pub direct_max_pending_inbound: usize,
    /// Inbound connections in their handshake on the direct-connection port at once from one source (an IPv4 address, an IPv6 /64), connections; a newcomer past it closes that source's least progressed handshake, so a flood of stalled connections sheds its own.
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_MAX_PENDING_INBOUND_PER_SOURCE)]
    pub direct_max_pending_inbound_per_source: usize,
    /// With --direct: how long written bytes may stay unacknowledged on a TCP connection before the kernel drops it (TCP_USER_TIMEOUT; a dead direct path fails its calls over to the relay), seconds (0: the kernel's default).
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_TCP_USER_TIMEOUT_SECS)]
    pub direct_tcp_user_timeout_secs: u64,
    /// How long a QUIC connection (to a router or a member) may hear nothing from its peer before it is closed (a dead direct path fails its calls over to the relay; keep-alives go every half of it, so a live idle path never reaches it), seconds (0: libp2p's 10 s; under 1 acts as 1).
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS)]
    pub direct_quic_idle_timeout_secs: u64,
    /// With --direct: how long a direct connection to a member may stay open before the peer's credential arrives on it and verifies; then it is closed (direct_closed_total{reason="unauthenticated"}), milliseconds.
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_AUTH_TIMEOUT_MS)]
    pub direct_auth_timeout_ms: u64,
    /// For tests and benches with every member on one host only: let punches dial loopback addresses, true|false (default: false; needs --direct=true; a peer could then make this node dial any port of its own host).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub direct_allow_loopback_targets: bool,
    /// With --direct: direct connections to members open at once, connections; past it relayed connections are not punched and inbound direct connections are refused (calls stay relayed).
    #[arg(long, default_value_t = config::DEFAULT_DIRECT_MAX_CONNECTIONS)]
    pub direct_max_connections: usize,
    /// With --direct: the transport of direct connections and of the router connections that show this member's NAT mapping, tcp|quic (default: tcp; quic listens on UDP --listen-port and dials routers over QUIC where they offer it).
    #[arg(long, value_enum, default_value_t = config::DirectTransport::Tcp)]
    pub direct_transport: config::DirectTransport,
}

impl From<DirectArgs> for config::DirectConfig {
    fn from(a: DirectArgs) -> Self {
        Self {
            enabled: a.direct,
            listen_port: a.listen_port,
            listen_ip: a.listen_ip,
            punch_backoff_min: Duration::from_secs(a.punch_backoff_min_secs),
            punch_backoff_max: Duration::from_secs(a.punch_backoff_max_secs),
            max_pending_inbound: a.direct_max_pending_inbound,
            max_pending_inbound_per_source: a.direct_max_pending_inbound_per_source,
            tcp_user_timeout: Duration::from_secs(a.direct_tcp_user_timeout_secs),
            quic_idle_timeout: Duration::from_secs(a.direct_quic_idle_timeout_secs),
            auth_timeout: Duration::from_millis(a.direct_auth_timeout_ms.max(1)),
            allow_loopback_targets: a.direct_allow_loopback_targets,
            transport: a.direct_transport,
            max_connections: a.direct_max_connections,
        }
    }
}

impl RunArgs {
    /// The [`Config`] these flags give, sorted into its sections,
    /// `--token-file` read into [`config::ControlPlaneConfig::token`] and
    /// each `--*-secs` flag made a `Duration` (the one place they are
    /// converted). The stall watchdog stays off: [`run`]
    /// turns it on.
    pub fn into_config(self) -> Result<Config, TokenFileError> {
        let token = self.control_plane.read_token()?;
        let s = Duration::from_secs;
        Ok(Config {
            control_plane: config::ControlPlaneConfig {
                url: self.control_plane.control_plane,
                ca: self.control_plane.control_plane_ca,
                endpoints: self.control_plane.control_plane_endpoints,
                token,
                rpc_timeout: s(self.rpc_timeout_secs),
                retry_budget: s(self.retry_budget_secs),
                directory_interval: s(self.directory_interval_secs),
                credential_skew: s(self.credential_skew_secs),
            },
            data_dir: self.data_dir,
            routers: config::RoutersConfig {
                count: self.routers,
                selector: self.router_selector.into_iter().collect(),
                prefer: self.router_prefer.into_iter().collect(),
                replace_spread: Duration::from_millis(self.router_replace_spread_ms),
                rejoin_spread: Duration::from_millis(self.router_rejoin_spread_ms),
                max_policy_pushes_in_flight: self.max_policy_pushes_in_flight,
            },
            services: config::ServicesConfig {
                expose: self.expose,
                allow: self.allow,
                record_ttl: s(self.record_ttl_secs),
            },
            local: config::LocalConfig {
                forward: self.forward,
                socket_path: self.socket_path,
                no_socket: self.no_socket,
                max_forward_connections: self.max_forward_connections,
            },
            metrics_addr: self.listeners.metrics_addr,
            connect_timeout: s(self.connect_timeout_secs),
            call_timeout: s(self.call_timeout_secs),
            calls: config::CallsConfig {
                attempts: self.call_attempts,
                max_inbound: self.max_inbound_calls,
                max_inbound_per_caller: self.max_inbound_calls_per_caller,
                max_inbound_requests: self.max_inbound_call_requests,
                first_byte_timeout_ms: self.call_first_byte_timeout_ms,
                idle_timeout: s(self.call_idle_timeout_secs),
                splice_buffer_kib: self.splice_buffer_kib,
                max_metric_services: self.max_call_metric_services,
            },
            shutdown_grace: s(self.shutdown_grace_secs),
            connections: config::ConnectionConfig {
                dial_source_ip: self.dial_source_ip,
                idle: s(self.idle_connection_secs),
                relayed_idle: s(self.relayed_idle_secs),
                ping_interval: s(self.ping_interval_secs),
                ping_timeout: s(self.ping_timeout_secs),
                stream_inbound_queue_per_protocol: self.streams.stream_inbound_queue_per_protocol,
                stream_max_pending_opens_per_peer: self.streams.stream_max_pending_opens_per_peer,
                stream_max_pending_opens_total: self.streams.stream_max_pending_opens_total,
                yamux_max_streams: self.yamux_max_streams,
                yamux_connection_window_kib: self.yamux_connection_window_kib,
            },
            direct: self.direct.into(),
            runtime_watchdog: false,
        })
    }
}

/// The flags of `call`.
#[derive(Debug, Clone, clap::Args)]
pub struct CallArgs {
    /// The service to call.
    pub name: String,
    /// The node's Unix socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// The running node's data directory, where its socket is.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Before calling, wait up to this long for the node's socket to exist and the node to be ready, seconds (default: no wait).
    #[arg(long, visible_alias = "wait-ready")]
    pub wait_ready_secs: Option<u64>,
}

impl CallArgs {
    /// The socket to connect to: `--socket-path`, else the data dir's.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE))
    }
}

/// The flags of `ping`.
#[derive(Debug, Clone, clap::Args)]
pub struct PingArgs {
    /// The service to ping.
    pub service: String,
    /// Attempts, pings.
    #[arg(long, default_value_t = 3)]
    pub count: u32,
    /// Pause between attempts, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Longest wait for one attempt's answer, milliseconds (above the node's call budget, connect + call timeout, 20 s by default).
    #[arg(long, default_value_t = 25_000)]
    pub timeout_ms: u64,
    /// Print each attempt as one JSON line instead of text (default: text).
    #[arg(long)]
    pub json: bool,
    /// The node's Unix socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// The running node's data directory, where its socket is.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

impl PingArgs {
    /// The socket to connect to: `--socket-path`, else the data dir's.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE))
    }
}

/// The flags of `wait`.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Longest wait for the node's socket to exist and the node to be ready, seconds.
    #[arg(long, default_value_t = 30)]
    pub timeout_secs: u64,
    /// The node's Unix socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// The running node's data directory, where its socket is.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

impl WaitArgs {
    /// Waits until the node is ready, at most `--timeout-secs`.
    pub async fn wait(&self) -> Result<(), WaitError> {
        let socket = self
            .socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE));
        wait_ready(
            &socket,
            &self.data_dir,
            Duration::from_secs(self.timeout_secs),
        )
        .await
    }
}

/// The flags of `status` and `services`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the node's answer as JSON instead of text (default: text).
    #[arg(long)]
    pub json: bool,
    /// The node's Unix socket (default: DATA_DIR/agentmesh.sock).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// The running node's data directory, where its socket is.
    #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Longest wait for the node's answer, seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout_secs: u64,
}

impl StatusArgs {
    /// The socket to connect to: `--socket-path`, else the data dir's.
    pub fn socket_path(&self) -> PathBuf {
        self.socket_path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(config::SOCKET_FILE))
    }
}

/// `status` / `services`: the running node's answer as text (or JSON), or
/// why there is none (no node at that data dir, a timeout, a bad answer).
pub async fn ask(
    args: StatusArgs,
    what: crate::status::cmd::Ask,
) -> Result<String, crate::status::cmd::StatusCmdError> {
    let limit = Duration::from_secs(args.timeout_secs.max(1));
    let socket = args.socket_path();
    crate::status::cmd::ask(&socket, &args.data_dir, what, args.json, limit).await
}

#[cfg(test)]
mod tests;
