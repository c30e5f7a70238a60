//! The relay's metrics: live reservations and circuits (counted by the
//! swarm loop from the relay's events) and requests by result.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::L1;

/// The relay's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct RelayMetrics {
    pub(crate) reservations: Gauge,
    pub(crate) reservation_requests: Family<L1, Counter>,
    pub(crate) circuits: Gauge,
    pub(crate) circuit_requests: Family<L1, Counter>,
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
        for res in ["accepted", "denied"] {
            let _ = m.reservation_requests.get_or_create(&[("result", res)]);
            let _ = m.circuit_requests.get_or_create(&[("result", res)]);
        }
        m
    }
}
