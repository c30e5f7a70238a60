//! The relay v2 server's configuration with the admission ACL in front:
//! a reservation needs a peer admitted to attach; a circuit needs its source
//! admitted (transit is enough). The destination holds a reservation, so it
//! was admitted to attach; a peer that loses its admission is disconnected,
//! which ends its reservation.

use std::sync::Arc;

use agentmesh_proto::unix_now;
use libp2p::relay;

use crate::state::Shared;

/// Builds the relay configuration from the router's config and shared state.
pub(crate) fn config(shared: &Arc<Shared>) -> relay::Config {
    let c = &shared.config;
    let for_reservations = shared.clone();
    let for_circuits = shared.clone();
    relay::Config {
        max_reservations: c.effective_max_reservations(),
        // A member reserves once per router; renewals replace.
        max_reservations_per_peer: 4,
        reservation_duration: c.relay_reservation_duration,
        reservation_rate_limiters: vec![Box::new(move |peer, _addr: &libp2p::Multiaddr, _now| {
            for_reservations
                .admission
                .read()
                .may_reserve(&peer, unix_now())
        })],
        max_circuits: c.relay_max_circuits,
        max_circuits_per_peer: c.relay_max_circuits_per_peer,
        max_circuit_duration: c.relay_circuit_duration,
        max_circuit_bytes: c.effective_circuit_bytes(),
        circuit_src_rate_limiters: vec![Box::new(move |peer, _addr: &libp2p::Multiaddr, _now| {
            for_circuits
                .admission
                .read()
                .may_open_circuit(&peer, unix_now())
        })],
    }
}
