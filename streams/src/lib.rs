//! A small libp2p behaviour for our own raw-stream protocols (auth, catalog,
//! call, go-away): a [`Control`] opens a stream of a protocol to a peer or
//! registers to accept a protocol's inbound streams. Every stream comes
//! with its [`ConnectionInfo`]: the peer, the connection id, the remote
//! address and whether a relay carries it.
//!
//! Written to replace `libp2p-stream` 0.5.0-alpha, which keeps a channel per
//! connection forever (its sender map is never pruned on close) and drops
//! inbound streams silently beyond a one-slot queue. Here every piece of
//! per-connection state lives in one place and is removed when the
//! connection's handler goes away, and inbound streams beyond a bounded
//! per-protocol queue are dropped and counted
//! (`agentmesh_streams_inbound_dropped_total`). The queue is shared fairly
//! by peer once full: a peer holding fewer queued streams than the heaviest
//! peer takes that peer's oldest place (`reason="preempted"`), so one peer
//! cannot keep others' streams out of it. Open requests waiting for a
//! dial to their peer are bounded per peer and in total
//! ([`PendingOpenLimits`]); beyond either bound an open is refused at once
//! with [`OpenStreamError::TooManyPending`] and counted
//! (`agentmesh_streams_pending_opens_refused_total{limit}`).

mod behaviour;
mod control;
pub mod dial;
mod error;
mod handler;
mod in_flight;
mod info;
mod labels;
mod queue;
mod shared;
mod upgrade;
pub mod yamux;

pub use behaviour::Behaviour;
pub use control::{ConnectionClosed, Control, IncomingStreams};
pub use error::{AlreadyRegistered, OpenStreamError};
pub use info::ConnectionInfo;
pub use labels::{DropReason, PendingLimit};
pub use shared::DebugSizes;

/// Default bound of each protocol's queue of accepted-but-not-yet-taken
/// inbound streams. Small: a healthy accept loop drains it at once, and a
/// stalled one should shed load visibly (counted) rather than buffer it.
pub const DEFAULT_INBOUND_QUEUE_PER_PROTOCOL: usize = 16;

/// Bound of each connection's queue of outbound open requests not yet
/// handed to the connection. Callers wait (backpressure) when it is full.
pub(crate) const OPEN_QUEUE_PER_CONNECTION: usize = 32;

/// Default bound of the open requests waiting for a dial to one peer
/// ([`PendingOpenLimits::max_pending_opens_per_peer`]). Twice a connection's
/// open queue: a burst of opens to a peer being dialed fits, while a caller
/// looping on an unreachable peer is refused after this many instead of
/// queueing until the dial times out.
pub const DEFAULT_MAX_PENDING_OPENS_PER_PEER: usize = 64;

/// Default bound of the open requests waiting for dials to all peers
/// together ([`PendingOpenLimits::max_pending_opens_total`]): each holds a
/// reply channel, so many unreachable peers cannot add up to unbounded
/// memory either.
pub const DEFAULT_MAX_PENDING_OPENS_TOTAL: usize = 4096;

/// Bounds of the open requests parked until a dial to their peer connects
/// or fails. Requests whose callers gave up do not count.
///
/// Kept apart from [`Config`] so that code building a `Config` with every
/// field listed still compiles; [`Behaviour::with_limits`] takes both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingOpenLimits {
    /// Opens waiting for a connection to one peer; more are refused with
    /// [`OpenStreamError::TooManyPending`] (`limit="per_peer"`). Default
    /// [`DEFAULT_MAX_PENDING_OPENS_PER_PEER`]; 0 acts as 1.
    pub max_pending_opens_per_peer: usize,
    /// Opens waiting for connections to any peer; more are refused
    /// (`limit="total"`). Default [`DEFAULT_MAX_PENDING_OPENS_TOTAL`]; 0
    /// acts as 1.
    pub max_pending_opens_total: usize,
}

impl Default for PendingOpenLimits {
    fn default() -> Self {
        Self {
            max_pending_opens_per_peer: DEFAULT_MAX_PENDING_OPENS_PER_PEER,
            max_pending_opens_total: DEFAULT_MAX_PENDING_OPENS_TOTAL,
        }
    }
}

/// Settings of a [`Behaviour`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many negotiated inbound streams of one protocol may wait for the
    /// [`IncomingStreams`] holder to take them, all peers together. When
    /// full, a stream of a peer holding fewer than the heaviest peer takes
    /// that peer's oldest place (counted `preempted`); otherwise it is
    /// dropped (`queue_full`). At least 1.
    pub inbound_queue_per_protocol: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            inbound_queue_per_protocol: DEFAULT_INBOUND_QUEUE_PER_PROTOCOL,
        }
    }
}
