//! Our libp2p protocols as both sides speak them. Each protocol is one
//! module holding its framing, its client half and its server half, so the
//! router and the node (which never depend on each other) share one
//! implementation of every exchange.
//!
//! - [`frame`]: one length-capped protobuf frame read or written within a
//!   deadline, and the pure decoder under it.
//! - [`open`]: opening a stream of one protocol to a peer.
//! - [`exchange`]: the client half auth, catalog and call share (open,
//!   request, answer within a deadline) and its [`exchange::ExchangeError`].
//! - [`auth`] speaks `/agentmesh/auth/1`.
//! - [`catalog`] speaks `/agentmesh/catalog/1`.
//! - [`call`] speaks `/agentmesh/call/1`.
//! - [`goaway`] speaks `/agentmesh/goaway/1` ([`goaway::GoAwayError`]).
//! - [`policy`] speaks `/agentmesh/policy/1` ([`policy::PolicyPushError`]).
//!
//! The client halves of auth, catalog and call fail as one
//! [`exchange::ExchangeError`] (named [`auth::AuthError`],
//! [`catalog::CatalogError`] and [`call::CallExchangeError`] there), go-away and
//! policy each as their own; server halves return the [`frame::FrameError`]
//! of the frame they could not read or write, which says whether the peer
//! sent garbage ([`frame::FrameError::is_malformed`]) or went silent.
//!
//! Policy (who may do what, admissions, counters) stays with the programs:
//! this crate only moves and checks frames. Every decoder is a pure function
//! from bytes to a typed value or an error, so it can be fuzzed.

pub mod auth;
pub mod call;
pub mod catalog;
pub mod exchange;
pub mod frame;
pub mod goaway;
pub mod open;
pub mod policy;
#[cfg(test)]
mod testing;

/// What callers of any protocol's client half ask of its error.
pub trait ExchangeFailure: std::error::Error {
    /// Whether the exchange's deadline passed with no answer.
    fn is_timeout(&self) -> bool;
    /// Whether the connection (or the stream on it) failed rather than the
    /// peer answering: a retry on a fresh connection or route may succeed.
    fn is_connection_failure(&self) -> bool;
}
