//! The router's configuration: data only, one field per command-line flag.
//!
//! Every default is defined once, here, as a named constant; `main.rs` maps
//! flags 1:1 onto these fields and a test checks that no flags yields
//! [`Config::default`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use libp2p::Multiaddr;

/// Default control-plane URL (the `agentmesh-one` gRPC port).
pub const DEFAULT_CONTROL_PLANE: &str = "http://127.0.0.1:7400";
/// Default key file.
pub const DEFAULT_KEY_PATH: &str = "router.key";
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "/ip4/0.0.0.0/tcp/4001";
/// Connections not admitted within this many seconds are closed.
pub const DEFAULT_AUTH_DEADLINE_SECS: u64 = 10;
/// Default high watermark: admitted members the router aims to hold at most.
pub const DEFAULT_HIGH_WATERMARK: u32 = 1000;
/// Default time a drain may take before the router closes, seconds (below
/// the manifests' terminationGracePeriodSeconds).
pub const DEFAULT_DRAIN_GRACE_SECS: u64 = 30;
/// Default go-away streams open at once.
pub const DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS: usize = 64;
/// Default `retry_after` a go-away asks for, seconds.
pub const DEFAULT_GOAWAY_RETRY_AFTER_SECS: u64 = 300;
/// Default grace between go-away OVERLOADED and closing a trimmed member, seconds.
pub const DEFAULT_TRIM_CLOSE_GRACE_SECS: u64 = 10;
/// Default relay circuits per peer.
pub const DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER: usize = 1024;
/// Default relay circuits in total.
pub const DEFAULT_RELAY_MAX_CIRCUITS: usize = 16 * 1024;
/// Default circuit lifetime: one hour.
pub const DEFAULT_RELAY_CIRCUIT_DURATION_SECS: u64 = 3600;
/// Default bytes per circuit: 0 means unlimited.
pub const DEFAULT_RELAY_CIRCUIT_BYTES: u64 = 0;
/// Default reservation lifetime (members renew before it ends).
pub const DEFAULT_RELAY_RESERVATION_DURATION_SECS: u64 = 3600;
/// Default seconds between leases (and directory/key syncs).
pub const DEFAULT_LEASE_INTERVAL_SECS: u64 = 15;
/// Default allowed clock difference when checking credentials.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// Default deadline for each read/write on one of our streams.
pub const DEFAULT_STREAM_TIMEOUT_SECS: u64 = 10;
/// Default bound on concurrently served auth streams.
pub const DEFAULT_AUTH_MAX_INFLIGHT_STREAMS: usize = 256;
/// Default bound on concurrently served catalog streams.
pub const DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS: usize = 256;
/// Default cap on records the router holds for its members.
pub const DEFAULT_CATALOG_MAX_RECORDS: usize = 10_000;
/// Default cap on providers in one lookup answer.
pub const DEFAULT_CATALOG_MAX_RESULTS: usize = 64;
/// Default idle connection timeout.
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS: u64 = 120;
/// Default total time budget of one control-plane call including retries.
pub const DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS: u64 = 30;
/// Default timeout of one control-plane RPC attempt.
pub const DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS: u64 = 10;

/// Everything a router needs to start. Data only; see `spawn`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Control-plane gRPC URL. Default `http://127.0.0.1:7400`.
    pub control_plane: String,
    /// PEM file of the CA that signs the control plane's TLS certificate. Default none.
    pub control_plane_ca: Option<PathBuf>,
    /// The router-role enrollment token (main reads `--token-file` into it). Default empty.
    pub token: String,
    /// Ed25519 identity key file, created (mode 0600) on first run. Default `router.key`.
    pub key_path: PathBuf,
    /// Multiaddrs to listen on (TCP). Default `/ip4/0.0.0.0/tcp/4001`.
    pub listen: Vec<Multiaddr>,
    /// Addresses members dial; required when listening on 0.0.0.0 or port 0 off
    /// loopback, otherwise derived from the bound address. Default none.
    pub external_addr: Vec<Multiaddr>,
    /// Labels announced in the directory (`k=v`; only labels the token allows). Default none.
    pub labels: BTreeMap<String, String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. Default none (off).
    pub metrics_addr: Option<SocketAddr>,
    /// Connections not admitted within this time are closed. Default 10 s.
    pub auth_deadline: Duration,
    /// Admitted members the router aims to hold: above it the router trims
    /// and answers new members with go-away. Default 1000.
    pub high_watermark: u32,
    /// Trimming sheds down to this many members; `None` = 15% below the high
    /// watermark. Default none.
    pub low_watermark: Option<u32>,
    /// A drain (last lease, go-away DRAINING, members moving) takes at most
    /// this long before the router closes; keep it below the pod's
    /// termination grace. Default 30 s.
    pub drain_grace: Duration,
    /// Go-away streams open at once (fan-out bound). Default 64.
    pub goaway_max_concurrent_streams: usize,
    /// How long a go-away asks members to stay away. Default 300 s.
    pub goaway_retry_after: Duration,
    /// A trimmed member's connection is closed this long after its go-away. Default 10 s.
    pub trim_close_grace: Duration,
    /// Relay reservations at most; `None` = the high watermark. Default none.
    pub relay_max_reservations: Option<usize>,
    /// Relay circuits at most in total. Default 16384.
    pub relay_max_circuits: usize,
    /// Relay circuits at most per peer. Default 1024.
    pub relay_max_circuits_per_peer: usize,
    /// Longest life of one circuit. Default 3600 s.
    pub relay_circuit_duration: Duration,
    /// Bytes one circuit may carry; 0 = unlimited. Default 0.
    pub relay_circuit_bytes: u64,
    /// Life of one relay reservation. Default 3600 s.
    pub relay_reservation_duration: Duration,
    /// Time between leases, directory syncs and key syncs. Default 15 s.
    pub lease_interval: Duration,
    /// Allowed clock difference when checking credential validity. Default 60 s.
    pub clock_skew: Duration,
    /// Deadline of each read or write on an auth or catalog stream. Default 10 s.
    pub stream_timeout: Duration,
    /// Auth streams served at once; more are dropped and counted. Default 256.
    pub auth_max_inflight_streams: usize,
    /// Catalog streams served at once; more are dropped and counted. Default 256.
    pub catalog_max_inflight_streams: usize,
    /// Member records held at most. Default 10000.
    pub catalog_max_records: usize,
    /// Providers in one lookup answer at most. Default 64.
    pub catalog_max_results: usize,
    /// Connections with nothing keeping them alive close after this. Default 120 s.
    pub idle_connection_timeout: Duration,
    /// Time budget of one control-plane call, retries included. Default 30 s.
    pub control_plane_retry_budget: Duration,
    /// Timeout of one control-plane RPC attempt. Default 10 s.
    pub control_plane_rpc_timeout: Duration,
    /// Resource budgets and limits (issue 4; see `resource_config`).
    pub resources: crate::resources::config::ResourceConfig,
    /// Run the runtime stall watchdog (`agentmesh_runtime_stalls_total` on
    /// /metrics). One per process: the binary turns it on; programs that
    /// embed several routers run their own. Default off.
    pub runtime_watchdog: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: DEFAULT_CONTROL_PLANE.to_string(),
            control_plane_ca: None,
            token: String::new(),
            key_path: PathBuf::from(DEFAULT_KEY_PATH),
            listen: vec![
                DEFAULT_LISTEN
                    .parse()
                    .expect("DEFAULT_LISTEN is a valid multiaddr"),
            ],
            external_addr: Vec::new(),
            labels: BTreeMap::new(),
            metrics_addr: None,
            auth_deadline: Duration::from_secs(DEFAULT_AUTH_DEADLINE_SECS),
            high_watermark: DEFAULT_HIGH_WATERMARK,
            low_watermark: None,
            drain_grace: Duration::from_secs(DEFAULT_DRAIN_GRACE_SECS),
            goaway_max_concurrent_streams: DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS,
            goaway_retry_after: Duration::from_secs(DEFAULT_GOAWAY_RETRY_AFTER_SECS),
            trim_close_grace: Duration::from_secs(DEFAULT_TRIM_CLOSE_GRACE_SECS),
            relay_max_reservations: None,
            relay_max_circuits: DEFAULT_RELAY_MAX_CIRCUITS,
            relay_max_circuits_per_peer: DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER,
            relay_circuit_duration: Duration::from_secs(DEFAULT_RELAY_CIRCUIT_DURATION_SECS),
            relay_circuit_bytes: DEFAULT_RELAY_CIRCUIT_BYTES,
            relay_reservation_duration: Duration::from_secs(
                DEFAULT_RELAY_RESERVATION_DURATION_SECS,
            ),
            lease_interval: Duration::from_secs(DEFAULT_LEASE_INTERVAL_SECS),
            clock_skew: Duration::from_secs(DEFAULT_CLOCK_SKEW_SECS),
            stream_timeout: Duration::from_secs(DEFAULT_STREAM_TIMEOUT_SECS),
            auth_max_inflight_streams: DEFAULT_AUTH_MAX_INFLIGHT_STREAMS,
            catalog_max_inflight_streams: DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS,
            catalog_max_records: DEFAULT_CATALOG_MAX_RECORDS,
            catalog_max_results: DEFAULT_CATALOG_MAX_RESULTS,
            idle_connection_timeout: Duration::from_secs(DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS),
            control_plane_retry_budget: Duration::from_secs(
                DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS,
            ),
            control_plane_rpc_timeout: Duration::from_secs(DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS),
            resources: Default::default(),
            runtime_watchdog: false,
        }
    }
}

impl Config {
    /// The low watermark: `low_watermark` if set (capped at the high one),
    /// else 15% below the high one.
    pub fn low_watermark(&self) -> u32 {
        self.low_watermark
            .unwrap_or_else(|| {
                u32::try_from(u64::from(self.high_watermark) * 85 / 100).unwrap_or(u32::MAX)
            })
            .min(self.high_watermark)
    }

    /// Relay reservations at most, after applying the default.
    pub fn effective_max_reservations(&self) -> usize {
        self.relay_max_reservations
            .unwrap_or(self.high_watermark as usize)
    }

    /// Bytes per circuit for the relay (0 = unlimited becomes `u64::MAX`).
    pub fn effective_circuit_bytes(&self) -> u64 {
        if self.relay_circuit_bytes == 0 {
            u64::MAX
        } else {
            self.relay_circuit_bytes
        }
    }
}
