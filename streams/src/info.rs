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
    /// Whether the connection is a relayed circuit rather than a direct
    /// one: `/p2p-circuit` in the address dialed, or, for an accepted
    /// connection, in the local address it arrived on (an inbound circuit's
    /// remote address is only `/p2p/PEER`).
    pub relayed: bool,
    /// Whether this side dialed the connection (the remote is a peer we
    /// chose) rather than accepted it. Limits meant for strangers reaching
    /// in, keyed by the remote's source address, apply to accepted
    /// connections only: for a dialed one, `remote_addr` is where we went,
    /// not where anyone came from.
    pub dialed: bool,
}

fn is_circuit(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::P2pCircuit))
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
        Self {
            peer,
            connection,
            relayed: is_circuit(&remote_addr),
            remote_addr,
            dialed,
        }
    }

    /// The info of connection `connection` from `peer`, accepted on
    /// `local_addr` from `remote_addr`: relayed when either address is a
    /// circuit (the relay client gives an inbound circuit the local address
    /// `…/p2p/RELAY/p2p-circuit` and the remote address `/p2p/PEER`).
    pub fn accepted(
        peer: PeerId,
        connection: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: Multiaddr,
    ) -> Self {
        let mut info = Self::new(peer, connection, remote_addr, false);
        info.relayed |= is_circuit(local_addr);
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
        assert!(ConnectionInfo::new(peer, id, direct, true).dialed);
        let relayed = ConnectionInfo::new(peer, id, circuit, true);
        assert!(relayed.relayed);
        assert_eq!((relayed.peer, relayed.connection), (peer, id));
    }

    #[test]
    fn an_accepted_circuit_is_relayed_though_its_remote_address_names_only_the_peer() {
        let peer = PeerId::random();
        let id = ConnectionId::new_unchecked(7);
        // What libp2p-relay's client transport hands the swarm for an
        // inbound circuit.
        let local: Multiaddr = format!(
            "/ip4/10.0.0.1/tcp/4001/p2p/{}/p2p-circuit",
            PeerId::random()
        )
        .parse()
        .expect("addr");
        let remote: Multiaddr = format!("/p2p/{peer}").parse().expect("addr");
        let inbound = ConnectionInfo::accepted(peer, id, &local, remote.clone());
        assert!(inbound.relayed && !inbound.dialed);
        assert_eq!(inbound.remote_addr, remote);
        // An accepted direct connection is not.
        let listening: Multiaddr = "/ip4/10.0.0.2/tcp/4500".parse().expect("addr");
        let from: Multiaddr = "/ip4/10.0.0.3/tcp/4500".parse().expect("addr");
        assert!(!ConnectionInfo::accepted(peer, id, &listening, from).relayed);
    }
}
