//! The router's metrics (`agentmesh_router_*`), every label value created at
//! startup so rates read 0 before anything happens: the labels this module
//! knows here, those of a module's own vocabulary (go-away reasons, trim
//! reasons, provider-search outcomes) by that module, all before the first
//! task starts.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

mod catalog;
mod cp;
mod goaway;
mod relay;

use crate::admission::Purpose;
use crate::admission::conns;
use catalog::CatalogMetrics;
use cp::CpMetrics;
use goaway::GoAwayMetrics;
use relay::RelayMetrics;
#[cfg(test)]
pub(crate) use relay::UPGRADE_REFUSALS;

/// Two labels.
pub(crate) type L2 = [(&'static str, &'static str); 2];
/// One label.
pub(crate) type L1 = [(&'static str, &'static str); 1];
/// Three labels.
pub(crate) type L3 = [(&'static str, &'static str); 3];

/// Every auth result label value.
pub(crate) const AUTH_RESULTS: &[&str] = &[
    "admitted",
    "malformed",
    "bad_signature",
    "unknown_key",
    "expired",
    "not_yet_valid",
    "wrong_peer",
    "revoked",
    "wrong_role",
    "no_keys",
    "io",
    // No byte within --auth-first-byte-timeout-ms: a failed login.
    "silent",
    "go_away",
    // Waited for an auth slot past --auth-queue-wait-ms (or its queue place
    // was taken): answered busy with a retry-after, the request unread; or
    // verified, but the swarm loop did not record the admission within
    // --state-command-deadline-ms: answered busy too.
    "busy",
    // Verified, but the peer had left meanwhile (no answer, no admission).
    "disconnected",
];

/// Why the router closed a connection or dropped an admission:
/// `disconnected` is an admission whose peer had no connection left (found
/// by the swarm loop's sweep; nothing to close).
pub(crate) const CLOSE_REASONS: &[&str] = &[
    "auth_deadline",
    "revoked",
    "expired",
    "disconnected",
    "refused_streams",
    "evicted_by_newcomer",
    "ping_failed",
];

/// Catalog operations.
pub(crate) const CATALOG_OPS: &[&str] =
    &["publish", "withdraw", "lookup", "local_lookup", "upgraded"];
/// The op label of catalog requests that could not be read or name no
/// operation (only ever with result `malformed`).
pub(crate) const UNKNOWN_OP: &str = "unknown";
/// Catalog results.
pub(crate) const CATALOG_RESULTS: &[&str] = &["ok", "partial", "refused", "malformed", "error"];

/// Results of control-plane calls.
pub(crate) const CP_RESULTS: &[&str] = &["ok", "error"];

/// Per-peer and per-connection tables whose entries
/// `agentmesh_router_table_entries{table}` shows (each must empty when the
/// peers leave).
pub(crate) const TABLES: &[&str] = &[
    "admission",
    "connections",
    "dialed_addrs",
    "reservations",
    "catalog_providers",
    "provider_searches",
    "resource_peers",
    "resource_sources",
    "stranger_sources",
    "resource_pending",
    "failed_login_ips",
    "log_sources",
];

/// Refusals on the metrics listener, (endpoint, reason): `POST /drain`
/// from a peer that is not loopback (see `http::drain_allowed`).
pub(crate) const HTTP_REFUSALS: &[(&str, &str)] = &[("drain", "not_loopback")];

/// Registers the sizing the router computed at startup (watermarks and the
/// relay reservation cap, from flags or the memory budget) as gauges, so
/// operators see the limits the router enforces without reading its log:
/// `agentmesh_router_watermark_members{level="high|low"}` and
/// `agentmesh_router_relay_max_reservations`.
pub(crate) fn register_sizing(registry: &mut Registry, sizing: &crate::config::Sizing) {
    let watermark = Family::<L1, Gauge>::default();
    watermark
        .get_or_create(&[("level", "high")])
        .set(i64::from(sizing.high_watermark));
    watermark
        .get_or_create(&[("level", "low")])
        .set(i64::from(sizing.low_watermark));
    registry.register(
        "agentmesh_router_watermark_members",
        "Effective watermarks, admitted members: above high the router trims down to low",
        watermark,
    );
    let reservations = Gauge::<i64>::default();
    reservations.set(i64::try_from(sizing.relay_max_reservations).unwrap_or(i64::MAX));
    registry.register(
        "agentmesh_router_relay_max_reservations",
        "Effective cap on relay reservations the router holds at once",
        reservations,
    );
}

/// All router metrics; clone-cheap handles onto one registry.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    /// The access policy's metrics (`crate::policy_metrics`).
    pub(crate) policy: crate::policy_metrics::PolicyMetrics,
    /// The relay's (`relay.rs`).
    pub(crate) relay: RelayMetrics,
    /// Go-aways, trims and paced waves (`goaway.rs`).
    pub(crate) goaway: GoAwayMetrics,
    /// The control-plane link's (`cp.rs`).
    pub(crate) cp: CpMetrics,
    /// The catalog's (`catalog.rs`).
    pub(crate) catalog: CatalogMetrics,
    pub(crate) attached_members: Gauge,
    pub(crate) transit_connections: Gauge,
    pub(crate) admitted_routers: Gauge,
    pub(crate) connections: Family<L2, Gauge>,
    pub(crate) connections_closed: Family<L1, Counter>,
    pub(crate) auth: Family<L2, Counter>,
    pub(crate) table_entries: Family<L1, Gauge>,
    pub(crate) revocations_enforced: Counter,
    pub(crate) refused: Family<L3, Counter>,
    pub(crate) ready: Gauge,
    pub(crate) draining: Gauge,
    pub(crate) http_refused: Family<L2, Counter>,
    /// The router's one log gate, created with the router's shared state
    /// (`Shared::new`) and handed to the resource manager, which registers
    /// it (a default one in tests that build metrics alone).
    pub(crate) log: agentmesh_runtime::log_gate::LogGate<String>,
}

impl Metrics {
    /// Registers every metric in `registry` and pre-creates label values.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let r = registry;
        let m = Self {
            relay: RelayMetrics::register(r),
            goaway: GoAwayMetrics::register(r),
            cp: CpMetrics::register(r),
            catalog: CatalogMetrics::register(r),
            ..Self::default()
        };
        r.register(
            "agentmesh_router_attached_members",
            "Members admitted with purpose attach",
            m.attached_members.clone(),
        );
        r.register(
            "agentmesh_router_transit_connections",
            "Peers admitted with purpose transit",
            m.transit_connections.clone(),
        );
        r.register(
            "agentmesh_router_admitted_routers",
            "Routers admitted into the router mesh",
            m.admitted_routers.clone(),
        );
        r.register(
            "agentmesh_router_connections",
            "Open connections by state and direction",
            m.connections.clone(),
        );
        r.register(
            "agentmesh_router_connections_closed",
            "Connections the router closed, by reason; disconnected counts admissions \
             dropped because their peer had no connection left; refused_streams: a \
             stranger's connection past --stranger-refused-streams-max refused streams; \
             evicted_by_newcomer: a source's oldest unauthenticated connection, closed for a \
             newcomer from the same source at --unauthenticated-connections-per-ip; \
             ping_failed: a connection whose ping went unanswered within --ping-timeout-secs \
             (a dead link)",
            m.connections_closed.clone(),
        );
        r.register(
            "agentmesh_router_auth",
            "Auth requests by purpose and result",
            m.auth.clone(),
        );
        r.register(
            "agentmesh_router_table_entries",
            "Entries in each per-peer or per-connection table (0 once every peer has left, \
             except failed_login_ips and log_sources, which age out)",
            m.table_entries.clone(),
        );
        for t in TABLES {
            let _ = m.table_entries.get_or_create(&[("table", t)]);
        }
        r.register(
            "agentmesh_router_revocations_enforced",
            "Admitted peers dropped because they were revoked",
            m.revocations_enforced.clone(),
        );
        r.register(
            "agentmesh_router_refused",
            "Requests refused for lack of a resource, by resource, scope and protocol",
            m.refused.clone(),
        );
        r.register(
            "agentmesh_router_ready",
            "1 when the router is ready",
            m.ready.clone(),
        );
        r.register(
            "agentmesh_router_draining",
            "1 while the router drains",
            m.draining.clone(),
        );
        r.register(
            "agentmesh_router_http_requests_refused",
            "Requests on the metrics listener refused, by endpoint and reason \
             (not_loopback: POST /drain from an address that is not loopback, \
             see --drain-http-allow-remote)",
            m.http_refused.clone(),
        );
        for (endpoint, reason) in HTTP_REFUSALS {
            let _ = m
                .http_refused
                .get_or_create(&[("endpoint", endpoint), ("reason", reason)]);
        }

        for s in conns::STATES {
            for d in conns::DIRECTIONS {
                let _ = m
                    .connections
                    .get_or_create(&[("state", s), ("direction", d)]);
            }
        }
        for r in CLOSE_REASONS {
            let _ = m.connections_closed.get_or_create(&[("reason", r)]);
        }
        for p in Purpose::ALL {
            for res in AUTH_RESULTS {
                let _ = m
                    .auth
                    .get_or_create(&[("purpose", p.as_str()), ("result", res)]);
            }
        }
        m
    }

    /// Counts one auth result.
    pub(crate) fn auth_result(&self, purpose: Purpose, result: &'static str) {
        self.auth
            .get_or_create(&[("purpose", purpose.as_str()), ("result", result)])
            .inc();
    }

    /// Counts one request for a service's provider routers by its outcome label.
    pub(crate) fn provider_search(&self, outcome: &'static str) {
        self.catalog
            .provider_searches
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Counts one catalog request.
    pub(crate) fn catalog(&self, op: &'static str, result: &'static str) {
        self.catalog
            .requests
            .get_or_create(&[("op", op), ("result", result)])
            .inc();
    }

    /// Counts one refused request on the metrics listener.
    pub(crate) fn http_refused(&self, endpoint: &'static str, reason: &'static str) {
        self.http_refused
            .get_or_create(&[("endpoint", endpoint), ("reason", reason)])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_labels_of_ghosts_unknown_catalog_ops_refused_announcements_and_strangers_read_zero() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let budgets = crate::resources::budgets_of(&Default::default(), 64 << 20);
        let _resources = crate::resources::ResourceManager::new(
            budgets,
            &mut registry,
            m.refused.clone(),
            crate::resources::Deps::nobody(),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for series in [
            r#"agentmesh_router_auth_total{purpose="attach",result="disconnected"} 0"#,
            r#"agentmesh_router_connections_closed_total{reason="disconnected"} 0"#,
            r#"agentmesh_router_catalog_requests_total{op="unknown",result="malformed"} 0"#,
            "agentmesh_router_catalog_provide_failures_total 0",
            r#"agentmesh_router_refused_total{resource="stream",scope="connection",protocol="none"} 0"#,
            r#"agentmesh_router_http_requests_refused_total{endpoint="drain",reason="not_loopback"} 0"#,
            // What strangers meet before admission (issue 17).
            r#"agentmesh_router_auth_total{purpose="attach",result="silent"} 0"#,
            r#"agentmesh_router_slots_refused_total{budget="auth",reason="source_share"} 0"#,
            r#"agentmesh_router_slots_refused_total{budget="catalog",reason="not_admitted"} 0"#,
            r#"agentmesh_router_handshakes_refused_total{reason="budget_share"} 0"#,
            r#"agentmesh_router_handshakes_refused_total{reason="blocked"} 0"#,
            r#"agentmesh_router_handshakes_shed_total{reason="source_full",progress="none"} 0"#,
            r#"agentmesh_router_handshakes_shed_total{reason="lighter_source",progress="partial"} 0"#,
            "agentmesh_router_handshakes_in_progress 0",
            r#"agentmesh_router_slots_preempted_total{budget="auth"} 0"#,
            "agentmesh_router_handshakes_capacity 1024",
            r#"agentmesh_router_failed_logins_total{reason="silent"} 0"#,
            "agentmesh_router_failed_login_blocks_total 0",
            r#"agentmesh_router_refused_total{resource="memory",scope="unauthenticated",protocol="auth"} 0"#,
            r#"agentmesh_router_refused_total{resource="memory",scope="source",protocol="none"} 0"#,
            r#"agentmesh_router_table_entries{table="stranger_sources"} 0"#,
            // Log lines held back, one series per kind (the log gate).
            r#"agentmesh_router_log_suppressed_total{kind="auth_refused"} 0"#,
            r#"agentmesh_router_log_suppressed_total{kind="resource_refused"} 0"#,
            r#"agentmesh_router_log_suppressed_total{kind="record_refused"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == series), "{series} missing");
        }
    }
}
