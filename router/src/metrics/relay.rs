//! The relay's metrics: live reservations and circuits (counted by the
//! swarm loop from the relay's events), requests by result, and circuits
//! upgraded away as their members tell (`crate::catalog::upgraded`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::L1;

/// Why an upgrade notice marked no circuit: `malformed` (the peer it names
/// is not a PeerId), `not_admitted` (the member is not admitted),
/// `no_such_circuit` (no live circuit between the member and that peer),
/// `duplicate` (each of them was marked already).
pub(crate) const UPGRADE_REFUSALS: &[&str] =
    &["malformed", "not_admitted", "no_such_circuit", "duplicate"];

/// The relay's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct RelayMetrics {
    pub(crate) reservations: Gauge,
    pub(crate) reservation_requests: Family<L1, Counter>,
    pub(crate) circuits: Gauge,
    pub(crate) circuit_requests: Family<L1, Counter>,
    /// Circuits a member at one end said were replaced by a direct
    /// connection, each counted once.
    pub(crate) circuits_upgraded: Counter,
    /// Upgrade notices that marked nothing, by reason ([`UPGRADE_REFUSALS`]).
    pub(crate) upgrade_notices_refused: Family<L1, Counter>,
}

impl RelayMetrics {
    /// Registers them in `r`, every label at 0.
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "agentmesh_router_reservations",
            "Active relay reservations",
            m.reservations.clone(),
        );
        r.register(
            "agentmesh_router_reservation_requests",
            "Relay reservation requests by result",
            m.reservation_requests.clone(),
        );
        r.register(
            "agentmesh_router_circuits",
            "Active relayed circuits",
            m.circuits.clone(),
        );
        r.register(
            "agentmesh_router_circuit_requests",
            "Relay circuit requests by result",
            m.circuit_requests.clone(),
        );
        r.register(
            "agentmesh_router_circuits_upgraded",
            "Circuits a member at one end said were replaced by a direct connection \
             (hole punch), each counted at most once while it was live",
            m.circuits_upgraded.clone(),
        );
        r.register(
            "agentmesh_router_upgrade_notices_refused",
            "Members' notices of a circuit upgraded away that marked nothing, by reason \
             (malformed, not_admitted, no_such_circuit: no live circuit between the member \
             and the peer it named, duplicate: each was marked already)",
            m.upgrade_notices_refused.clone(),
        );
        for reason in UPGRADE_REFUSALS {
            let _ = m
                .upgrade_notices_refused
                .get_or_create(&[("reason", reason)]);
        }
        for res in ["accepted", "denied"] {
            let _ = m.reservation_requests.get_or_create(&[("result", res)]);
            let _ = m.circuit_requests.get_or_create(&[("result", res)]);
        }
        m
    }
}
