//! The `Watch` stream: routers hold one server-streaming call and receive
//! the policy in force, the active revocations and the key set, in full at
//! once and again on every change, instead of polling `GetDirectory`.
//!
//! One place owns the current event: [`WatchHub`] holds it in a tokio
//! `watch` channel, written only by the publisher ([`run_watch_publisher`]),
//! which rebuilds it when told something changed ([`WatchHub::changed`]:
//! a policy applied or re-signed, a node or token revoked, a key rotated)
//! and every `--policy-check-interval-ms` while anyone watches (what
//! another process on the same database changed). A watcher reads the
//! latest value when it is ready to send: a slow router skips states it
//! was too slow for and never has a queue that grows. Streams are bounded
//! by `--watch-max-streams` (refusals counted as limiter `watch_streams`);
//! a dead router's stream ends with its connection, which the HTTP/2
//! keepalive (`--grpc-keepalive-*`) closes; every stream ends when the
//! router's credential expires (it watches again with the refreshed one)
//! and when the control plane stops.

mod publisher;
mod stream;

pub use crate::watch_hub::WatchHub;
pub use publisher::{run_watch_publisher, spawn};
pub use stream::WatchStream;
