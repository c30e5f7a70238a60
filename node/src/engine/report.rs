//! The engine's answer to [`Command::Report`]: what it holds, for
//! `agentmesh-node status`.
//!
//! [`Command::Report`]: crate::command::Command::Report

use std::sync::atomic::Ordering;

use agentmesh_proto::credential::{labels_to_map, peek_claims, verify};
use agentmesh_proto::enforce::groups_of;
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::unix_now;
use tokio::time::Instant;

use super::Engine;
use crate::node::Node;
use crate::status::report::{IdentityReport, PolicyReport, Report, RouterReport};

impl Engine {
    pub(super) fn report(&self) -> Report {
        let status = self.status_snapshot();
        let mut routers: Vec<RouterReport> = self
            .slots
            .iter()
            .map(|(p, s)| RouterReport {
                peer_id: p.to_string(),
                state: s.phase.name().to_string(),
                addr: s.addr.as_ref().map(ToString::to_string),
                leaving: s.leaving.is_some(),
                draining: s.draining,
                records_accepted: s.is_reserved() && s.published,
                records_refused: s.records_refused.clone(),
            })
            .collect();
        routers.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
        let mut transit_routers: Vec<String> = self
            .transit
            .routers()
            .filter(|p| !self.slots.contains_key(p))
            .map(ToString::to_string)
            .collect();
        transit_routers.sort();
        let (policy_epoch, policy_version) = self.node.policy.epoch_version();
        let (revocations_epoch, revocations_generation) = self.node.policy.revocations_generation();
        let now = unix_now();
        Report {
            at_unix_secs: now,
            peer_id: self.node.peer_id.to_string(),
            ready: status.ready,
            readiness: status.readyz_line(),
            routers_wanted: status.routers_wanted,
            router_candidates: status.candidates,
            routers,
            transit_routers,
            identity: identity(&self.node, now),
            exposed: self.node.exposed(),
            forwarded: self.node.forwarded(),
            calls_in_flight: self.node.in_flight.load(Ordering::SeqCst),
            recent_calls: self.node.metrics.recent.counts(Instant::now()),
            recent_window_secs: crate::status::recent::WINDOW.as_secs(),
            stopping: status.stopping,
            last_router_error: status.last_router_error,
            policy: PolicyReport {
                policy_version,
                policy_epoch,
                revocations_epoch,
                revocations_generation,
            },
            records_refused: status.records_refused,
            direct: self.direct_report(),
        }
    }
}

/// Who the node is by its current credential at `now`; its groups are
/// those of the policy held, judged on the credential as verified (none
/// when it does not verify: then no grant applies to it either).
fn identity(node: &Node, now: i64) -> IdentityReport {
    let credential = node.credential();
    let claims = peek_claims(&credential).unwrap_or_default();
    let skew = node.config.control_plane.credential_skew.as_secs() as i64;
    let groups = match (
        node.policy.held(),
        verify(&credential, &node.trust(), now, Some(&node.peer_id), skew),
    ) {
        (Some(held), Ok(verified)) => {
            let g = groups_of(&held.policy, &verified);
            held.policy
                .group_names(&g)
                .into_iter()
                .map(str::to_string)
                .collect()
        }
        _ => Vec::new(),
    };
    let role = match Role::try_from(claims.role).unwrap_or(Role::Unspecified) {
        Role::Member => "member",
        Role::Router => "router",
        Role::Unspecified => "unspecified",
    };
    IdentityReport {
        node_id: claims.node_id.clone(),
        role: role.to_string(),
        labels: labels_to_map(&claims.labels),
        groups,
        credential_issued_at_unix_secs: claims.issued_at_unix_secs,
        credential_expires_at_unix_secs: claims.expires_at_unix_secs,
        credential_expires_in_secs: claims.expires_at_unix_secs - now,
    }
}
