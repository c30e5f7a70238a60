//! A small libp2p behaviour for our own raw-stream protocols (auth, catalog,
//! call, go-away): a [`Control`] opens a stream of a protocol to a peer or
//! registers to accept a protocol's inbound streams.
//!
//! Written to replace `libp2p-stream` 0.5.0-alpha, which keeps a channel per
//! connection forever (its sender map is never pruned on close) and drops
//! inbound streams silently beyond a one-slot queue. Here every piece of
//! per-connection state lives in one place and is removed when the
//! connection's handler goes away, and inbound streams beyond a bounded
//! per-protocol queue are dropped and counted
//! (`agentmesh_streams_inbound_dropped_total`).

mod behaviour;
mod control;
mod handler;
mod shared;
mod upgrade;

pub use behaviour::Behaviour;
pub use control::{AlreadyRegistered, Control, IncomingStreams, OpenStreamError};
pub use shared::{DebugSizes, DropReason};

/// Default bound of each protocol's queue of accepted-but-not-yet-taken
/// inbound streams. Small: a healthy accept loop drains it at once, and a
/// stalled one should shed load visibly (counted) rather than buffer it.
pub const DEFAULT_INBOUND_QUEUE_PER_PROTOCOL: usize = 16;

/// Bound of each connection's queue of outbound open requests not yet
/// handed to the connection. Callers wait (backpressure) when it is full.
pub(crate) const OPEN_QUEUE_PER_CONNECTION: usize = 32;

/// Settings of a [`Behaviour`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many negotiated inbound streams of one protocol may wait for the
    /// [`IncomingStreams`] holder to take them; more are dropped and counted
    /// with reason `queue_full`. At least 1.
    pub inbound_queue_per_protocol: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            inbound_queue_per_protocol: DEFAULT_INBOUND_QUEUE_PER_PROTOCOL,
        }
    }
}
