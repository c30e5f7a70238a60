//! The relay ACL: a reservation needs a peer admitted to attach; a circuit
//! needs its source admitted (transit is enough). The destination holds a
//! reservation, so it was admitted to attach; a peer that loses its
//! admission is disconnected, which ends its reservation. The relay server
//! asks these as its first rate limiters.

use crate::admission::Admissions;
use agentmesh_proto::unix_now;
use libp2p::PeerId;

/// Whether `peer` may hold a relay reservation now.
pub(crate) fn may_reserve(table: &Admissions, peer: &PeerId) -> bool {
    table.read().may_reserve(peer, unix_now())
}

/// Whether `peer` may open a relayed circuit now.
pub(crate) fn may_open_circuit(table: &Admissions, peer: &PeerId) -> bool {
    table.read().may_open_circuit(peer, unix_now())
}
