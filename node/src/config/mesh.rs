//! The mesh above the node: the control plane it enrolls with and reads
//! the key set and directory from, and the routers it holds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Default number of routers to hold (K).
pub const DEFAULT_ROUTERS: usize = 2;
/// Default control-plane URL (the `agentmesh-one` gRPC port on loopback),
/// shared with the other programs' `--control-plane`.
pub const DEFAULT_CONTROL_PLANE: &str = agentmesh_runtime::cli::DEFAULT_CONTROL_PLANE;
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
/// Default `--max-policy-pushes-in-flight`.
pub const DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT: usize = 16;
/// Default longest random wait before replacing a lost router while
/// another still serves, milliseconds (see [`RoutersConfig::replace_spread`]).
pub const DEFAULT_ROUTER_REPLACE_SPREAD_MS: u64 = 5_000;
/// Default longest random wait, after a node that had lost every router
/// holds one again, before it attaches the other K − 1, milliseconds (see
/// [`RoutersConfig::rejoin_spread`]).
pub const DEFAULT_ROUTER_REJOIN_SPREAD_MS: u64 = 30_000;

/// The control plane: where it is, how its TLS is trusted, the token the
/// node enrolls with, the budgets of its calls, how often the node re-reads
/// the key set and directory, and the clock difference allowed on the
/// credentials it issues (enrollment, refresh, the directory poll and
/// every check of a caller's credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneConfig {
    /// Control-plane gRPC URL (`--control-plane`).
    pub url: String,
    /// PEM CA certificate for a TLS control plane (`--control-plane-ca`); `None`: system roots / plain on loopback.
    pub ca: Option<PathBuf>,
    /// The control plane's replicas to dial (`--control-plane-endpoint`,
    /// repeatable; empty: `url` alone). A call moves to the next one when
    /// the one it is on does not answer; `url` stays the logical name
    /// proofs are bound to and TLS verifies, so every replica serves the
    /// same `--public-url`.
    pub endpoints: Vec<String>,
    /// Enrollment token (the command line reads it from `--token-file`). Empty is fine
    /// while the data dir holds a credential that can still be refreshed.
    pub token: String,
    /// Deadline for one control-plane RPC (`--rpc-timeout-secs`, default
    /// 10 s; less than 1 s acts as 1 s).
    pub rpc_timeout: Duration,
    /// Time budget of retries of one control-plane operation (`--retry-budget-secs`, default 180 s).
    pub retry_budget: Duration,
    /// How often the key set and router directory are re-read, ±20% jitter
    /// (`--directory-interval-secs`, default [`DEFAULT_DIRECTORY_INTERVAL`],
    /// 300 s; it was 60 s before routers pushed the policy).
    pub directory_interval: Duration,
    /// Clock skew tolerated when verifying callers' credentials, in whole
    /// seconds (`--credential-skew-secs`, default 60 s; zero: none).
    pub credential_skew: Duration,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_CONTROL_PLANE.to_string(),
            ca: None,
            endpoints: Vec::new(),
            token: String::new(),
            rpc_timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(180),
            directory_interval: DEFAULT_DIRECTORY_INTERVAL,
            credential_skew: Duration::from_secs(60),
        }
    }
}

/// The routers the node holds: how many, which ones and in what order of
/// preference, how fast a lost one is replaced, and how many of the
/// policy pushes they send are read at once (the engine's router slots and
/// its policy push acceptor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutersConfig {
    /// Routers to hold at once, K (`--routers`, default 2).
    pub count: usize,
    /// Only routers carrying all these labels (`--router-selector k=v`, repeatable).
    pub selector: BTreeMap<String, String>,
    /// Routers carrying more of these labels first (`--router-prefer k=v`, repeatable).
    pub prefer: BTreeMap<String, String>,
    /// Longest random wait before replacing a router whose connection was
    /// lost while another router still serves us (`--router-replace-spread-ms`,
    /// default 5 s; 0: at once). A killed router's members all lose it in
    /// the same instant; drawn uniformly from 0 to this, their re-attaches
    /// reach the survivors spread over it instead of in one burst. A node
    /// left with no router replaces at once.
    pub replace_spread: Duration,
    /// Longest random wait before a node that lost every router and holds
    /// one again attaches the other K − 1 (`--router-rejoin-spread-ms`,
    /// default 30 s; 0: at once). Such a node dials one router at a time
    /// until one serves: when a whole mesh restarts, every member returns
    /// at once and the routers' CPU goes to handshakes; one attach per
    /// member makes the fleet ready in half the work, and the second
    /// attaches, drawn uniformly over this window, come after.
    pub rejoin_spread: Duration,
    /// Policy pushes from routers read at once (`--max-policy-pushes-in-flight`,
    /// default 16): a router pushes one per change, so more means a flood;
    /// the rest are dropped unread, `agentmesh_node_policy_pushes_total{result="overflow"}`.
    pub max_policy_pushes_in_flight: usize,
}

impl Default for RoutersConfig {
    fn default() -> Self {
        Self {
            count: DEFAULT_ROUTERS,
            selector: BTreeMap::new(),
            prefer: BTreeMap::new(),
            replace_spread: Duration::from_millis(DEFAULT_ROUTER_REPLACE_SPREAD_MS),
            rejoin_spread: Duration::from_millis(DEFAULT_ROUTER_REJOIN_SPREAD_MS),
            max_policy_pushes_in_flight: DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT,
        }
    }
}
