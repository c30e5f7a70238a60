//! The node's configuration: data only, one field per flag of
//! `agentmesh-node run`, defaults defined once in [`Config::default`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use libp2p::PeerId;

/// Default number of routers to hold (K).
pub const DEFAULT_ROUTERS: usize = 2;
/// Default control-plane URL (the `agentmesh-one` gRPC port on loopback),
/// shared with the other programs' `--control-plane`.
pub const DEFAULT_CONTROL_PLANE: &str = agentmesh_runtime::cli::DEFAULT_CONTROL_PLANE;
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "agentmesh-node-data";
/// Default time a relayed connection to a peer stays open after the last
/// call on it (`--relayed-idle-secs`).
pub const DEFAULT_RELAYED_IDLE: Duration = Duration::from_secs(3);
/// Default `--directory-interval-secs`: 5 min. The poll was the path of
/// the policy and revocations once (then every 60 s); routers now push
/// both to attached members (`/agentmesh/policy/1`, and with each
/// admission), a credential signed by a key not yet known fetches the key
/// set at once, and a go-away names the alternatives, so the poll is only
/// the fallback for a missed push and the source of routers to choose
/// from. Safe while the interval plus its 20% jitter stays below the
/// control plane's `--key-publish-ahead-secs` (600 s): a new key is then
/// seen before it signs anything. `--directory-interval-secs 60` is the
/// old behaviour.
pub const DEFAULT_DIRECTORY_INTERVAL: Duration = Duration::from_secs(300);
/// Default `--ping-interval-secs`: the routers' own interval. Pings were
/// ≈ 40% of what an idle member costs on both sides at libp2p-ping's 15 s
/// (2,003 members, release, CPU-s per member-hour, member side / routers:
/// 0.21 / 0.16 at 15 s, 0.17 / 0.12 at 30 s, 0.13 / 0.10 at 60 s; see
/// ladder/RESULTS.md). The router's pings already keep a NAT's
/// mapping alive and free a dead member's connection; the member's find a
/// dead router, which it holds beside K − 1 others, in about 90 s.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Default `--ping-timeout-secs` (libp2p-ping's own default).
pub const DEFAULT_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Default inbound streams per protocol waiting for the node's accept loop
/// (`--stream-inbound-queue-per-protocol`): the streams crate's own default,
/// re-exported so it is defined once.
pub const DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL: usize =
    agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL;
/// Default `--max-policy-pushes-in-flight`.
pub const DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT: usize = 16;
/// Default opens waiting for a dial to one peer
/// (`--stream-max-pending-opens-per-peer`): the streams crate's default.
pub const DEFAULT_STREAM_MAX_PENDING_OPENS_PER_PEER: usize =
    agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER;
/// Default opens waiting for dials to all peers together
/// (`--stream-max-pending-opens-total`): the streams crate's default.
pub const DEFAULT_STREAM_MAX_PENDING_OPENS_TOTAL: usize =
    agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL;
/// Default inbound call streams whose request is still being read, all
/// callers together (`--max-inbound-call-requests`).
pub const DEFAULT_MAX_INBOUND_CALL_REQUESTS: usize = 128;
/// Default deadline of a call stream's first byte, milliseconds
/// (`--call-first-byte-timeout-ms`).
pub const DEFAULT_CALL_FIRST_BYTE_TIMEOUT_MS: u64 = 2000;
/// Default `--call-idle-timeout-secs`: 15 min. A call that moves no byte
/// either way for this long is ended. Sized for what services do over a
/// call, not for attacks: a dead caller's calls end when its connection is
/// found dead (pings: about 2 × `--ping-interval-secs` +
/// `--ping-timeout-secs`), and under contention the token share takes
/// idle calls' slots first, so the deadline is only the backstop for a
/// caller that is alive and silent. It sits above the quiet periods of
/// common long-lived calls: long-polls (10 min, the longest blocking
/// query of common service registries, plus their jitter), and pooled
/// database connections, whose pools close idle ones themselves after
/// 10 min by default. A service quiet for longer (a watch without
/// heartbeats, an interactive shell) raises it, or sets 0 for none.
pub const DEFAULT_CALL_IDLE_TIMEOUT_SECS: u64 = 900;
/// Default yamux streams open at once on one connection
/// (`--yamux-max-streams`): yamux's and libp2p-yamux's own default.
pub const DEFAULT_YAMUX_MAX_STREAMS: usize = 512;
/// Default receive window of one yamux connection, KiB
/// (`--yamux-connection-window-kib`): 256 KiB for each of
/// [`DEFAULT_YAMUX_MAX_STREAMS`] (what yamux guarantees every stream) plus
/// 16 MiB one fast stream may grow into (its bandwidth-delay product up to
/// 1 Gbit/s at 128 ms), against libp2p-yamux's fixed 1 GiB.
pub const DEFAULT_YAMUX_CONNECTION_WINDOW_KIB: u64 =
    DEFAULT_YAMUX_MAX_STREAMS as u64 * 256 + 16 * 1024;
/// Default buffer of each direction of a call's splice between its stream
/// and the local TCP connection (`--splice-buffer-kib`), KiB: tokio's own
/// default for `copy_bidirectional`.
pub const DEFAULT_SPLICE_BUFFER_KIB: usize = 8;
/// File name of the Unix socket inside the data dir.
pub const SOCKET_FILE: &str = "agentmesh.sock";
/// Least connect, exchange, RPC and idle timeout in force, whatever the
/// configuration says (a zero would fail every exchange at once).
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything `agentmesh-node run` can be told; every limit has a safe
/// default. Durations are `Duration`s: the command line converts its
/// `--*-secs` flags once (`crate::cli::RunArgs::into_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Control-plane gRPC URL (`--control-plane`).
    pub control_plane: String,
    /// PEM CA certificate for a TLS control plane (`--control-plane-ca`); `None`: system roots / plain on loopback.
    pub control_plane_ca: Option<PathBuf>,
    /// Enrollment token (the command line reads it from `--token-file`). Empty is fine
    /// while the data dir holds a credential that can still be refreshed.
    pub token: String,
    /// Data directory: key, credential, key set, Unix socket (`--data-dir`).
    pub data_dir: PathBuf,
    /// Routers to hold at once, K (`--routers`, default 2).
    pub routers: usize,
    /// Only routers carrying all these labels (`--router-selector k=v`, repeatable).
    pub router_selector: BTreeMap<String, String>,
    /// Routers carrying more of these labels first (`--router-prefer k=v`, repeatable).
    pub router_prefer: BTreeMap<String, String>,
    /// Local TCP backends served as services (`--expose NAME=HOST:PORT`, repeatable).
    pub expose: Vec<(String, SocketAddr)>,
    /// Local listeners forwarded to services (`--forward LISTEN_ADDR=NAME`, repeatable).
    pub forward: Vec<(SocketAddr, String)>,
    /// Who may call which exposed service (`--allow NAME=label:k=v|peer:ID|any`, repeatable).
    /// A service without rules accepts any admitted member of this mesh.
    pub allow: Vec<AllowRule>,
    /// HTTP listener for `/metrics` and `/readyz` (`--metrics-addr`); `None`: off.
    pub metrics_addr: Option<SocketAddr>,
    /// Unix socket path (`--socket-path`); `None`: `DATA_DIR/agentmesh.sock`.
    pub socket_path: Option<PathBuf>,
    /// Do not serve the Unix socket at all (`--no-socket`; embedded fleets set it).
    pub no_socket: bool,
    /// Outgoing TCP and QUIC connections leave from this local IP
    /// (`--dial-source-ip`, default none): one process can then hold more
    /// connections to a router than one address has ephemeral ports.
    pub dial_source_ip: Option<IpAddr>,
    /// Deadline for one control-plane RPC (`--rpc-timeout-secs`, default
    /// 10 s; less than 1 s acts as 1 s).
    pub rpc_timeout: Duration,
    /// Time budget of retries of one control-plane operation (`--retry-budget-secs`, default 180 s).
    pub retry_budget: Duration,
    /// How often the key set and router directory are re-read, ±20% jitter
    /// (`--directory-interval-secs`, default [`DEFAULT_DIRECTORY_INTERVAL`],
    /// 300 s; it was 60 s before routers pushed the policy).
    pub directory_interval: Duration,
    /// Longest random wait before replacing a router whose connection was
    /// lost while another router still serves us (`--router-replace-spread-ms`,
    /// default 5 s; 0: at once). A killed router's members all lose it in
    /// the same instant; drawn uniformly from 0 to this, their re-attaches
    /// reach the survivors spread over it instead of in one burst. A node
    /// left with no router replaces at once.
    pub router_replace_spread: Duration,
    /// Deadline to connect to a router or a provider (`--connect-timeout-secs`,
    /// default 10 s). Read through [`Config::connect_timeout()`], which
    /// floors it at 1 s.
    pub connect_timeout: Duration,
    /// Deadline for a request/response exchange: auth, catalog, call set-up
    /// (`--call-timeout-secs`, default 10 s). Read through
    /// [`Config::call_timeout()`], which floors it at 1 s. An outbound call
    /// as a whole returns within connect + call timeout
    /// ([`Config::call_budget`]).
    pub call_timeout: Duration,
    /// Providers tried per call before giving up, within the call's budget
    /// (`--call-attempts`, default 3).
    pub call_attempts: usize,
    /// Inbound calls served at once, all callers (`--max-inbound-calls`,
    /// default 256). Shared by the callers' enrollment tokens (the
    /// credential's `token_id`; the caller's PeerId without one), binding
    /// only when all are taken: one token may use every slot while others
    /// leave them free; once all are taken, a caller whose token holds
    /// fewer than the heaviest token takes that token's least recently
    /// active call (ended, `agentmesh_node_calls_ended_total{reason="preempted"}`),
    /// and one whose token holds its share is refused
    /// (`agentmesh_node_calls_total{direction="inbound",result="token_share"}`).
    pub max_inbound_calls: usize,
    /// Inbound calls served at once per caller PeerId
    /// (`--max-inbound-calls-per-caller`, default 32; refused as
    /// `too_many_calls`).
    pub max_inbound_calls_per_caller: usize,
    /// A call (inbound, or spliced by `--forward` or the Unix socket) that
    /// moves no byte in either direction for this long is ended and its
    /// local TCP connection closed
    /// (`--call-idle-timeout-secs`, default [`DEFAULT_CALL_IDLE_TIMEOUT_SECS`],
    /// 900 s; zero: no idle deadline). Counted in
    /// `agentmesh_node_calls_ended_total{reason="idle_timeout"}`. Whatever
    /// this says, a call ends when the connection carrying it closes.
    pub call_idle_timeout: Duration,
    /// Policy pushes from routers read at once (`--max-policy-pushes-in-flight`,
    /// default 16): a router pushes one per change, so more means a flood;
    /// the rest are dropped unread, `agentmesh_node_policy_pushes_total{result="overflow"}`.
    pub max_policy_pushes_in_flight: usize,
    /// Inbound call streams whose request is still being read, all callers
    /// together (`--max-inbound-call-requests`, default 128; 0 acts as 1).
    /// Held from the stream's arrival, shared by the caller's PeerId (the
    /// one its connection proved): a caller alone may hold all of them;
    /// when all are taken, a caller holding fewer than the heaviest takes
    /// that caller's oldest stream (closed, counted as `preempted`) and one
    /// holding its share is refused (`caller_share`), both in
    /// `agentmesh_node_calls_total{direction="inbound"}`. Calls in any phase
    /// are bounded by this plus `max_inbound_calls` (more: `overflow`).
    pub max_inbound_call_requests: usize,
    /// A call stream that sends no byte within this is closed and counted
    /// as `silent` (`--call-first-byte-timeout-ms`, default 2000; at least
    /// 1). Callers write their request at once; the whole request still
    /// has `call_timeout_secs`.
    pub call_first_byte_timeout_ms: u64,
    /// Forwarded local connections open at once across every `--forward`
    /// listener together (`--max-forward-connections`, default 256); the
    /// Unix socket has a bound of this size of its own. Connections over it
    /// wait in the listen backlog, counted in
    /// `agentmesh_node_local_connection_waits_total{listener}`.
    pub max_forward_connections: usize,
    /// Close connections (transit, finished circuits) idle this long
    /// (`--idle-connection-secs`, default 30 s; less than 1 s acts as 1 s).
    pub idle_connection: Duration,
    /// Close a relayed connection (a circuit through a router) to a peer
    /// this long after the last call with that peer ended
    /// (`--relayed-idle-secs`, default 3 s; zero: off, only
    /// `idle_connection` applies). Routers cap the circuits to one provider, and callers
    /// holding idle circuits would keep a popular provider at that cap. The
    /// calling side closes after this; the provider side after twice this
    /// (so it rarely closes under a caller that is about to reuse it).
    /// Counted in `agentmesh_node_relayed_idle_closed_total{direction}`.
    pub relayed_idle: Duration,
    /// Interval between pings on every connection (`--ping-interval-secs`,
    /// default 30 s; less than 1 s acts as 1 s). A connection whose pings
    /// fail twice in a row (libp2p-ping lets a first failure pass) is
    /// closed, so a router behind a dead link is replaced or redialed
    /// within about 2 × interval + timeout + 10 s (a new ping stream's
    /// negotiation timeout), not when TCP gives up many minutes later.
    pub ping_interval: Duration,
    /// How long a ping may go unanswered (`--ping-timeout-secs`, default
    /// 20 s; less than 1 s acts as 1 s).
    pub ping_timeout: Duration,
    /// Lifetime of published service records, in whole seconds; republished
    /// at a third of it, and no more often than every second
    /// (`--record-ttl-secs`, default 300 s).
    pub record_ttl: Duration,
    /// Grace for in-flight calls on shutdown (`--shutdown-grace-secs`, default 10 s).
    pub shutdown_grace: Duration,
    /// Clock skew tolerated when verifying callers' credentials, in whole
    /// seconds (`--credential-skew-secs`, default 60 s; zero: none).
    pub credential_skew: Duration,
    /// Negotiated inbound streams of one protocol (calls, go-aways) that may
    /// wait for the node's accept loop; more are dropped and counted in
    /// `agentmesh_streams_inbound_dropped_total{reason="queue_full"}`
    /// (`--stream-inbound-queue-per-protocol`, default 16; 0 acts as 1).
    pub stream_inbound_queue_per_protocol: usize,
    /// Stream opens (auth, catalog, call, ...) that may wait for a dial to
    /// one peer not yet connected; more are refused at once, so a loop
    /// toward an unreachable peer cannot queue without end, and counted in
    /// `agentmesh_streams_pending_opens_refused_total{limit="per_peer"}`
    /// (`--stream-max-pending-opens-per-peer`, default 64; 0 acts as 1).
    pub stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together; more are
    /// refused and counted with `limit="total"`
    /// (`--stream-max-pending-opens-total`, default 4096; 0 acts as 1).
    pub stream_max_pending_opens_total: usize,
    /// Streams open at once on one yamux connection (to a router or a
    /// relayed peer); yamux resets more (`--yamux-max-streams`, default 512).
    pub yamux_max_streams: usize,
    /// Receive window of one yamux connection, all its streams together,
    /// KiB: what a peer may make this node buffer on one connection; at
    /// least 256 KiB per stream (`--yamux-connection-window-kib`, default
    /// [`DEFAULT_YAMUX_CONNECTION_WINDOW_KIB`]).
    pub yamux_connection_window_kib: u64,
    /// Buffer of each direction of a call's splice (`--forward` and
    /// `--expose`) between the call's stream and the local TCP
    /// connection, KiB; two per live call (`--splice-buffer-kib`, default
    /// [`DEFAULT_SPLICE_BUFFER_KIB`]; 0 acts as 1). Larger buffers mean
    /// fewer reads and writes per byte moved.
    pub splice_buffer_kib: usize,
    /// Services with a `service` label of their own in
    /// `agentmesh_node_call_duration_seconds`, the `--forward` ones first;
    /// the rest are counted as `other` (`--max-call-metric-services`,
    /// default [`crate::metrics::DEFAULT_MAX_CALL_METRIC_SERVICES`]). Bounds
    /// the series a member exports however many names are called.
    pub max_call_metric_services: usize,
    /// Direct connections between members (`--direct`, `--listen-port`,
    /// `--listen-ip`): see [`DirectConfig`].
    pub direct: DirectConfig,
    /// Run the runtime stall watchdog and serve `agentmesh_runtime_stalls_total`
    /// on `metrics_addr`. One per process: the binary sets it; embedders
    /// running many nodes leave it off (default) and run their own.
    pub runtime_watchdog: bool,
}

/// Default longest random wait before replacing a lost router while
/// another still serves, milliseconds (see [`Config::router_replace_spread`]).
pub const DEFAULT_ROUTER_REPLACE_SPREAD_MS: u64 = 5_000;

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: DEFAULT_CONTROL_PLANE.to_string(),
            control_plane_ca: None,
            token: String::new(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            routers: DEFAULT_ROUTERS,
            router_selector: BTreeMap::new(),
            router_prefer: BTreeMap::new(),
            expose: Vec::new(),
            forward: Vec::new(),
            allow: Vec::new(),
            metrics_addr: None,
            socket_path: None,
            no_socket: false,
            dial_source_ip: None,
            rpc_timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(180),
            directory_interval: DEFAULT_DIRECTORY_INTERVAL,
            router_replace_spread: Duration::from_millis(DEFAULT_ROUTER_REPLACE_SPREAD_MS),
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(10),
            call_attempts: 3,
            max_inbound_calls: 256,
            max_inbound_calls_per_caller: 32,
            call_idle_timeout: Duration::from_secs(DEFAULT_CALL_IDLE_TIMEOUT_SECS),
            max_policy_pushes_in_flight: DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT,
            max_inbound_call_requests: DEFAULT_MAX_INBOUND_CALL_REQUESTS,
            call_first_byte_timeout_ms: DEFAULT_CALL_FIRST_BYTE_TIMEOUT_MS,
            max_forward_connections: 256,
            idle_connection: Duration::from_secs(30),
            relayed_idle: DEFAULT_RELAYED_IDLE,
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            record_ttl: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(10),
            credential_skew: Duration::from_secs(60),
            stream_inbound_queue_per_protocol: DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
            stream_max_pending_opens_per_peer: DEFAULT_STREAM_MAX_PENDING_OPENS_PER_PEER,
            stream_max_pending_opens_total: DEFAULT_STREAM_MAX_PENDING_OPENS_TOTAL,
            yamux_max_streams: DEFAULT_YAMUX_MAX_STREAMS,
            yamux_connection_window_kib: DEFAULT_YAMUX_CONNECTION_WINDOW_KIB,
            splice_buffer_kib: DEFAULT_SPLICE_BUFFER_KIB,
            max_call_metric_services: crate::metrics::DEFAULT_MAX_CALL_METRIC_SERVICES,
            direct: DirectConfig::default(),
            runtime_watchdog: false,
        }
    }
}

/// Direct connections between members (`docs/direct.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectConfig {
    /// Listen on one TCP port, dial every router and peer from it, learn
    /// the address routers observe, and upgrade relayed connections to
    /// direct ones by hole punching (`--direct`, default off: every call
    /// is relayed, the member listens on nothing).
    pub enabled: bool,
    /// The TCP port direct connections use, for listening and for every
    /// dial (`--listen-port`, default 0: a free port chosen at start).
    pub listen_port: u16,
    /// The address that port binds (`--listen-ip`, default `0.0.0.0`);
    /// with `--dial-source-ip`, dials leave from the source IP on that port.
    pub listen_ip: IpAddr,
    /// Pause before punching a peer again after its punch failed
    /// (`--punch-backoff-min-secs`, default 30 s), doubled per failure in
    /// a row up to `punch_backoff_max`, plus 0–50% jitter; skipped
    /// punches are counted as `skipped_backoff`.
    pub punch_backoff_min: Duration,
    /// Longest such pause (`--punch-backoff-max-secs`, default 900 s).
    pub punch_backoff_max: Duration,
    /// Inbound direct connections in their handshake at once
    /// (`--direct-max-pending-inbound`, default 64; 0 acts as 1); more
    /// are refused at accept, `inbound_refused_total{reason="pending_full"}`.
    pub max_pending_inbound: usize,
    /// The same from one source IP (`--direct-max-pending-inbound-per-source`,
    /// default 8; `reason="source_pending_full"`).
    pub max_pending_inbound_per_source: usize,
}

/// Default [`DirectConfig::punch_backoff_min`], seconds.
pub const DEFAULT_PUNCH_BACKOFF_MIN_SECS: u64 = 30;
/// Default [`DirectConfig::punch_backoff_max`], seconds.
pub const DEFAULT_PUNCH_BACKOFF_MAX_SECS: u64 = 900;
/// Default [`DirectConfig::max_pending_inbound`], connections.
pub const DEFAULT_DIRECT_MAX_PENDING_INBOUND: usize = 64;
/// Default [`DirectConfig::max_pending_inbound_per_source`], connections.
pub const DEFAULT_DIRECT_MAX_PENDING_INBOUND_PER_SOURCE: usize = 8;

impl Default for DirectConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen_port: 0,
            listen_ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            punch_backoff_min: Duration::from_secs(DEFAULT_PUNCH_BACKOFF_MIN_SECS),
            punch_backoff_max: Duration::from_secs(DEFAULT_PUNCH_BACKOFF_MAX_SECS),
            max_pending_inbound: DEFAULT_DIRECT_MAX_PENDING_INBOUND,
            max_pending_inbound_per_source: DEFAULT_DIRECT_MAX_PENDING_INBOUND_PER_SOURCE,
        }
    }
}

impl Config {
    /// The Unix socket path in force, `None` when the socket is off.
    pub fn effective_socket_path(&self) -> Option<PathBuf> {
        if self.no_socket {
            return None;
        }
        Some(
            self.socket_path
                .clone()
                .unwrap_or_else(|| self.data_dir.join(SOCKET_FILE)),
        )
    }

    /// The connect timeout in force: [`Config::connect_timeout`], at least 1 s.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.max(MIN_TIMEOUT)
    }

    /// The splice buffer per direction, bytes (at least 1 KiB).
    pub(crate) fn splice_buffer_bytes(&self) -> usize {
        self.splice_buffer_kib.clamp(1, 16 * 1024) * 1024
    }

    /// The exchange timeout in force: [`Config::call_timeout`], at least 1 s.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout.max(MIN_TIMEOUT)
    }

    /// The idle deadline of a spliced call, `None` when off (zero).
    pub(crate) fn call_idle_timeout(&self) -> Option<Duration> {
        (!self.call_idle_timeout.is_zero()).then_some(self.call_idle_timeout)
    }

    pub(crate) fn call_first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.call_first_byte_timeout_ms.max(1))
    }

    /// The most one outbound call's set-up takes, from `call()` to its
    /// stream or error: connect timeout + call timeout. The lookup, every
    /// connect, every provider attempt and every retry (up to 3 route
    /// retries, plus one lookup retry after an empty lookup) share it; each
    /// step's own timeout is cut to what is left of it.
    pub fn call_budget(&self) -> Duration {
        self.connect_timeout() + self.call_timeout()
    }
}

/// Who may call an exposed service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    /// The service the rule is for.
    pub service: String,
    /// What the caller must have.
    pub matcher: AllowMatcher,
}

/// One condition on a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowMatcher {
    /// Any admitted member.
    Any,
    /// The caller's credential carries label `key=value`.
    Label(String, String),
    /// The caller is this peer.
    Peer(PeerId),
}

impl AllowMatcher {
    /// Whether a caller with `peer` and `labels` matches.
    pub fn matches(&self, peer: &PeerId, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Any => true,
            Self::Label(k, v) => labels.get(k) == Some(v),
            Self::Peer(p) => p == peer,
        }
    }
}

impl FromStr for AllowRule {
    type Err = String;

    /// Parses `NAME=label:k=v`, `NAME=peer:PEERID` or `NAME=any`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (service, rule) = s
            .split_once('=')
            .ok_or_else(|| format!("allow rule {s:?} is not NAME=RULE"))?;
        if service.is_empty() {
            return Err(format!("allow rule {s:?} has an empty service name"));
        }
        let matcher = if rule == "any" {
            AllowMatcher::Any
        } else if let Some(label) = rule.strip_prefix("label:") {
            let (k, v) = agentmesh_proto::credential::parse_label(label)?;
            AllowMatcher::Label(k, v)
        } else if let Some(peer) = rule.strip_prefix("peer:") {
            AllowMatcher::Peer(
                peer.parse()
                    .map_err(|e| format!("allow rule {s:?}: bad PeerId: {e}"))?,
            )
        } else {
            return Err(format!(
                "allow rule {s:?}: expected label:k=v, peer:PEERID or any"
            ));
        };
        Ok(Self {
            service: service.to_string(),
            matcher,
        })
    }
}

/// Whether a caller may call `service` under `rules`: no rule for the
/// service means any admitted member; otherwise any one matching rule.
pub fn is_allowed(
    rules: &[AllowRule],
    service: &str,
    peer: &PeerId,
    labels: &BTreeMap<String, String>,
) -> bool {
    let mut any_rule = false;
    for r in rules.iter().filter(|r| r.service == service) {
        any_rule = true;
        if r.matcher.matches(peer, labels) {
            return true;
        }
    }
    !any_rule
}

/// Parses `NAME=HOST:PORT` (an `--expose` value).
pub fn parse_expose(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("expose {s:?} is not NAME=HOST:PORT"))?;
    if name.is_empty() {
        return Err(format!("expose {s:?} has an empty service name"));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("expose {s:?}: bad address: {e}"))?;
    Ok((name.to_string(), addr))
}

/// Parses `LISTEN_ADDR=NAME` (a `--forward` value).
pub fn parse_forward(s: &str) -> Result<(SocketAddr, String), String> {
    let (addr, name) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("forward {s:?} is not LISTEN_ADDR=NAME"))?;
    if name.is_empty() {
        return Err(format!("forward {s:?} has an empty service name"));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("forward {s:?}: bad address: {e}"))?;
    Ok((addr, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_rules_parse_and_match() {
        let peer = PeerId::random();
        let other = PeerId::random();
        let rules: Vec<AllowRule> = [
            "db=label:team=data".to_string(),
            format!("db=peer:{peer}"),
            "open=any".to_string(),
        ]
        .iter()
        .map(|s| s.parse().expect("valid rule"))
        .collect();
        let data: BTreeMap<_, _> = [("team".to_string(), "data".to_string())].into();
        let web: BTreeMap<_, _> = [("team".to_string(), "web".to_string())].into();
        // Label rule matches, other label does not, peer rule matches by id.
        assert!(is_allowed(&rules, "db", &other, &data));
        assert!(!is_allowed(&rules, "db", &other, &web));
        assert!(is_allowed(&rules, "db", &peer, &web));
        // Explicit any, and no rule at all, both admit everyone.
        assert!(is_allowed(&rules, "open", &other, &BTreeMap::new()));
        assert!(is_allowed(&rules, "echo", &other, &BTreeMap::new()));
    }

    #[test]
    fn bad_allow_rules_say_why() {
        for bad in [
            "db",
            "=any",
            "db=label:novalue",
            "db=peer:xyz",
            "db=group:x",
        ] {
            let err = bad.parse::<AllowRule>().expect_err(bad);
            assert!(err.contains(bad) || err.contains("key=value"), "{err}");
        }
    }

    #[test]
    fn expose_and_forward_parse() {
        assert_eq!(
            parse_expose("echo=127.0.0.1:8080"),
            Ok(("echo".to_string(), "127.0.0.1:8080".parse().expect("addr")))
        );
        assert!(parse_expose("echo").is_err());
        assert!(parse_expose("echo=nohost").is_err());
        assert_eq!(
            parse_forward("127.0.0.1:9000=echo"),
            Ok(("127.0.0.1:9000".parse().expect("addr"), "echo".to_string()))
        );
        assert!(parse_forward("127.0.0.1:9000=").is_err());
    }

    #[test]
    fn socket_path_defaults_into_the_data_dir() {
        let mut c = Config {
            data_dir: PathBuf::from("/d"),
            ..Config::default()
        };
        assert_eq!(
            c.effective_socket_path(),
            Some(PathBuf::from("/d/agentmesh.sock"))
        );
        c.no_socket = true;
        assert_eq!(c.effective_socket_path(), None);
    }
}
