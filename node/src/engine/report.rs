//! The engine's answer to [`Command::Report`]: what it holds, for
//! `agentmesh-node status`.
//!
//! [`Command::Report`]: crate::command::Command::Report

use std::sync::atomic::Ordering;

use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::unix_now;
use tokio::time::Instant;

use super::Engine;
use crate::status::report::{Report, RouterReport};

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
        let expires = peek_claims(&self.node.credential())
            .unwrap_or_default()
            .expires_at_unix_secs;
        Report {
            peer_id: self.node.peer_id.to_string(),
            ready: status.ready,
            readiness: status.readyz_line(),
            routers_wanted: status.routers_wanted,
            router_candidates: status.candidates,
            routers,
            transit_routers,
            credential_expires_at_unix_secs: expires,
            credential_expires_in_secs: expires - unix_now(),
            exposed: self.node.exposed(),
            forwarded: self.node.forwarded(),
            calls_in_flight: self.node.in_flight.load(Ordering::SeqCst),
            recent_calls: self.node.metrics.recent.counts(Instant::now()),
            recent_window_secs: crate::status::recent::WINDOW.as_secs(),
            stopping: status.stopping,
            last_router_error: status.last_router_error,
            policy_version,
            policy_epoch,
            records_refused: status.records_refused,
            direct: self.direct_report(),
        }
    }
}
