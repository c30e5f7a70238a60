//! The relay: rust-libp2p's relay v2 server as this router runs it.
//!
//! - this file: the server's configuration, with the ACL as its first
//!   rate limiters;
//! - `acl`: who may reserve and who may open a circuit (admitted peers only);
//! - `counts`: the live reservations and circuits behind their gauges (and
//!   the count the drain waits on), from the relay's events in the swarm
//!   loop;
//! - `capacity`: the STOP streams the relay library drops at capacity
//!   without an event, counted from its log.
//!
//! What the relay costs is resource accounting and lives in `resources`:
//! the charge of its streams, the per-source share of a destination's
//! circuits and the policy check on each (`resources::relay`, read from the
//! STOP stream in the muxer), and the live circuits a policy change cuts
//! (`resources::circuits`).

pub(crate) mod acl;
pub(crate) mod capacity;
pub(crate) mod counts;

use libp2p::relay;

use crate::admission::Admissions;
use crate::config::{RelayConfig, Sizing};
pub(crate) use counts::{Circuits, Reservations};

/// Builds the relay configuration from the router's relay section, the
/// sizing in effect (the reservation cap) and the admission table its ACL
/// reads.
pub(crate) fn config(c: &RelayConfig, sizing: &Sizing, admissions: &Admissions) -> relay::Config {
    let for_reservations = admissions.clone();
    let for_circuits = admissions.clone();
    relay::Config {
        max_reservations: sizing.relay_max_reservations,
        max_reservations_per_peer: c.max_reservations_per_peer,
        reservation_duration: c.reservation_duration,
        reservation_rate_limiters: vec![Box::new(move |peer, _addr: &libp2p::Multiaddr, _now| {
            acl::may_reserve(&for_reservations, &peer)
        })],
        max_circuits: c.max_circuits,
        max_circuits_per_peer: c.max_circuits_per_peer,
        max_circuit_duration: c.circuit_duration,
        max_circuit_bytes: c.effective_circuit_bytes(),
        circuit_src_rate_limiters: vec![Box::new(move |peer, _addr: &libp2p::Multiaddr, _now| {
            acl::may_open_circuit(&for_circuits, &peer)
        })],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn reservations_per_peer_come_from_the_config() {
        let config_of = |c: &Config| config(&c.relay, &c.sizing(64 << 20), &Admissions::default());
        let c = Config {
            relay: RelayConfig {
                max_reservations_per_peer: 2,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(config_of(&c).max_reservations_per_peer, 2);
        assert_eq!(
            config_of(&Config::default()).max_reservations_per_peer,
            crate::config::DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER
        );
    }
}
