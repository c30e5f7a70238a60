//! Protocol ids only routers speak (those members speak too are in
//! `agentmesh_proto::protocols`): the router DHT and identify among routers.

/// Kademlia protocol of the router DHT (routers only).
pub const KAD_PROTOCOL: &str = "/agentmesh/kad/1";
/// Identify protocol version string (routers only).
pub(crate) const IDENTIFY_PROTOCOL: &str = "/agentmesh/1";
