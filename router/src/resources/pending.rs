//! Inbound connections in their handshake: the router's side of
//! [`agentmesh_fair::handshakes`], which the transport runs
//! (`transport.rs`) as each connection is accepted, before noise (or
//! QUIC's TLS) spends any CPU and before the swarm sees it.
//!
//! The router decides what a source may hold ([`RouterGate`]): nothing
//! while it is blocked for failed logins (`logins.rs`; unless members are
//! admitted from it), otherwise `--unauthenticated-connections-per-ip`
//! less its established connections whose peers are not admitted, plus one
//! newcomer past the cap, who evicts the source's oldest unauthenticated
//! connection once it is up (`admission::conns`). The table shares
//! `--pending-connections-max` fairly by source and, when a newcomer finds
//! its source's room (or the whole budget) full, closes the handshake that
//! progressed least for it: a flood from a member's own address sheds its
//! own stalled handshakes, and the member, whose handshake moves, gets in.
//! Connections of admitted peers are never counted as unauthenticated, so
//! members behind one NAT are not limited once admitted.
//!
//! Counted ([`HandshakeMetrics`]): `agentmesh_router_handshakes_shed_total
//! {reason,progress}`, `_refused_total{reason}` (each refusal also in
//! `agentmesh_router_refused_total{resource="connection",scope="source"}`),
//! `_in_progress` and `_capacity`.

use std::net::IpAddr;
use std::sync::Weak;

use agentmesh_fair::handshakes::{
    Events, Gate, Limits, Progressed, RefuseReason, Shed, ShedReason,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ResourceManager;
use super::budget::{Refusal, Resource, Scope};
use super::metrics::NO_PROTOCOL;

/// A refusal of the router's own gate (the `reason` label), beside the
/// table's [`RefuseReason`]s.
const BLOCKED: &str = "blocked";

/// The handshake counters (registered once, cloned into the table's events).
#[derive(Debug, Clone, Default)]
pub(crate) struct HandshakeMetrics {
    pub(super) shed: Family<[(&'static str, &'static str); 2], Counter>,
    pub(super) refused: Family<[(&'static str, &'static str); 1], Counter>,
    pub(super) in_progress: Gauge,
    capacity: Gauge,
    /// The router's refusal counter (`resource="connection",scope="source"`).
    refused_total: Family<super::RefusedLabels, Counter>,
}

impl HandshakeMetrics {
    /// Registers the counters in `registry`, every label pre-created;
    /// refusals are also counted in `refused_total`.
    pub(crate) fn new(
        registry: &mut Registry,
        refused_total: Family<super::RefusedLabels, Counter>,
    ) -> Self {
        let m = Self {
            refused_total,
            ..Self::default()
        };
        registry.register(
            "agentmesh_router_handshakes_shed",
            "Inbound connections closed in their handshake to make room for a newcomer, by \
             reason (source_full: its source held --unauthenticated-connections-per-ip; \
             budget_full: --pending-connections-max were taken and its source held its share; \
             lighter_source: taken for a source holding fewer) and by how far it had got \
             (none: not a byte received; partial: started)",
            m.shed.clone(),
        );
        for r in ShedReason::ALL {
            for p in Progressed::ALL {
                let _ = m
                    .shed
                    .get_or_create(&[("reason", r.as_str()), ("progress", p.as_str())]);
            }
        }
        registry.register(
            "agentmesh_router_handshakes_refused",
            "Inbound connections refused before their handshake, by reason (blocked: its \
             source is blocked for failed logins; source_full: its source's unauthenticated \
             connections fill its share; budget_share: --pending-connections-max are taken \
             and its source holds its share)",
            m.refused.clone(),
        );
        for r in RefuseReason::ALL
            .map(RefuseReason::as_str)
            .into_iter()
            .chain([BLOCKED])
        {
            let _ = m.refused.get_or_create(&[("reason", r)]);
        }
        registry.register(
            "agentmesh_router_handshakes_in_progress",
            "Inbound connections in their handshake now",
            m.in_progress.clone(),
        );
        registry.register(
            "agentmesh_router_handshakes_capacity",
            "Inbound connections that may be in their handshake at once \
             (--pending-connections-max)",
            m.capacity.clone(),
        );
        m
    }

    fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&[("reason", reason)]).inc();
        let r = Refusal::new(Resource::Connection, Scope::Source);
        self.refused_total
            .get_or_create(&[
                ("resource", r.resource.as_str()),
                ("scope", r.scope.as_str()),
                ("protocol", NO_PROTOCOL),
            ])
            .inc();
    }
}

/// The table's budgets for the router's flags.
pub(crate) fn limits(pending_connections_max: u32, ipv6_prefix_len: u8) -> Limits {
    Limits {
        max_pending: usize::try_from(pending_connections_max).unwrap_or(usize::MAX),
        ipv6_prefix_len,
    }
}

/// What a source may hold, from the resource manager's counts.
pub(crate) struct RouterGate {
    pub(crate) mgr: Weak<ResourceManager>,
    pub(crate) metrics: HandshakeMetrics,
}

impl Gate for RouterGate {
    fn room(&self, ip: IpAddr) -> Option<usize> {
        // A router shutting down takes no new connection.
        let mgr = self.mgr.upgrade()?;
        let room = mgr.handshake_room(ip);
        if room.is_none() {
            self.metrics.refused(BLOCKED);
        }
        room
    }
}

/// What the table tells the router to count.
pub(crate) struct RouterEvents(pub(crate) HandshakeMetrics);

impl Events for RouterEvents {
    fn shed(&self, s: Shed) {
        let labels = [
            ("reason", s.reason.as_str()),
            ("progress", s.progressed.as_str()),
        ];
        self.0.shed.get_or_create(&labels).inc();
    }

    fn refused(&self, reason: RefuseReason) {
        self.0.refused(reason.as_str());
    }

    fn in_progress(&self, n: usize) {
        self.0.in_progress.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

impl RouterEvents {
    /// Sets the capacity gauge.
    pub(crate) fn capacity(&self, n: usize) {
        self.0.capacity.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

impl ResourceManager {
    /// Handshakes the source of `addr` may hold now, or `None` when it is
    /// blocked for failed logins (logged at most once a minute per source).
    /// A source with members admitted from it is never blocked: in a
    /// re-admission storm a CPU-starved member can miss the first-byte
    /// deadline, and blocking its address would lock every member behind
    /// it out before their handshake.
    pub(crate) fn handshake_room(&self, addr: IpAddr) -> Option<usize> {
        let ip = self.source_key(addr);
        // The failed-login guard has its own lock: read it before ours.
        let source_blocked = self.source_blocked(addr);
        let st = self.state.lock();
        let from_source = st.sources.get(&ip);
        if source_blocked && !from_source.has_members() {
            let key = ip.to_string();
            if let Some(suppressed) = self.log_pass(&key, "handshake_refused") {
                tracing::warn!(
                    source = key,
                    suppressed,
                    "connection refused before its handshake: the source is blocked for \
                     failed logins (logged at most once a minute per source)"
                );
            }
            return None;
        }
        // One newcomer past the cap: it evicts the source's oldest
        // unauthenticated connection once it is up.
        let cap = self.budgets.unauthenticated_connections_per_ip as usize + 1;
        Some(cap.saturating_sub(from_source.unauthenticated() as usize))
    }

    /// Entries in the manager's per-peer, per-source and per-connection
    /// tables, by `agentmesh_router_table_entries` label.
    pub(crate) fn table_entries(&self) -> [(&'static str, usize); 6] {
        let failed_login_sources = self.logins.lock().len();
        let pending = self.handshakes.in_progress();
        let st = self.state.lock();
        [
            ("resource_peers", st.peers.len()),
            ("resource_sources", st.sources.len()),
            ("stranger_sources", st.strangers.sources()),
            ("resource_pending", pending),
            ("failed_login_ips", failed_login_sources),
            ("log_sources", self.log().tracked()),
        ]
    }
}
