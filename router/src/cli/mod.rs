//! The command line of `agentmesh-router`: flat flags mapping one to one
//! onto [`Config`] fields, converted once into its sections by
//! [`RouterArgs::into_config`] (seconds and milliseconds become
//! `Duration`s); [`run`] is what the binary does with them.
//!
//! Flags shared with the node (control-plane client, listeners, stream
//! limits) come from `agentmesh_runtime::cli`; the resource flags from
//! [`crate::resource_config::ResourceArgs`]. Defaults are the `DEFAULT_*`
//! constants of [`crate::config`].

mod run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_runtime::cli::{ControlPlaneArgs, ListenerArgs, StreamLimitArgs, TokenFileError};
use clap::builder::RangedU64ValueParser;
use libp2p::Multiaddr;

use crate::config::{
    self as d, AuthConfig, CatalogConfig, Config, ConnectionConfig, ControlPlaneConfig,
    DrainConfig, PolicyConfig, RelayConfig, WatermarkConfig,
};
use crate::resource_config::ResourceArgs;

pub use run::{RunError, run};

/// Log filter when `RUST_LOG` is unset. libp2p-kad warns "Failed to trigger
/// bootstrap: No known peers" when a listen address appears before another
/// router is known, normal for a mesh of one router, so its behaviour
/// module logs errors only.
/// yamux warns when closing a connection whose socket the peer already
/// dropped (any peer can cause it at will; not rate-limited, nothing to act
/// on): errors only from it.
pub const DEFAULT_LOG_FILTER: &str = "info,libp2p_kad::behaviour=error,yamux::connection=error";

/// The parsed command line of `agentmesh-router`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "agentmesh-router",
    version = agentmesh_runtime::cli::VERSION,
    about = "agentmesh router: admits members, relays circuits, hosts the catalog"
)]
pub struct Cli {
    /// What the router runs with.
    #[command(flatten)]
    pub args: RouterArgs,
    /// Test hook (hidden from --help): once ready, abort the named long-lived task as a crash would, so the binary exits non-zero (default: none).
    #[arg(long, hide = true)]
    pub test_stop_task_when_ready: Option<String>,
    /// `--log-format`.
    #[command(flatten)]
    pub log: agentmesh_runtime::cli::LogArgs,
}

/// Every flag of the router, one per [`Config`] field (`--token-file` is
/// read into [`ControlPlaneConfig::token`]; `--pprof-addr` is the binary's
/// own).
#[derive(Debug, Clone, clap::Args)]
pub struct RouterArgs {
    /// Control plane, CA and token file.
    #[command(flatten)]
    pub control_plane: ControlPlaneArgs,
    /// Ed25519 identity key file, created (mode 0600) on first run.
    #[arg(long, default_value = d::DEFAULT_KEY_PATH)]
    pub key_path: PathBuf,
    /// Multiaddr to listen on, repeatable.
    #[arg(long, default_value = d::DEFAULT_LISTEN)]
    pub listen: Vec<Multiaddr>,
    /// Multiaddr members dial, repeatable; needed when listening on 0.0.0.0 or port 0 off loopback (default: none, the bound address).
    #[arg(long)]
    pub external_addr: Vec<Multiaddr>,
    /// Label k=v announced in the directory, repeatable; only labels the token allows (default: none).
    #[arg(long = "label", value_parser = agentmesh_proto::credential::parse_label)]
    pub labels: Vec<(String, String)>,
    /// Metrics and profiling listeners.
    #[command(flatten)]
    pub listeners: ListenerArgs,
    /// Time a connection has to be admitted before it is closed, seconds.
    #[arg(long, default_value_t = d::DEFAULT_AUTH_DEADLINE_SECS)]
    pub auth_deadline_secs: u64,
    /// Admitted members before go-away and trimming, members (default: sized from the memory budget, see --high-watermark-memory-percent).
    #[arg(long)]
    pub high_watermark: Option<u32>,
    /// Share of the memory budget the default high watermark fills with idle members, percent (1-100); the rest is headroom.
    #[arg(long, default_value_t = d::DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub high_watermark_memory_percent: u8,
    /// Trimming sheds down to this many members, members (default: 15% below the high watermark).
    #[arg(long)]
    pub low_watermark: Option<u32>,
    /// Longest drain (last lease, go-away DRAINING, members moving) before the router closes, seconds.
    #[arg(long, default_value_t = d::DEFAULT_DRAIN_GRACE_SECS)]
    pub drain_grace_secs: u64,
    /// Accept POST /drain on the metrics listener from any address, not only loopback (default: off); only where the listener is protected otherwise.
    #[arg(long)]
    pub drain_http_allow_remote: bool,
    /// Go-away streams open at once, streams.
    #[arg(long, default_value_t = d::DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS)]
    pub goaway_max_concurrent_streams: usize,
    /// How long a go-away asks members to stay away, seconds.
    #[arg(long, default_value_t = d::DEFAULT_GOAWAY_RETRY_AFTER_SECS)]
    pub goaway_retry_after_secs: u64,
    /// Policy push streams open at once, streams (agentmesh_router_policy_push_in_flight shows it bite).
    #[arg(long, default_value_t = d::DEFAULT_POLICY_PUSH_CONCURRENCY)]
    pub policy_push_concurrency: usize,
    /// Deadline of one policy push to one member (open, write, ack), milliseconds (outcome timeout when it bites).
    #[arg(long, default_value_t = d::DEFAULT_POLICY_PUSH_DEADLINE_MS)]
    pub policy_push_deadline_ms: u64,
    /// Deadline of one command to the swarm loop (admit, keys, revocations, regroup, router set, disconnects), milliseconds (agentmesh_router_state_commands_total{result=timeout} shows it bite).
    #[arg(long, default_value_t = d::DEFAULT_STATE_COMMAND_DEADLINE_MS)]
    pub state_command_deadline_ms: u64,
    /// Wait before probing the members that named this router a fallback for policy pushes (and pushing to those still lacking the version), milliseconds (agentmesh_router_policy_push_decisions_total{decision=fallback} shows it bite).
    #[arg(long, default_value_t = d::DEFAULT_POLICY_PUSH_FALLBACK_DELAY_MS)]
    pub policy_push_fallback_delay_ms: u64,
    /// Cap on the jittered backoff between control-plane Watch attempts, milliseconds (the directory poll covers the gap; agentmesh_router_policy_watch_up shows it).
    #[arg(long, default_value_t = d::DEFAULT_POLICY_WATCH_BACKOFF_MAX_MS)]
    pub policy_watch_backoff_max_ms: u64,
    /// Hold a Watch stream on the control plane for the policy, revocations and keys, true or false (false: the directory poll alone, e.g. behind a proxy that cuts long-lived streams). Default true.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub policy_watch: bool,
    /// Go-aways a drain or an overload trim sends per second per surviving router, members per second (0 = all at once); every member is still told within the grace.
    #[arg(long, default_value_t = d::DEFAULT_DRAIN_RATE_MEMBERS_PER_SEC)]
    pub drain_rate_members_per_sec: u32,
    /// Time from a trimmed member's go-away to closing its connection, seconds.
    #[arg(long, default_value_t = d::DEFAULT_TRIM_CLOSE_GRACE_SECS)]
    pub trim_close_grace_secs: u64,
    /// Relay reservations at most, reservations (default: the high watermark in effect).
    #[arg(long)]
    pub relay_max_reservations: Option<usize>,
    /// Relay reservations one peer may hold at once, reservations (at least 1).
    #[arg(
        long,
        default_value_t = d::DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub relay_max_reservations_per_peer: usize,
    /// Relay circuits at most in total, circuits.
    #[arg(long, default_value_t = d::DEFAULT_RELAY_MAX_CIRCUITS)]
    pub relay_max_circuits: usize,
    /// Relay circuits at most per peer, circuits.
    #[arg(long, default_value_t = d::DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER)]
    pub relay_max_circuits_per_peer: usize,
    /// Longest life of one circuit, seconds.
    #[arg(long, default_value_t = d::DEFAULT_RELAY_CIRCUIT_DURATION_SECS)]
    pub relay_circuit_duration_secs: u64,
    /// Bytes one circuit may carry, bytes (0: unlimited).
    #[arg(long, default_value_t = d::DEFAULT_RELAY_CIRCUIT_BYTES)]
    pub relay_circuit_bytes: u64,
    /// Life of one relay reservation (members renew before it ends), seconds.
    #[arg(long, default_value_t = d::DEFAULT_RELAY_RESERVATION_DURATION_SECS)]
    pub relay_reservation_duration_secs: u64,
    /// Time between leases, directory syncs and key syncs, seconds.
    #[arg(long, default_value_t = d::DEFAULT_LEASE_INTERVAL_SECS)]
    pub lease_interval_secs: u64,
    /// Clock difference allowed when checking credentials, seconds.
    #[arg(long, default_value_t = d::DEFAULT_CLOCK_SKEW_SECS)]
    pub clock_skew_secs: u64,
    /// Deadline of each read or write on an auth or catalog stream, seconds.
    #[arg(long, default_value_t = d::DEFAULT_STREAM_TIMEOUT_SECS)]
    pub stream_timeout_secs: u64,
    /// Time an auth stream of a peer not admitted has to send its first byte before it is closed and counted as a failed login of its source, milliseconds; an admitted member re-presenting its credential gets the whole stream timeout.
    #[arg(long, default_value_t = d::DEFAULT_AUTH_FIRST_BYTE_TIMEOUT_MS)]
    pub auth_first_byte_timeout_ms: u64,
    /// Streams refused on one connection a peer not yet admitted made to this router, streams; the next refusal closes the connection and counts as a failed login of its source (agentmesh_router_connections_closed_total{reason="refused_streams"}); members, and connections this router dialed, are never closed for this; 0 = no limit.
    #[arg(long, default_value_t = d::DEFAULT_STRANGER_REFUSED_STREAMS_MAX)]
    pub stranger_refused_streams_max: u32,
    /// Auth streams served at once, streams; shared fairly by source once all are taken, refusals counted in agentmesh_router_slots_refused_total{budget="auth"}.
    #[arg(long, default_value_t = d::DEFAULT_AUTH_MAX_INFLIGHT_STREAMS)]
    pub auth_max_inflight_streams: usize,
    /// Auth streams refused a slot that may wait for one, streams (0 = none wait: refused streams are dropped); shared fairly by source, agentmesh_router_slots_waits_total{budget="auth",outcome}.
    #[arg(long, default_value_t = d::DEFAULT_AUTH_QUEUE_MAX_STREAMS)]
    pub auth_queue_max_streams: usize,
    /// Longest wait of an auth stream for a slot before it is answered busy with a retry-after, milliseconds; keep it below the members' auth deadline (their call timeout, 10 s).
    #[arg(long, default_value_t = d::DEFAULT_AUTH_QUEUE_WAIT_MS)]
    pub auth_queue_wait_ms: u64,
    /// The retry-after a busy auth answer names, milliseconds (members add jitter).
    #[arg(long, default_value_t = d::DEFAULT_AUTH_BUSY_RETRY_AFTER_MS)]
    pub auth_busy_retry_after_ms: u64,
    /// Catalog streams served at once, streams; shared fairly by source once all are taken, none for peers not admitted (agentmesh_router_slots_refused_total{budget="catalog"}).
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS)]
    pub catalog_max_inflight_streams: usize,
    /// Member records the catalog holds at most, records.
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_RECORDS)]
    pub catalog_max_records: usize,
    /// Providers in one lookup answer at most, providers.
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_RESULTS)]
    pub catalog_max_results: usize,
    /// Time one member lookup may spend asking other routers, milliseconds; what arrived by then is answered (0: own records only).
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS)]
    pub catalog_remote_lookup_budget_ms: u64,
    /// How long a search's provider routers are reused by later lookups of the same service, milliseconds (0: never).
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_PROVIDER_CACHE_MS)]
    pub catalog_provider_cache_ms: u64,
    /// Connections with nothing keeping them alive close after this, seconds.
    #[arg(long, default_value_t = d::DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS)]
    pub idle_connection_timeout_secs: u64,
    /// Interval of the router's own pings on each connection, seconds; they find dead members (members ping their routers on their own interval).
    #[arg(long, default_value_t = d::DEFAULT_PING_INTERVAL_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_interval_secs: u64,
    /// A ping unanswered for this long closes its connection as dead, seconds (agentmesh_router_connections_closed_total{reason="ping_failed"}).
    #[arg(long, default_value_t = d::DEFAULT_PING_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub ping_timeout_secs: u64,
    /// Time budget of one control-plane call, retries included, seconds.
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS)]
    pub control_plane_retry_budget_secs: u64,
    /// Timeout of one control-plane RPC attempt, seconds.
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS)]
    pub control_plane_rpc_timeout_secs: u64,
    /// HTTP/2 keep-alive ping interval on control-plane connections while a call or the Watch is open, seconds; with the timeout, how long a half-open connection goes unnoticed at most (agentmesh_router_policy_watch_ends_total{reason="connection_lost"}).
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_KEEPALIVE_INTERVAL_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub control_plane_keepalive_interval_secs: u64,
    /// Time a control-plane keep-alive ping may go unanswered before the connection is closed and the Watch opened on another replica, seconds.
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_KEEPALIVE_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub control_plane_keepalive_timeout_secs: u64,
    /// Inbound queue and pending-open bounds of the streams behaviour.
    #[command(flatten)]
    pub streams: StreamLimitArgs,
    /// Memory, stream, circuit and per-source budgets.
    #[command(flatten)]
    pub resources: ResourceArgs,
}

impl RouterArgs {
    /// The [`Config`] these flags give, `--token-file` read into
    /// [`ControlPlaneConfig::token`]. The stall watchdog stays off: [`run`] turns it on.
    pub fn into_config(self) -> Result<Config, TokenFileError> {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let token = self.control_plane.read_token()?;
        Ok(Config {
            control_plane: ControlPlaneConfig {
                url: self.control_plane.control_plane,
                ca: self.control_plane.control_plane_ca,
                endpoints: self.control_plane.control_plane_endpoints,
                token,
                retry_budget: s(self.control_plane_retry_budget_secs),
                rpc_timeout: s(self.control_plane_rpc_timeout_secs),
                keepalive_interval: s(self.control_plane_keepalive_interval_secs),
                keepalive_timeout: s(self.control_plane_keepalive_timeout_secs),
                lease_interval: s(self.lease_interval_secs),
                clock_skew: s(self.clock_skew_secs),
            },
            key_path: self.key_path,
            listen: self.listen,
            external_addr: self.external_addr,
            labels: self.labels.into_iter().collect(),
            metrics_addr: self.listeners.metrics_addr,
            state_command_deadline: ms(self.state_command_deadline_ms.max(1)),
            auth: AuthConfig {
                deadline: s(self.auth_deadline_secs),
                first_byte_timeout: ms(self.auth_first_byte_timeout_ms),
                stranger_refused_streams_max: self.stranger_refused_streams_max,
                max_inflight_streams: self.auth_max_inflight_streams,
                queue_max_streams: self.auth_queue_max_streams,
                queue_wait: ms(self.auth_queue_wait_ms),
                busy_retry_after: ms(self.auth_busy_retry_after_ms),
            },
            watermarks: WatermarkConfig {
                high: self.high_watermark,
                high_memory_percent: self.high_watermark_memory_percent,
                low: self.low_watermark,
                trim_close_grace: s(self.trim_close_grace_secs),
            },
            drain: DrainConfig {
                grace: s(self.drain_grace_secs),
                http_allow_remote: self.drain_http_allow_remote,
                rate_members_per_sec: self.drain_rate_members_per_sec,
                goaway_max_concurrent_streams: self.goaway_max_concurrent_streams,
                goaway_retry_after: s(self.goaway_retry_after_secs),
            },
            policy: PolicyConfig {
                push_concurrency: self.policy_push_concurrency.max(1),
                push_deadline: ms(self.policy_push_deadline_ms.max(1)),
                push_fallback_delay: ms(self.policy_push_fallback_delay_ms),
                watch_backoff_max: ms(self.policy_watch_backoff_max_ms.max(1)),
                watch: self.policy_watch,
            },
            relay: RelayConfig {
                max_reservations: self.relay_max_reservations,
                max_reservations_per_peer: self.relay_max_reservations_per_peer,
                max_circuits: self.relay_max_circuits,
                max_circuits_per_peer: self.relay_max_circuits_per_peer,
                circuit_duration: s(self.relay_circuit_duration_secs),
                circuit_bytes: self.relay_circuit_bytes,
                reservation_duration: s(self.relay_reservation_duration_secs),
            },
            catalog: CatalogConfig {
                max_inflight_streams: self.catalog_max_inflight_streams,
                max_records: self.catalog_max_records,
                max_results: self.catalog_max_results,
                remote_lookup_budget: ms(self.catalog_remote_lookup_budget_ms),
                provider_cache: ms(self.catalog_provider_cache_ms),
            },
            connections: ConnectionConfig {
                idle_timeout: s(self.idle_connection_timeout_secs),
                ping_interval: s(self.ping_interval_secs),
                ping_timeout: s(self.ping_timeout_secs),
                stream_timeout: s(self.stream_timeout_secs),
                stream_inbound_queue_per_protocol: self.streams.stream_inbound_queue_per_protocol,
                stream_max_pending_opens_per_peer: self.streams.stream_max_pending_opens_per_peer,
                stream_max_pending_opens_total: self.streams.stream_max_pending_opens_total,
            },
            resources: self.resources.into_config(),
            runtime_watchdog: false,
        })
    }

    /// The profiling listener, if any (not part of [`Config`]: one per
    /// process, started by [`run`]).
    pub fn pprof_addr(&self) -> Option<SocketAddr> {
        self.listeners.pprof_addr
    }
}

#[cfg(test)]
mod tests;
