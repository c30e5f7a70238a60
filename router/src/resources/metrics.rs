//! Resource metrics: memory in use and budget (the strangers' pool too),
//! live streams by protocol and direction, the slot budgets, failed logins
//! and blocks, and the refusal counter's label values (all pre-created).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::budget::{Proto, Refusal, Resource, Scope};
use super::logins::FAILED_LOGIN_REASONS;
use super::slots::SlotMetrics;

/// `agentmesh_router_refused_total` labels: resource, scope, protocol.
pub(crate) type RefusedLabels = [(&'static str, &'static str); 3];
type StreamLabels = [(&'static str, &'static str); 2];

/// The protocol label of refusals that concern no protocol (connections).
pub(crate) const NO_PROTOCOL: &str = "none";

/// The refusal of an inbound stream dropped by the muxer before any
/// protocol was negotiated, because the connection's buffer of streams not
/// yet taken by the swarm was full.
pub(crate) const BUFFER_FULL_REFUSAL: RefusedLabels = [
    ("resource", "stream"),
    ("scope", "connection"),
    ("protocol", NO_PROTOCOL),
];

/// Directions of streams.
pub(crate) const DIRECTIONS: [&str; 2] = ["inbound", "outbound"];

/// Directions of the bytes a circuit carries: from its source towards its
/// destination, and back.
pub(crate) const RELAYED_DIRECTIONS: [&str; 2] = ["to_destination", "to_source"];

/// Gauges and counters of the resource manager.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResourceMetrics {
    pub(crate) memory_in_use: Gauge,
    pub(crate) memory_budget: Gauge,
    pub(crate) memory_per_peer_max: Gauge,
    pub(crate) streams: Family<StreamLabels, Gauge>,
    pub(crate) connections_charged: Gauge,
    pub(crate) stop_handshakes: Gauge,
    pub(crate) ipv6_source_prefix_len: Gauge,
    pub(crate) unauthenticated_memory_in_use: Gauge,
    pub(crate) unauthenticated_memory_budget: Gauge,
    pub(crate) failed_logins: Family<[(&'static str, &'static str); 1], Counter>,
    pub(crate) failed_login_blocks: Counter,
    pub(crate) slots: SlotMetrics,
    pub(crate) refused: Family<RefusedLabels, Counter>,
    pub(crate) relayed_bytes: Family<[(&'static str, &'static str); 1], Counter>,
}

impl ResourceMetrics {
    /// Registers the gauges in `registry`; `refused` is the router's existing
    /// `agentmesh_router_refused` family, whose every label combination this
    /// pre-creates.
    pub(crate) fn new(registry: &mut Registry, refused: Family<RefusedLabels, Counter>) -> Self {
        let m = Self {
            refused,
            ..Default::default()
        };
        registry.register(
            "agentmesh_router_memory_in_use_bytes",
            "Memory charged to live connections and streams",
            m.memory_in_use.clone(),
        );
        registry.register(
            "agentmesh_router_memory_budget_bytes",
            "Memory budget the charges may add up to",
            m.memory_budget.clone(),
        );
        registry.register(
            "agentmesh_router_memory_per_peer_max_bytes",
            "Memory the inbound streams of one peer may hold (--memory-per-peer-max-percent \
             of the budget, at least 1 MiB); beyond, its new streams are refused (resource memory, \
             scope peer)",
            m.memory_per_peer_max.clone(),
        );
        registry.register(
            "agentmesh_router_streams",
            "Live streams by protocol and direction (as seen by the muxer)",
            m.streams.clone(),
        );
        registry.register(
            "agentmesh_router_connections_charged",
            "Live connections charged to the memory budget",
            m.connections_charged.clone(),
        );
        registry.register(
            "agentmesh_router_relay_stop_handshakes",
            "Relay STOP handshakes in flight (circuits being set up towards their \
             destination), all connections; capped per connection by \
             --relay-stop-handshakes-per-connection",
            m.stop_handshakes.clone(),
        );
        registry.register(
            "agentmesh_router_ipv6_source_prefix_len",
            "Bits of an IPv6 source address the per-source limits count under \
             (--ipv6-source-prefix-len; 128 = per address; IPv4 counts per address)",
            m.ipv6_source_prefix_len.clone(),
        );
        registry.register(
            "agentmesh_router_unauthenticated_memory_in_use_bytes",
            "Memory charged to the connections and inbound streams of peers not admitted \
             (their own pool, moved out when a peer is admitted)",
            m.unauthenticated_memory_in_use.clone(),
        );
        registry.register(
            "agentmesh_router_unauthenticated_memory_budget_bytes",
            "Memory the peers not admitted may hold together (--unauthenticated-memory-max-percent \
             of the budget); beyond, refused (resource memory, scope unauthenticated; scope \
             source past one source's share once half is used)",
            m.unauthenticated_memory_budget.clone(),
        );
        registry.register(
            "agentmesh_router_failed_logins",
            "Failed logins by reason (silent: an auth stream that sent no byte within \
             --auth-first-byte-timeout-ms), counted against their source",
            m.failed_logins.clone(),
        );
        for r in FAILED_LOGIN_REASONS {
            let _ = m.failed_logins.get_or_create(&[("reason", r)]);
        }
        registry.register(
            "agentmesh_router_failed_login_blocks",
            "Sources blocked for --failed-login-block-secs after \
             --failed-logins-per-ip-per-minute failed logins",
            m.failed_login_blocks.clone(),
        );
        registry.register(
            "agentmesh_router_relayed_bytes",
            "Bytes this router copied between the two ends of its circuits once each \
             circuit's STOP handshake was answered, by direction (to_destination: \
             written to the circuit's destination; to_source: read from the destination \
             for its source); counted on the destination's stream, so each byte once",
            m.relayed_bytes.clone(),
        );
        for d in RELAYED_DIRECTIONS {
            let _ = m.relayed_bytes.get_or_create(&[("direction", d)]);
        }
        m.register_slots(registry);
        m.slots.precreate();
        m.precreate_labels();
        m
    }

    /// Registers the slot budgets' metrics.
    fn register_slots(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "agentmesh_router_slots_refused",
            "Slots of a budget strangers reach (auth, catalog: streams served; handshake: \
             connections in their handshake) refused, by reason: source_share (all taken, \
             the source holds its fair share), not_admitted (catalog streams of peers not admitted)",
            m.slots.refused.clone(),
        );
        registry.register(
            "agentmesh_router_slots_preempted",
            "Slots taken from the heaviest source (its oldest) for a source holding fewer, \
             by budget; the holder's stream is closed or its handshake denied",
            m.slots.preempted.clone(),
        );
        registry.register(
            "agentmesh_router_slots_in_use",
            "Slots held, by budget",
            m.slots.in_use.clone(),
        );
        registry.register(
            "agentmesh_router_slots_capacity",
            "Slots of each budget (--auth-max-inflight-streams, --catalog-max-inflight-streams, \
             --pending-connections-max, --auth-queue-max-streams)",
            m.slots.capacity.clone(),
        );
        registry.register(
            "agentmesh_router_slots_waits",
            "Requests that waited for a slot, by budget and how the wait ended: served, \
             timed_out (--auth-queue-wait-ms passed: answered busy with a retry-after), \
             preempted (its queue place taken for a source holding fewer: answered busy), \
             full (no queue place for its source: dropped unanswered)",
            m.slots.waits.clone(),
        );
    }

    /// Every stream and refusal label at 0.
    fn precreate_labels(&self) {
        let m = self;
        for p in Proto::ALL {
            for d in DIRECTIONS {
                let _ = m
                    .streams
                    .get_or_create(&[("protocol", p.as_str()), ("direction", d)]);
            }
        }
        for r in Resource::ALL {
            for s in Scope::ALL {
                let _ = m.refused.get_or_create(&[
                    ("resource", r.as_str()),
                    ("scope", s.as_str()),
                    ("protocol", NO_PROTOCOL),
                ]);
                for p in Proto::ALL {
                    let _ = m.refused.get_or_create(&[
                        ("resource", r.as_str()),
                        ("scope", s.as_str()),
                        ("protocol", p.as_str()),
                    ]);
                }
            }
        }
    }

    /// Counts one refusal.
    pub(crate) fn refused(&self, r: Refusal, protocol: &'static str) {
        self.refused
            .get_or_create(&[
                ("resource", r.resource.as_str()),
                ("scope", r.scope.as_str()),
                ("protocol", protocol),
            ])
            .inc();
    }

    /// The relayed-byte counters: towards the destination, towards the source.
    pub(crate) fn relayed_counters(&self) -> (Counter, Counter) {
        let get = |d| {
            self.relayed_bytes
                .get_or_create(&[("direction", d)])
                .clone()
        };
        (get(RELAYED_DIRECTIONS[0]), get(RELAYED_DIRECTIONS[1]))
    }

    /// The live-stream gauge of `p` in direction `inbound`.
    pub(crate) fn stream_gauge(&self, p: Proto, inbound: bool) -> Gauge {
        let d = if inbound {
            DIRECTIONS[0]
        } else {
            DIRECTIONS[1]
        };
        self.streams
            .get_or_create(&[("protocol", p.as_str()), ("direction", d)])
            .clone()
    }
}
