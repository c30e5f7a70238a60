//! Policy and watch metrics: the version in force, applies by result,
//! open watch streams, events sent and streams ended by why.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{POLICY_APPLY_RESULTS, ReasonLabel, ResultLabel, WATCH_END_REASONS};

#[derive(Clone)]
pub(super) struct PolicyMetrics {
    pub(super) policy_version: Gauge,
    pub(super) policy_applies: Family<ResultLabel, Counter>,
    pub(super) watchers: Gauge,
    pub(super) watch_events: Counter,
    pub(super) watch_ends: Family<ReasonLabel, Counter>,
}

impl PolicyMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            policy_version: Gauge::default(),
            policy_applies: Family::default(),
            watchers: Gauge::default(),
            watch_events: Counter::default(),
            watch_ends: Family::default(),
        };
        r.register(
            "policy_version",
            "Version of the policy in force (0: none applied, every call denied)",
            m.policy_version.clone(),
        );
        r.register(
            "policy_applies",
            "Policy applies by result: applied (a new version), unchanged (the text in force), \
             superseded (a start-up --policy file holding a text replaced since; nothing \
             applied), refused (did not pass its checks; nothing applied)",
            m.policy_applies.clone(),
        );
        r.register(
            "watchers",
            "Watch streams open (routers holding the push of policy, revocations and keys)",
            m.watchers.clone(),
        );
        r.register(
            "watch_events",
            "Watch events sent, over every stream (the first full event of each stream included)",
            m.watch_events.clone(),
        );
        r.register(
            "watch_ends",
            "Watch streams ended, by reason: stopping (this replica is stopping; the router was \
             told to watch again elsewhere), max_age (moved at --watch-max-age-secs so watches \
             spread over replicas), credential_expired, revoked (the router itself), closed (the \
             router or its connection went away)",
            m.watch_ends.clone(),
        );
        for reason in WATCH_END_REASONS.iter().copied() {
            let _ = m.watch_ends.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        for r in POLICY_APPLY_RESULTS.iter().copied() {
            let _ = m
                .policy_applies
                .get_or_create(&ResultLabel { result: r.into() });
        }
        m
    }
}
