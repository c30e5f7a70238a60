//! The policy metrics (`agentmesh_router_policy_*` and the refusals the
//! policy makes), every label value pre-created so a refusal that never
//! happened reads 0.

use agentmesh_proto::enforce::{OwnershipError, PolicyRejection};
use agentmesh_proto::revocations::RevocationsRejection;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// One label (as `crate::metrics::L1`; repeated so this module, which
/// `crate::metrics` holds, depends on nothing of the router's).
type L1 = [(&'static str, &'static str); 1];

/// Why a circuit was refused or closed by the policy.
pub(crate) const CIRCUIT_REASONS: [&str; 1] = ["not_granted"];

/// How one push to a member ended: `acked` (it holds the version pushed),
/// `ignored` (it answered but kept another version, saying why), `failed`
/// (the stream failed or the member does not speak the protocol),
/// `timeout` (no ack within `--policy-push-deadline-ms`), `dropped` (the
/// member's push was superseded by a newer version before it ran).
pub(crate) const PUSH_OUTCOMES: [&str; 5] = ["acked", "ignored", "failed", "timeout", "dropped"];

/// What a round decided for one member (see `policy::push`): `pushed`
/// (the whole state at once: a primary, or a member that names no slot),
/// `skipped` (its admission answer already carried the state), `probed`
/// (a fallback probed after the delay), `probe_held` (the probe's answer:
/// it holds the version, nothing more sent), `fallback` (it lacked it: the
/// whole state pushed), `probe_failed` (the probe got no answer).
pub(crate) const PUSH_DECISIONS: [&str; 6] = [
    "pushed",
    "skipped",
    "probed",
    "probe_held",
    "fallback",
    "probe_failed",
];

/// Why the router's control-plane Watch ended (or did not open):
/// `stopping` (the replica is stopping: watched again at once on another),
/// `max_age` (the replica moved it at its maximum age: watched again at
/// once on the next replica), `connection_lost` (the connection broke: a
/// replica gone, or no HTTP/2 keep-alive answer within
/// `--control-plane-keepalive-*`), `refused` (another status: an expired
/// credential, a revocation, a limit), `ended` (the stream ended without a
/// status), `open_failed` (no replica opened it within the retry budget).
pub(crate) const WATCH_ENDS: [&str; 6] = [
    "stopping",
    "max_age",
    "connection_lost",
    "refused",
    "ended",
    "open_failed",
];

/// Where a policy offered to the router came from.
pub(crate) const SOURCES: [&str; 2] = ["directory", "watch"];

/// Push lag buckets, seconds: 10 ms .. ~40 s.
fn lag_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.01, 2.0, 13)
}

/// The policy's gauges and counters; clone-cheap handles.
#[derive(Debug, Clone)]
pub(crate) struct PolicyMetrics {
    pub(crate) version: Gauge,
    pub(crate) epoch: Gauge,
    pub(crate) applied: Family<L1, Counter>,
    pub(crate) ignored: Family<L1, Counter>,
    pub(crate) revocations_generation: Gauge,
    pub(crate) revocations_ignored: Family<L1, Counter>,
    pub(crate) catalog_refused: Family<L1, Counter>,
    pub(crate) catalog_dropped: Counter,
    pub(crate) records_without_credential: Counter,
    pub(crate) circuits_refused: Family<L1, Counter>,
    pub(crate) circuits_closed: Family<L1, Counter>,
    pub(crate) push: Family<L1, Counter>,
    pub(crate) push_decisions: Family<L1, Counter>,
    pub(crate) push_lag: Histogram,
    pub(crate) push_in_flight: Gauge,
    pub(crate) watch_up: Gauge,
    pub(crate) watch_events: Counter,
    pub(crate) watch_ends: Family<L1, Counter>,
    /// The router's log gate (see `Metrics::log`).
    pub(crate) log: agentmesh_runtime::log_gate::LogGate<String>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        Self {
            version: Gauge::default(),
            epoch: Gauge::default(),
            applied: Family::default(),
            ignored: Family::default(),
            revocations_generation: Gauge::default(),
            revocations_ignored: Family::default(),
            catalog_refused: Family::default(),
            catalog_dropped: Counter::default(),
            records_without_credential: Counter::default(),
            circuits_refused: Family::default(),
            circuits_closed: Family::default(),
            push: Family::default(),
            push_decisions: Family::default(),
            push_lag: Histogram::new(lag_buckets()),
            push_in_flight: Gauge::default(),
            watch_up: Gauge::default(),
            watch_events: Counter::default(),
            watch_ends: Family::default(),
            log: Default::default(),
        }
    }
}

impl PolicyMetrics {
    /// Every label value at 0, so rates read 0 before anything happens.
    fn precreate_labels(&self) {
        let m = self;
        for reason in PolicyRejection::REASONS {
            let _ = m.ignored.get_or_create(&[("reason", reason)]);
        }
        for reason in RevocationsRejection::REASONS {
            let _ = m.revocations_ignored.get_or_create(&[("reason", reason)]);
        }
        for source in SOURCES {
            let _ = m.applied.get_or_create(&[("source", source)]);
        }
        for reason in OwnershipError::REASONS {
            let _ = m.catalog_refused.get_or_create(&[("reason", reason)]);
        }
        for reason in CIRCUIT_REASONS {
            let _ = m.circuits_refused.get_or_create(&[("reason", reason)]);
            let _ = m.circuits_closed.get_or_create(&[("reason", reason)]);
        }
        let _ = m.circuits_closed.get_or_create(&[("reason", "revoked")]);
        for outcome in PUSH_OUTCOMES {
            let _ = m.push.get_or_create(&[("outcome", outcome)]);
        }
        for decision in PUSH_DECISIONS {
            let _ = m.push_decisions.get_or_create(&[("decision", decision)]);
        }
        for reason in WATCH_ENDS {
            let _ = m.watch_ends.get_or_create(&[("reason", reason)]);
        }
    }

    /// Counts a Watch end (a value of [`WATCH_ENDS`]).
    pub(crate) fn watch_ended(&self, reason: &'static str) {
        self.watch_ends.get_or_create(&[("reason", reason)]).inc();
    }

    /// The counter of one push decision (a value of [`PUSH_DECISIONS`]).
    pub(crate) fn decision(&self, decision: &'static str) -> Counter {
        self.push_decisions
            .get_or_create(&[("decision", decision)])
            .clone()
    }

    /// Registers every metric in `r` with its label values pre-created.
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        m.precreate_labels();
        r.register(
            "agentmesh_router_policy_version",
            "Version of the policy the router holds (0: none, every call denied)",
            m.version.clone(),
        );
        r.register(
            "agentmesh_router_policy_epoch",
            "Epoch of the policy the router holds (0: none)",
            m.epoch.clone(),
        );
        r.register(
            "agentmesh_router_policy_applied",
            "Policy versions taken, by where they came from (directory poll or watch)",
            m.applied.clone(),
        );
        r.register(
            "agentmesh_router_policy_ignored",
            "Signed policies offered to the router and not taken, by reason (the held one stays)",
            m.ignored.clone(),
        );
        r.register(
            "agentmesh_router_revocations_generation",
            "Generation of the signed revocation list the router holds and forwards (0: none)",
            m.revocations_generation.clone(),
        );
        r.register(
            "agentmesh_router_revocations_ignored",
            "Signed revocation lists from the control plane not taken, by reason (the held one \
             stays; an older copy of the generation held is not counted)",
            m.revocations_ignored.clone(),
        );
        r.register(
            "agentmesh_router_catalog_refused",
            "Published records refused because they do not prove their provider owns every \
             service they name, by reason",
            m.catalog_refused.clone(),
        );
        r.register(
            "agentmesh_router_catalog_policy_dropped",
            "Stored records dropped because a new policy or revocation no longer lets their \
             provider own them",
            m.catalog_dropped.clone(),
        );
        r.register(
            "agentmesh_router_catalog_records_without_credential",
            "Published records taken that carry no credential (a provider from before \
             credentials in records), their ownership checked against the publisher's \
             admission claims",
            m.records_without_credential.clone(),
        );
        r.register(
            "agentmesh_router_policy_circuits_refused",
            "Circuits refused because the policy grants the source nothing the destination owns",
            m.circuits_refused.clone(),
        );
        r.register(
            "agentmesh_router_policy_circuits_closed",
            "Live circuits closed because a new policy (not_granted) or a revocation no longer \
             allows them",
            m.circuits_closed.clone(),
        );
        r.register(
            "agentmesh_router_policy_push",
            "Policy pushes to attached members, by outcome",
            m.push.clone(),
        );
        r.register(
            "agentmesh_router_policy_push_decisions",
            "What each push round decided per attached member: pushed at once (primary or no \
             slot named), skipped (its admission carried the state), probed (a fallback, after \
             --policy-push-fallback-delay-ms), probe_held, fallback (it lacked the version: \
             pushed), probe_failed",
            m.push_decisions.clone(),
        );
        r.register(
            "agentmesh_router_policy_push_lag_seconds",
            "Time from the router taking a policy version (or revocation list) to a member's ack",
            m.push_lag.clone(),
        );
        r.register(
            "agentmesh_router_policy_push_in_flight",
            "Policy push streams open now (at most --policy-push-concurrency)",
            m.push_in_flight.clone(),
        );
        r.register(
            "agentmesh_router_policy_watch_up",
            "1 while the router holds a Watch stream on the control plane, else 0 (directory poll)",
            m.watch_up.clone(),
        );
        r.register(
            "agentmesh_router_policy_watch_events",
            "Events received on the control-plane Watch stream",
            m.watch_events.clone(),
        );
        r.register(
            "agentmesh_router_policy_watch_ends",
            "Control-plane Watch streams ended, by reason: stopping and max_age (the control \
             plane moved it: watched again at once), connection_lost (a replica gone or \
             silent past the keep-alive), refused, ended, open_failed (backed off)",
            m.watch_ends.clone(),
        );
        m
    }
}
