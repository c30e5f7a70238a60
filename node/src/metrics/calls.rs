//! What calls count, both directions: results, ends, bytes, retries, idle relayed connections closed,
//! and how long outbound calls take to set up (`call_duration`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::*;

/// What calls count, both directions: results, ends, bytes, retries, idle relayed connections closed.
#[derive(Clone, Debug, Default)]
pub struct CallMetrics {
    /// Calls by direction and result.
    pub calls: Family<CallLabels, Counter>,
    /// Inbound calls being served.
    pub inbound_calls_active: Gauge,
    /// Spliced calls that ended, by direction and reason ([`CALL_END_REASONS`]).
    pub calls_ended: Family<CallEndLabels, Counter>,
    /// Call payload bytes by direction (as seen by this node).
    pub call_bytes: Family<DirectionLabel, Counter>,
    /// Outbound call retries on a fresh route after a route failure (up to 3 per call),
    /// by reason ([`CALL_RETRY_REASONS`]).
    pub call_retries: Family<ReasonLabel, Counter>,
    /// Relayed connections closed because no call used them for
    /// `--relayed-idle-secs`, by `direction` (`outbound`: we dialed the
    /// circuit, `inbound`: a caller did).
    pub relayed_idle_closed: Family<DirectionLabel, Counter>,
    /// Outbound call set-up time by service (bounded) and result.
    pub durations: CallDurations,
}

impl CallMetrics {
    /// Registers each metric in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register("calls", "Calls by direction and result", self.calls.clone());
        r.register(
            "inbound_calls_active",
            "Inbound calls being served",
            self.inbound_calls_active.clone(),
        );
        r.register(
            "calls_ended",
            "Spliced calls (inbound; --forward and the Unix socket) that ended, by direction and reason (finished, idle_timeout, connection_closed, stream_error, local_error; inbound also preempted, no_longer_allowed)",
            self.calls_ended.clone(),
        );
        r.register(
            "call_bytes",
            "Call payload bytes by direction",
            self.call_bytes.clone(),
        );
        r.register(
            "call_retries",
            "Outbound call retries on a fresh route after a route failure (at most 3 per call, within its budget), by reason",
            self.call_retries.clone(),
        );
        r.register(
            "relayed_idle_closed",
            "Relayed connections closed after --relayed-idle-secs without a call, by direction",
            self.relayed_idle_closed.clone(),
        );
        self.durations.register(r);
    }
}
