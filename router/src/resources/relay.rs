//! Relay refusals as resource refusals: the relay server denies with
//! `RESOURCE_LIMIT_EXCEEDED` both when a limit bites and when our admission
//! check (its first rate limiter) says no. Only the former is a resource
//! refusal; it is counted as `resource="reservation"|"circuit"`, scope
//! `system` when the router-wide maximum is reached, else `peer`.

use agentmesh_proto::unix_now;
use libp2p::PeerId;
use libp2p::relay::StatusCode;

use super::budget::{Proto, Refusal, Resource, Scope};
use crate::state::Shared;

/// Counts a denied reservation if a relay limit (not admission) refused it.
pub(crate) fn reservation_denied(shared: &Shared, src: &PeerId, status: &StatusCode) {
    let admitted = shared.admission.read().may_reserve(src, unix_now());
    let live = u64::try_from(shared.metrics.reservations.get()).unwrap_or(0);
    let max = shared.sizing.relay_max_reservations as u64;
    count(shared, Resource::Reservation, status, admitted, live >= max);
}

/// Counts a denied circuit if a relay limit (not admission) refused it.
pub(crate) fn circuit_denied(shared: &Shared, src: &PeerId, status: &StatusCode) {
    let admitted = shared.admission.read().may_open_circuit(src, unix_now());
    let live = u64::try_from(shared.metrics.circuits.get()).unwrap_or(0);
    let max = shared.config.relay_max_circuits as u64;
    count(shared, Resource::Circuit, status, admitted, live >= max);
}

fn count(shared: &Shared, resource: Resource, status: &StatusCode, admitted: bool, full: bool) {
    if let Some(r) = classify(resource, status, admitted, full) {
        shared
            .resources
            .metrics
            .refused(r, Proto::RelayHop.as_str());
    }
}

/// The refusal a relay denial stands for, if it was for lack of a resource.
fn classify(
    resource: Resource,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) -> Option<Refusal> {
    if !matches!(status, StatusCode::ResourceLimitExceeded) || !admitted {
        return None;
    }
    let scope = if full { Scope::System } else { Scope::Peer };
    Some(Refusal { resource, scope })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_limits_on_admitted_peers_count() {
        let r = Resource::Circuit;
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, false, true),
            None
        );
        assert_eq!(classify(r, &StatusCode::NoReservation, true, true), None);
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, true, true),
            Some(Refusal {
                resource: r,
                scope: Scope::System
            })
        );
        assert_eq!(
            classify(r, &StatusCode::ResourceLimitExceeded, true, false),
            Some(Refusal {
                resource: r,
                scope: Scope::Peer
            })
        );
    }
}
