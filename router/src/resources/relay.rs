//! Relay refusals as resource refusals: the relay server denies with
//! `RESOURCE_LIMIT_EXCEEDED` both when a limit bites and when our admission
//! check (its first rate limiter) says no. Only the former is a resource
//! refusal; it is counted as `resource="reservation"|"circuit"`, scope
//! `system` when the router-wide maximum is reached, else `peer`.

use libp2p::relay::StatusCode;

use super::ResourceManager;
use super::budget::{Proto, Refusal, Resource, Scope};

/// Counts a denied reservation if a relay limit (not admission) refused
/// it: `admitted` says whether the peer may reserve, `full` whether the
/// router-wide reservation cap is reached.
pub(crate) fn reservation_denied(
    resources: &ResourceManager,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    count(resources, Resource::Reservation, status, admitted, full);
}

/// Counts a denied circuit if a relay limit (not admission) refused it:
/// `admitted` says whether the source may open circuits, `full` whether the
/// router-wide circuit cap is reached.
pub(crate) fn circuit_denied(
    resources: &ResourceManager,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    count(resources, Resource::Circuit, status, admitted, full);
}

fn count(
    resources: &ResourceManager,
    resource: Resource,
    status: &StatusCode,
    admitted: bool,
    full: bool,
) {
    if let Some(r) = classify(resource, status, admitted, full) {
        resources.metrics.refused(r, Proto::RelayHop.as_str());
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
