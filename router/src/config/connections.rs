//! Every connection and stream of the router, whatever its protocol: when
//! an idle or dead connection closes, and the deadlines and queues of the
//! streams on it.

use std::time::Duration;

/// Default idle connection timeout.
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS: u64 = 120;
/// Default interval of the router's own pings on each connection. Members
/// ping their routers every 15 s to find a dead router; the router's pings
/// only find dead members (a link down, a NAT that lost its mapping), which
/// cost a slot and a catalog entry until found, so they can be rarer: half
/// the ping traffic of an idle mesh, a dead member found within 50 s.
pub const DEFAULT_PING_INTERVAL_SECS: u64 = 30;
/// Default time one ping may wait for its answer before the connection is
/// closed as dead (libp2p-ping's own default).
pub const DEFAULT_PING_TIMEOUT_SECS: u64 = 20;
/// Default deadline for each read/write on one of our streams.
pub const DEFAULT_STREAM_TIMEOUT_SECS: u64 = 10;
/// Default inbound streams per protocol waiting for an accept loop: the
/// streams crate's own default (re-exported so the flag's default is
/// defined once).
pub const DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL: usize =
    agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL;

/// Connections and the streams on them (the swarm's idle timeout and
/// pings, the streams behaviour's queues and pending opens, the deadline
/// of each read or write on our own protocols' streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Connections with nothing keeping them alive close after this. Default 120 s.
    pub idle_timeout: Duration,
    /// Interval of the router's pings on each connection. Default 30 s.
    pub ping_interval: Duration,
    /// A ping unanswered for this long closes its connection as dead
    /// (`agentmesh_router_connections_closed_total{reason="ping_failed"}`).
    /// Default 20 s.
    pub ping_timeout: Duration,
    /// Deadline of each read or write on an auth or catalog stream. Default 10 s.
    pub stream_timeout: Duration,
    /// Negotiated inbound streams of one protocol (auth, catalog, ping…)
    /// that may wait for its accept loop; more are dropped and counted in
    /// `agentmesh_streams_inbound_dropped_total{reason="queue_full"}`.
    /// At least 1. Default 16.
    pub stream_inbound_queue_per_protocol: usize,
    /// Stream opens (go-aways, catalog lookups to other routers…) that may
    /// wait for a dial to one peer; more are refused at once and counted in
    /// `agentmesh_streams_pending_opens_refused_total{limit="per_peer"}`.
    /// At least 1. Default 64.
    pub stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together; more are
    /// refused, `limit="total"`. At least 1. Default 4096.
    pub stream_max_pending_opens_total: usize,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS),
            ping_interval: Duration::from_secs(DEFAULT_PING_INTERVAL_SECS),
            ping_timeout: Duration::from_secs(DEFAULT_PING_TIMEOUT_SECS),
            stream_timeout: Duration::from_secs(DEFAULT_STREAM_TIMEOUT_SECS),
            stream_inbound_queue_per_protocol: DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
            stream_max_pending_opens_per_peer:
                agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER,
            stream_max_pending_opens_total: agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL,
        }
    }
}
