//! The member's policy metrics (prefix `agentmesh_node_`), every label
//! value created at start-up so a rate reads 0 rather than missing.

use agentmesh_proto::enforce::{OwnershipError, PolicyRejection};
use agentmesh_proto::revocations::RevocationsRejection;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::labels::{ReasonLabel, ResultLabel};

/// Outcomes of an inbound `/agentmesh/policy/1` stream: `accepted` (a newer
/// policy taken), `held` (the policy pushed is the one held already),
/// `probe` (a push without the policy: a fallback router asking what we
/// hold, or a router that holds none; its revocation list taken if it
/// verifies and is newer),
/// `ignored` (bad signature, stale, unparsable: see
/// `policy_ignored_total`), `not_attached` (from a peer that is not a
/// router we are attached to: dropped unread), `overflow` (too many pushes
/// in progress: dropped unread), `malformed` (an unreadable or late frame:
/// that stream closes, nothing else).
pub(crate) const PUSH_RESULTS: &[&str] = &[
    "accepted",
    "held",
    "probe",
    "ignored",
    "not_attached",
    "overflow",
    "malformed",
];

/// Why a live inbound call was closed after a policy or revocation change.
pub(crate) const CLOSE_REASONS: &[&str] = &["not_granted", "revoked"];

/// The member's policy metrics. Cloning shares the values.
#[derive(Clone, Debug, Default)]
pub(crate) struct PolicyMetrics {
    /// Version of the policy held (0: none, every call denied).
    pub(crate) version: Gauge,
    /// Epoch of the policy held.
    pub(crate) epoch: Gauge,
    /// Signed policies offered (directory, admission, push) and not taken, by reason.
    pub(crate) ignored: Family<ReasonLabel, Counter>,
    /// Inbound policy push streams by result ([`PUSH_RESULTS`]).
    pub(crate) pushes: Family<ResultLabel, Counter>,
    /// Providers a caller skipped because their record does not prove
    /// ownership of the service, by reason (`OwnershipError::REASONS`).
    pub(crate) providers_skipped: Family<ReasonLabel, Counter>,
    /// Live inbound calls closed because the policy or a revocation no
    /// longer allows them, by reason ([`CLOSE_REASONS`]).
    pub(crate) calls_closed: Family<ReasonLabel, Counter>,
    /// Revocations held now.
    pub(crate) revocations: Gauge,
    /// Generation of the signed revocation list held (0: none).
    pub(crate) revocations_generation: Gauge,
    /// Signed revocation lists offered (directory, admission, push) and
    /// not taken, by reason (`RevocationsRejection::REASONS`): a forged
    /// or rolled-back list from a router shows here.
    pub(crate) revocations_ignored: Family<ReasonLabel, Counter>,
    /// The node's log gate, keyed by where a policy came from (shares
    /// `agentmesh_node_log_suppressed_total`; set by `Metrics::new`).
    pub(crate) log: agentmesh_runtime::log_gate::LogGate<&'static str>,
}

impl PolicyMetrics {
    /// Creates every label value.
    pub(crate) fn precreate(&self) {
        for reason in PolicyRejection::REASONS {
            let _ = self.ignored.get_or_create(&ReasonLabel { reason });
        }
        for reason in RevocationsRejection::REASONS {
            let _ = self
                .revocations_ignored
                .get_or_create(&ReasonLabel { reason });
        }
        for result in PUSH_RESULTS {
            let _ = self.pushes.get_or_create(&ResultLabel { result });
        }
        for reason in OwnershipError::REASONS {
            let _ = self
                .providers_skipped
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in CLOSE_REASONS {
            let _ = self.calls_closed.get_or_create(&ReasonLabel { reason });
        }
    }

    /// Registers them in `r` (already prefixed `agentmesh_node`).
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "policy_version",
            "Version of the access policy held (0: none held, every call is denied)",
            self.version.clone(),
        );
        r.register(
            "policy_epoch",
            "Epoch of the access policy held",
            self.epoch.clone(),
        );
        r.register(
            "policy_ignored",
            "Signed policies offered (directory, admission, push) and not taken, by reason",
            self.ignored.clone(),
        );
        r.register(
            "policy_pushes",
            "Inbound policy push streams by result",
            self.pushes.clone(),
        );
        r.register(
            "providers_skipped",
            "Providers skipped by a caller because their record does not prove ownership of the service, by reason",
            self.providers_skipped.clone(),
        );
        r.register(
            "policy_revocations",
            "Revocation entries held",
            self.revocations.clone(),
        );
        r.register(
            "revocations_generation",
            "Generation of the signed revocation list held (0: none)",
            self.revocations_generation.clone(),
        );
        r.register(
            "revocations_ignored",
            "Signed revocation lists offered (admission, push; the directory's only when not stale) and not taken, by reason: bad_signature (forged or unsigned), stale (a rollback, or a router lagging behind the list held), unknown_key or key_retired, malformed, too_large",
            self.revocations_ignored.clone(),
        );
        r.register(
            "policy_calls_closed",
            "Live inbound calls closed because a new policy or a revocation no longer allows them, by reason",
            self.calls_closed.clone(),
        );
    }

    pub(crate) fn push(&self, result: &'static str) {
        self.pushes.get_or_create(&ResultLabel { result }).inc();
    }
}
