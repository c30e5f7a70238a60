//! What a stream's connection is: who is on the other end, which
//! connection carries it, where it comes from and whether a relay carries
//! it. Handed out with every stream, so limits keyed by source address and
//! rules that differ for relayed and direct connections need no second
//! lookup in the swarm.

use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};

/// The connection a stream travels on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The remote peer, as the connection's handshake proved it.
    pub peer: PeerId,
    /// The swarm's id of the connection.
    pub connection: ConnectionId,
    /// The remote address: the address dialed for an outbound connection,
    /// the address the remote connected from for an inbound one.
    pub remote_addr: Multiaddr,
    /// Whether the connection is a relayed circuit (`/p2p-circuit` in its
    /// remote address) rather than a direct one.
    pub relayed: bool,
    /// Whether this side dialed the connection (the remote is a peer we
    /// chose) rather than accepted it. Limits meant for strangers reaching
    /// in, keyed by the remote's source address, apply to accepted
    /// connections only: for a dialed one, `remote_addr` is where we went,
    /// not where anyone came from.
    pub dialed: bool,
}

impl ConnectionInfo {
    /// The info of connection `connection` to `peer` at `remote_addr`,
    /// which this side `dialed` or accepted.
    pub fn new(
        peer: PeerId,
        connection: ConnectionId,
        remote_addr: Multiaddr,
        dialed: bool,
    ) -> Self {
        let relayed = remote_addr
            .iter()
            .any(|p| matches!(p, Protocol::P2pCircuit));
        Self {
            peer,
            connection,
            remote_addr,
            relayed,
            dialed,
        }
    }

    /// The info of a connection this side accepted on `local_addr`. An
    /// inbound circuit is relayed by the address it arrived on
    /// (`/…/p2p/R/p2p-circuit`, our reservation at R): its remote address
    /// names only the peer (`/p2p/P`).
    pub fn accepted(
        peer: PeerId,
        connection: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: Multiaddr,
    ) -> Self {
        let mut info = Self::new(peer, connection, remote_addr, false);
        info.relayed |= local_addr.iter().any(|p| matches!(p, Protocol::P2pCircuit));
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circuit_address_is_relayed_and_a_tcp_one_is_not() {
        let peer = PeerId::random();
        let direct: Multiaddr = "/ip4/10.0.0.1/tcp/4001".parse().expect("addr");
        let circuit: Multiaddr = format!(
            "/ip4/10.0.0.1/tcp/4001/p2p/{}/p2p-circuit/p2p/{peer}",
            PeerId::random()
        )
        .parse()
        .expect("addr");
        let id = ConnectionId::new_unchecked(7);
        let accepted = ConnectionInfo::new(peer, id, direct.clone(), false);
        assert!(!accepted.relayed && !accepted.dialed);
        // An inbound circuit: relayed by the address it arrived on, though
        // its remote address names only the peer.
        let listen: Multiaddr = format!(
            "/ip4/10.0.0.1/tcp/4001/p2p/{}/p2p-circuit",
            PeerId::random()
        )
        .parse()
        .expect("addr");
        let only_peer: Multiaddr = format!("/p2p/{peer}").parse().expect("addr");
        let inbound_circuit = ConnectionInfo::accepted(peer, id, &listen, only_peer.clone());
        assert!(inbound_circuit.relayed && !inbound_circuit.dialed);
        let inbound_direct = ConnectionInfo::accepted(peer, id, &direct, only_peer);
        assert!(!inbound_direct.relayed);
        assert!(ConnectionInfo::new(peer, id, direct, true).dialed);
        let relayed = ConnectionInfo::new(peer, id, circuit, true);
        assert!(relayed.relayed);
        assert_eq!((relayed.peer, relayed.connection), (peer, id));
    }
}
