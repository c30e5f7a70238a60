//! The node's metrics, prefix `agentmesh_node_`. Every label value is
//! created at start-up so rates read 0 rather than missing.

mod call_duration;
mod calls;
mod direct;
mod local;
mod routers;
mod upgrade_notices;

use prometheus_client::encoding::EncodeLabelSet;

pub use call_duration::{
    CallDurations, DEFAULT_MAX_CALL_METRIC_SERVICES, OTHER_SERVICE, ServiceResultLabels,
};
pub use calls::CallMetrics;
pub(crate) use direct::path_name as direct_path_name;
pub use direct::{
    CALL_PATHS, DIRECT_CLOSE_REASONS, DirectCounts, DirectMetrics, INBOUND_REFUSED_REASONS,
    NAT_KINDS, NatLabel, PathDirectionLabel, PathLabel, UPGRADE_RESULTS,
};
pub use local::LocalMetrics;
pub use routers::RouterMetrics;
pub use upgrade_notices::{UPGRADE_NOTICE_RESULTS, UpgradeNoticeMetrics};

pub use crate::labels::{ReasonLabel, ResultLabel};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Results of outbound calls.
pub const OUTBOUND_RESULTS: &[&str] = &[
    "ok",
    "not_ready",
    "no_providers",
    "lookup_failed",
    "connect_failed",
    "refused",
    "denied",
    "timeout",
    "shutting_down",
];

/// Results of inbound calls. Before the request is read: `overflow` (calls
/// in any phase at their bound, `--max-inbound-calls` plus
/// `--max-inbound-call-requests`), `caller_share` (every request slot taken
/// and the caller holds its share), `preempted` (the stream's request slot
/// was taken for a caller holding fewer), `silent` (no byte within
/// `--call-first-byte-timeout-ms`). `probe`: an `agentmesh-node ping`
/// judged as a call and granted, answered without the backend.
pub const INBOUND_RESULTS: &[&str] = &[
    "accepted",
    "probe",
    "malformed",
    "unknown_service",
    "bad_credential",
    "revoked",
    "not_allowed",
    "not_granted",
    "too_many_calls",
    "backend_unavailable",
    "shutting_down",
    "overflow",
    "caller_share",
    "preempted",
    "silent",
    "token_share",
];

/// Why a spliced call ended (inbound, and outbound through `--forward` or
/// the Unix socket): both sides finished (`finished`), no byte either way
/// for `--call-idle-timeout-secs` (`idle_timeout`), the connection
/// carrying it closed (`connection_closed`), its stream failed while the
/// connection lived (`stream_error`: reset by the other member), the local
/// TCP side failed (`local_error`); inbound only: its slot was taken for a
/// caller of a token holding fewer (`preempted`), the policy or a
/// revocation no longer allows it (`no_longer_allowed`).
pub const CALL_END_REASONS: &[&str] = &[
    "finished",
    "idle_timeout",
    "connection_closed",
    "stream_error",
    "local_error",
    "preempted",
    "no_longer_allowed",
];
/// Of [`CALL_END_REASONS`], those an outbound call can end with.
pub const OUTBOUND_CALL_END_REASONS: &[&str] = &[
    "finished",
    "idle_timeout",
    "connection_closed",
    "stream_error",
    "local_error",
];

/// Results of auth exchanges with routers.
pub const AUTH_RESULTS: &[&str] = &["admitted", "refused", "busy", "go_away", "error"];
/// Control-plane operations.
pub const CP_OPS: &[&str] = &["enroll", "refresh", "directory"];
/// Go-away outcomes: the reason obeyed, or why not (`ignored`: not from a
/// router that admitted us; `overflow`: too many go-aways in progress,
/// dropped unread; `error`: unreadable or not in time).
pub const GOAWAY_RESULTS: &[&str] = &[
    "draining",
    "overloaded",
    "other",
    "ignored",
    "overflow",
    "error",
];
/// Why a router that sent go-away was let go: K other routers were
/// reserved (`replaced`), or it closed our connection first (`router_closed`).
pub const GOAWAY_RELEASE_REASONS: &[&str] = &["replaced", "router_closed"];
/// How the connection to a router let go while calls streamed through it
/// ended (see `engine::linger`): its last call ended (`calls_done`), its
/// go-away's retry-after ran out first (`deadline`, calls cut), or the
/// router closed it (`router_closed`, at the end of its grace).
pub const GOAWAY_LINGER_ENDS: &[&str] = &["calls_done", "deadline", "router_closed"];
/// Why a held router was given up for another one.
pub const REPLACE_REASONS: &[&str] = &["reservation_refused"];
/// Why an attach to a router was put off by a random wait
/// ([`RouterMetrics::attaches_spread`]).
pub const SPREAD_REASONS: &[&str] = &["replace", "rejoin"];
/// Reasons an inbound yamux stream is dropped.
pub const YAMUX_DROP_REASONS: &[&str] = &["buffer_full"];
/// Why an outbound call was retried on a fresh route ([`Metrics::call_retries`]).
pub const CALL_RETRY_REASONS: &[&str] = &["connect_failed", "stream_failed", "no_providers"];
/// The node's local listeners ([`ListenerLabel`]): the Unix socket, and
/// every `--forward` listener together.
pub const LISTENERS: &[&str] = &["socket", "forward"];
/// Kinds of log line a peer can cause, each logged at most once a minute
/// per peer (`agentmesh_runtime::log_gate`), the rest counted in
/// `agentmesh_node_log_suppressed_total{kind}`: a push or go-away refused
/// as not from a router we are attached to, dropped past the in-flight
/// bound, or unreadable; a go-away obeyed; an inbound call stream refused
/// before its request (`call_refused`, any reason); a connection closed
/// for failed pings; a signed policy ignored (keyed by where it came from).
pub const LOG_KINDS: &[&str] = &[
    "policy_push_not_attached",
    "policy_push_overflow",
    "policy_push_malformed",
    "goaway_ignored",
    "goaway_overflow",
    "goaway_malformed",
    "goaway_obeyed",
    "call_refused",
    "ping_failed",
    "policy_ignored",
];
/// Generic outcomes.
pub const OUTCOMES: &[&str] = &["ok", "error"];
/// Why a directory fetch started ([`Metrics::directory_fetches`]): its
/// interval (or a failure's retry), or a hurry (`engine::directory`): no
/// router held, or short of K with no free candidate.
pub const DIRECTORY_SCHEDULES: &[&str] = &["interval", "no_router", "short_of_k"];

/// `{schedule}`: one of [`DIRECTORY_SCHEDULES`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScheduleLabel {
    /// Why the fetch started.
    pub schedule: &'static str,
}

/// `{direction, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `outbound` or `inbound`.
    pub direction: &'static str,
    /// One of [`OUTBOUND_RESULTS`] or [`INBOUND_RESULTS`].
    pub result: &'static str,
}

/// `{direction, reason}` of a call's end.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallEndLabels {
    /// `outbound` or `inbound`.
    pub direction: &'static str,
    /// One of [`CALL_END_REASONS`].
    pub reason: &'static str,
}

/// `{direction}` for bytes: `sent` or `received`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    /// `sent` or `received`.
    pub direction: &'static str,
}

/// `{listener}`: one of [`LISTENERS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `socket` or `forward`.
    pub listener: &'static str,
}

/// `{op, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The control-plane operation.
    pub op: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// All metrics of one node. Cloning shares the underlying values.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// What the engine counts holding routers.
    pub routers: RouterMetrics,
    /// What calls count.
    pub calls: CallMetrics,
    /// What the local listeners count.
    pub local: LocalMetrics,
    /// What direct connections count (upgrades, inbound refusals, paths).
    pub direct: DirectMetrics,
    /// Notices to routers of circuits upgraded away, by result.
    pub upgrade_notices: UpgradeNoticeMetrics,
    /// Inbound yamux streams dropped before the swarm took them, by reason
    /// (`buffer_full`: more than the muxer buffers were waiting).
    pub yamux_inbound_streams_dropped: Family<ReasonLabel, Counter>,
    /// Key sets from the control plane not taken because they were older
    /// than the one held (same epoch, lower generation: a replica that had
    /// not reloaded its keys yet).
    pub key_sets_stale: Counter,
    /// Calls that ended in the last minutes (for `agentmesh-node status`;
    /// not exported).
    pub(crate) recent: std::sync::Arc<crate::status::recent::RecentCalls>,
    /// The access policy's metrics (`policy_*`, `providers_skipped`).
    pub(crate) policy: crate::policy::metrics::PolicyMetrics,
    /// The gate of log lines a peer can cause ([`LOG_KINDS`]).
    pub(crate) log: agentmesh_runtime::log_gate::LogGate<libp2p::PeerId>,
}

impl Metrics {
    /// Creates the metrics with every label value pre-created.
    pub fn new() -> Self {
        let mut m = Self::default();
        m.policy.precreate();
        m.direct.precreate();
        m.upgrade_notices.precreate();
        m.log.precreate(LOG_KINDS);
        m.policy.log = m.log.sharing();
        for r in OUTBOUND_RESULTS {
            let _ = m.calls.calls.get_or_create(&CallLabels {
                direction: "outbound",
                result: r,
            });
        }
        for r in INBOUND_RESULTS {
            let _ = m.calls.calls.get_or_create(&CallLabels {
                direction: "inbound",
                result: r,
            });
        }
        for reason in CALL_END_REASONS {
            let _ = m.calls.calls_ended.get_or_create(&CallEndLabels {
                direction: "inbound",
                reason,
            });
        }
        for reason in OUTBOUND_CALL_END_REASONS {
            let _ = m.calls.calls_ended.get_or_create(&CallEndLabels {
                direction: "outbound",
                reason,
            });
        }
        for d in ["sent", "received"] {
            let _ = m
                .calls
                .call_bytes
                .get_or_create(&DirectionLabel { direction: d });
        }
        for d in ["outbound", "inbound"] {
            let _ = m
                .calls
                .relayed_idle_closed
                .get_or_create(&DirectionLabel { direction: d });
        }
        for r in AUTH_RESULTS {
            let _ = m.routers.auth.get_or_create(&ResultLabel { result: r });
        }
        for r in GOAWAY_RESULTS {
            let _ = m.routers.goaways.get_or_create(&ResultLabel { result: r });
        }
        for reason in GOAWAY_RELEASE_REASONS {
            let _ = m
                .routers
                .goaway_releases
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in GOAWAY_LINGER_ENDS {
            let _ = m
                .routers
                .goaway_linger_ends
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in REPLACE_REASONS {
            let _ = m
                .routers
                .routers_replaced
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in SPREAD_REASONS {
            let _ = m
                .routers
                .attaches_spread
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in YAMUX_DROP_REASONS {
            let _ = m
                .yamux_inbound_streams_dropped
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in CALL_RETRY_REASONS {
            let _ = m.calls.call_retries.get_or_create(&ReasonLabel { reason });
        }
        for listener in LISTENERS {
            let l = ListenerLabel { listener };
            let _ = m.local.accept_errors.get_or_create(&l);
            let _ = m.local.local_connections_active.get_or_create(&l);
            let _ = m.local.local_connection_waits.get_or_create(&l);
        }
        for schedule in DIRECTORY_SCHEDULES {
            let _ = m
                .routers
                .directory_fetches
                .get_or_create(&ScheduleLabel { schedule });
        }
        for r in OUTCOMES {
            let _ = m
                .routers
                .reservations
                .get_or_create(&ResultLabel { result: r });
            let _ = m
                .routers
                .publishes
                .get_or_create(&ResultLabel { result: r });
            for op in CP_OPS {
                let _ = m
                    .routers
                    .control_plane
                    .get_or_create(&OpLabels { op, result: r });
            }
        }
        m
    }

    /// Registers every metric in `registry` under the prefix `agentmesh_node`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("agentmesh_node");
        self.policy.register(r);
        self.log.register(r);
        self.routers.register(r);
        self.calls.register(r);
        self.local.register(r);
        self.direct.register(r);
        self.upgrade_notices.register(r);
        r.register(
            "yamux_inbound_streams_dropped",
            "Inbound yamux streams dropped before the node took them, by reason",
            self.yamux_inbound_streams_dropped.clone(),
        );
        r.register(
            "key_sets_stale",
            "Key sets from the control plane not taken because they were older than the one held (same epoch, lower generation: a control-plane replica behind the others)",
            self.key_sets_stale.clone(),
        );
    }

    /// Gives at most `cap` services a `service` label of their own in
    /// `call_duration_seconds`, the `known` ones (those this member is
    /// configured to call) first, pre-created. Called once, before the
    /// metrics are shared.
    pub(crate) fn name_call_services<'a>(
        &mut self,
        cap: usize,
        known: impl IntoIterator<Item = &'a str>,
    ) {
        self.calls.durations = CallDurations::new(cap);
        self.calls.durations.precreate(known);
    }

    pub(crate) fn call(&self, direction: &'static str, result: &'static str) {
        self.calls
            .calls
            .get_or_create(&CallLabels { direction, result })
            .inc();
        let ok = matches!(result, "ok" | "accepted" | "probe");
        self.recent
            .record(direction == "outbound", ok, tokio::time::Instant::now());
    }

    /// Counts a spliced call's end.
    pub(crate) fn call_ended(&self, direction: &'static str, reason: &'static str) {
        self.calls
            .calls_ended
            .get_or_create(&CallEndLabels { direction, reason })
            .inc();
    }

    pub(crate) fn cp(&self, op: &'static str, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.routers
            .control_plane
            .get_or_create(&OpLabels { op, result })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_there_from_the_start() {
        let m = Metrics::new();
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        assert!(
            out.contains(
                r#"agentmesh_node_calls_total{direction="inbound",result="not_allowed"} 0"#
            ),
            "{out}"
        );
        assert!(out.contains(
            r#"agentmesh_node_calls_total{direction="outbound",result="no_providers"} 0"#
        ));
        assert!(
            out.contains(r#"agentmesh_node_control_plane_total{op="refresh",result="error"} 0"#)
        );
        assert!(out.contains("agentmesh_node_ready 0"));
        for result in UPGRADE_NOTICE_RESULTS {
            let line = format!(r#"agentmesh_node_upgrade_notices_total{{result="{result}"}} 0"#);
            assert!(out.contains(&line), "{line}");
        }
        assert!(
            out.contains(
                r#"agentmesh_node_calls_ended_total{direction="inbound",reason="connection_closed"} 0"#
            ),
            "{out}"
        );
        assert!(out.contains(
            r#"agentmesh_node_calls_ended_total{direction="outbound",reason="idle_timeout"} 0"#
        ));
        assert!(
            out.contains(
                r#"agentmesh_node_calls_total{direction="inbound",result="token_share"} 0"#
            )
        );
        assert!(
            out.contains(r#"agentmesh_node_call_retries_total{reason="stream_failed"} 0"#),
            "{out}"
        );
        assert!(out.contains("agentmesh_node_auth_connection_retries_total 0"));
        assert!(
            out.contains("agentmesh_node_key_sets_stale_total 0"),
            "{out}"
        );
        assert!(
            out.contains(r#"agentmesh_node_calls_total{direction="inbound",result="probe"} 0"#),
            "{out}"
        );
        for nat in NAT_KINDS {
            assert!(
                out.contains(&format!(
                    r#"agentmesh_node_direct_connections{{nat="{nat}"}} 0"#
                )),
                "{out}"
            );
        }
        assert!(
            out.contains(
                r#"agentmesh_node_call_bytes_by_path_total{path="direct",direction="sent"} 0"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"agentmesh_node_direct_closed_total{reason="timed_out"} 0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"agentmesh_node_goaway_releases_total{reason="router_closed"} 0"#),
            "{out}"
        );
        assert!(
            out.contains(r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"} 0"#),
            "{out}"
        );
        for l in LISTENERS {
            for series in [
                format!(r#"agentmesh_node_accept_errors_total{{listener="{l}"}} 0"#),
                format!(r#"agentmesh_node_local_connections_active{{listener="{l}"}} 0"#),
                format!(r#"agentmesh_node_local_connection_waits_total{{listener="{l}"}} 0"#),
            ] {
                assert!(out.contains(&series), "{series}: {out}");
            }
        }
        assert!(
            out.contains(r#"agentmesh_node_goaways_total{result="overflow"} 0"#),
            "{out}"
        );
        for series in [
            r#"agentmesh_node_upgrade_attempts_total{result="skipped_endpoint_dependent"} 0"#,
            r#"agentmesh_node_inbound_refused_total{reason="no_relayed_connection"} 0"#,
            r#"agentmesh_node_calls_by_path_total{path="direct"} 0"#,
            r#"agentmesh_node_calls_by_path_total{path="relayed"} 0"#,
            "agentmesh_node_port_reuse_fallbacks_total 0",
            "agentmesh_node_port_reuse_adopted_total 0",
            r#"agentmesh_node_inbound_refused_total{reason="handshake_shed_source_full"} 0"#,
            r#"agentmesh_node_inbound_refused_total{reason="handshake_shed_lighter_source"} 0"#,
            r#"agentmesh_node_inbound_refused_total{reason="pending_full"} 0"#,
            "agentmesh_node_direct_handshakes_in_progress 0",
        ] {
            assert!(out.contains(series), "{series}: {out}");
        }
    }
}
