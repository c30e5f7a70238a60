//! What `agentmesh-node status` and `agentmesh-node services` show: the
//! node's own account of what it holds, asked of the engine over the
//! node's Unix socket (`STATUS`, `SERVICES`) and sent as one JSON line.
//! [`Report::render`] and [`Services::render`] (in `render`) give the
//! human form. Every 64-bit id is a decimal string in the JSON (see
//! `id_string`); times stay Unix seconds there, for machines, and read as
//! RFC 3339 with "N ago" in the text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::status::id_string;

pub use crate::status::recent::CallCounts;

/// One router the node holds or is acquiring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterReport {
    /// Its PeerId.
    pub peer_id: String,
    /// Where it stands: dialing, authenticating, reconnecting, reserving,
    /// reserved, waiting to reserve.
    pub state: String,
    /// The address we reached it at.
    pub addr: Option<String>,
    /// It sent go-away: being replaced.
    pub leaving: bool,
    /// It said it is draining.
    pub draining: bool,
    /// It accepted our current records.
    pub records_accepted: bool,
    /// Why it refused our records the last time (e.g. `not_owner:
    /// provider does not own service "x"`). Defaulted when reading a node
    /// that predates it.
    #[serde(default)]
    pub records_refused: Option<String>,
}

/// A service this node exposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposed {
    /// The service name.
    pub name: String,
    /// The local backend calls are spliced to.
    pub backend: String,
}

/// A `--forward` listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
    /// The bound local address.
    pub listen: String,
    /// The service each connection calls.
    pub service: String,
}

/// Who a node is by its current credential (top-level fields of the
/// status JSON). Defaulted field by field when reading a node that
/// predates them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityReport {
    /// The node id the control plane gave it (a string already).
    #[serde(default)]
    pub node_id: String,
    /// `member` or `router`, from the enrollment token.
    #[serde(default)]
    pub role: String,
    /// Its labels, from the enrollment token (never chosen by the node).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The groups of the policy held that these labels and role put it
    /// in: what grants and ownership are judged by. Empty with no policy
    /// or a credential that does not verify.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Issue of the current credential, Unix seconds.
    #[serde(default)]
    pub credential_issued_at_unix_secs: i64,
    /// Expiry of the current credential, Unix seconds.
    pub credential_expires_at_unix_secs: i64,
    /// Seconds until it expires (negative: expired).
    pub credential_expires_in_secs: i64,
}

/// The access policy and revocation list a node holds (top-level fields of
/// the status JSON); each 64-bit id a decimal string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyReport {
    /// Version of the access policy held (0: none, every call is denied).
    /// Defaulted when reading a node that predates it.
    #[serde(default, with = "id_string")]
    pub policy_version: u64,
    /// Epoch of the access policy held (random, 64 bits).
    #[serde(default, with = "id_string")]
    pub policy_epoch: u64,
    /// Epoch of the revocation list held (0: none yet).
    #[serde(default, with = "id_string")]
    pub revocations_epoch: u64,
    /// Generation of the revocation list held.
    #[serde(default, with = "id_string")]
    pub revocations_generation: u64,
}

/// What the node holds, as of the moment it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// When the node made this report, Unix seconds (the "ago" and "in" of
    /// the text are reckoned from it). Defaulted for an older node.
    #[serde(default)]
    pub at_unix_secs: i64,
    /// This node's PeerId.
    pub peer_id: String,
    /// Whether it is ready.
    pub ready: bool,
    /// The `/readyz` line: ready, or why not.
    pub readiness: String,
    /// Routers wanted (K).
    pub routers_wanted: usize,
    /// Routers in the directory matching the selector.
    pub router_candidates: usize,
    /// The routers held or being acquired.
    pub routers: Vec<RouterReport>,
    /// Routers that admitted us for transit (calls to providers sharing
    /// none of our routers).
    pub transit_routers: Vec<String>,
    /// Who the node is by its credential: ids, role, labels, groups,
    /// issue and expiry (flattened: its fields are top-level in the JSON).
    #[serde(flatten)]
    pub identity: IdentityReport,
    /// Services exposed.
    pub exposed: Vec<Exposed>,
    /// `--forward` listeners.
    pub forwarded: Vec<Forwarded>,
    /// Calls in flight now (inbound, forwarded, handed out).
    pub calls_in_flight: usize,
    /// Calls that ended in the last [`Report::recent_window_secs`].
    pub recent_calls: CallCounts,
    /// The window of `recent_calls`, seconds.
    pub recent_window_secs: u64,
    /// Shutdown has begun.
    pub stopping: bool,
    /// The last thing that went wrong holding routers.
    pub last_router_error: Option<String>,
    /// The access policy and revocation list held (flattened).
    #[serde(flatten)]
    pub policy: PolicyReport,
    /// Why a router refuses our records, naming it; `None` while none does.
    #[serde(default)]
    pub records_refused: Option<String>,
    /// Direct connections: where we listen, what routers observed, the
    /// NAT kind, the peers reached directly; `None` with `--direct=false`
    /// (and from a node that predates it).
    #[serde(default)]
    pub direct: Option<DirectReport>,
}

/// What `status` says about direct connections.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectReport {
    /// The listening address (`/ip4/A/tcp/P`), once bound.
    pub listening: Option<String>,
    /// The NAT kind the routers' observations show: `unknown` (none yet),
    /// `one_observation`, `endpoint_independent` (punches are tried),
    /// `endpoint_dependent` (no punch: calls stay relayed).
    pub nat: String,
    /// Each router's observation of our address.
    pub observed: Vec<Observation>,
    /// Peers we hold a direct connection to now.
    pub direct_peers: Vec<String>,
}

/// One router's observation of our address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The router's PeerId.
    pub router: String,
    /// The address it saw us at (`IP:PORT`).
    pub addr: String,
}

/// A service seen in a lookup (there is no mesh-wide listing: a router
/// answers lookups by name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenService {
    /// The service name.
    pub name: String,
    /// Providers the last lookup found (verified records).
    pub providers: usize,
    /// Seconds since that lookup.
    pub looked_up_secs_ago: u64,
}

/// The services a node can see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Services {
    /// Ours.
    pub exposed: Vec<Exposed>,
    /// Reached through `--forward` listeners.
    pub forwarded: Vec<Forwarded>,
    /// Looked up by this node's calls recently, newest first.
    pub seen: Vec<SeenService>,
}
