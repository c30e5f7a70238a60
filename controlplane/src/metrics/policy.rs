//! Policy and watch metrics: the version in force, applies by result,
//! open watch streams and events sent.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{POLICY_APPLY_RESULTS, ResultLabel};

#[derive(Clone)]
pub(super) struct PolicyMetrics {
    pub(super) policy_version: Gauge,
    pub(super) policy_applies: Family<ResultLabel, Counter>,
    pub(super) watchers: Gauge,
    pub(super) watch_events: Counter,
}

impl PolicyMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            policy_version: Gauge::default(),
            policy_applies: Family::default(),
            watchers: Gauge::default(),
            watch_events: Counter::default(),
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
        for r in POLICY_APPLY_RESULTS.iter().copied() {
            let _ = m
                .policy_applies
                .get_or_create(&ResultLabel { result: r.into() });
        }
        m
    }
}
