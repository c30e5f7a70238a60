//! `/agentmesh/catalog/1`: members publish signed service records to their
//! routers; a lookup asks the member's router, which answers from its own
//! members' records and from the routers the router DHT names as providers.
//!
//! - `store`: the records (pure).
//! - `wire`: the frames.
//! - `server`: serving one stream (publish, withdraw, lookup, local lookup).

pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod wire;

use libp2p::kad::RecordKey;
use sha2::{Digest, Sha256};

/// The DHT key under which routers provide service `name`: SHA-256 of it.
pub fn service_key(name: &str) -> RecordKey {
    RecordKey::new(&Sha256::digest(name.as_bytes()))
}
