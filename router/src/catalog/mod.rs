//! `/agentmesh/catalog/1` and the router DHT behind it: members publish
//! signed service records to their routers; a lookup asks the member's
//! router, which answers from its own members' records and from the
//! routers the router DHT names as providers.
//!
//! - `store`: the records of this router's members (pure), and the
//!   [`store::RecordWriter`] by which the server asks the store's one
//!   writer, the swarm loop (`crate::tables`), to change it.
//! - `provided`: which service keys this router announces in the DHT.
//! - `providers`: provider searches in the DHT, one per service at a time.
//! - `server`: serving one stream (publish, withdraw, lookup, local lookup,
//!   upgraded); the frames and the client are `agentmesh_wire::catalog`.
//! - `upgraded`: a member's notice that a circuit through us was replaced
//!   by a direct connection, checked against the live circuits and counted.
//!
//! The swarm loop owns the DHT and the store: it runs the searches
//! [`ProviderQuery`] asks for, and announces what the store holds after
//! each change it makes.

pub(crate) mod provided;
pub(crate) mod providers;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod upgraded;
#[cfg(test)]
mod upgraded_tests;

use libp2p::PeerId;
use libp2p::kad::RecordKey;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// The DHT key under which routers provide service `name`: SHA-256 of it.
pub fn service_key(name: &str) -> RecordKey {
    RecordKey::new(&Sha256::digest(name.as_bytes()))
}

/// A request to the swarm loop for the routers that provide `key` per the
/// router DHT (this one included).
#[derive(Debug)]
pub(crate) struct ProviderQuery {
    pub(crate) key: RecordKey,
    pub(crate) reply: oneshot::Sender<Vec<PeerId>>,
}

/// Pre-creates every outcome of `agentmesh_router_catalog_provider_searches_total`.
pub(crate) fn precreate_labels(metrics: &Metrics) {
    for o in providers::Outcome::ALL {
        let _ = metrics
            .catalog
            .provider_searches
            .get_or_create(&[("outcome", o.as_str())]);
    }
}
