//! `agentmesh_node_call_duration_seconds{service, result}`: how long an
//! outbound call took to set up (lookup, route, circuit, the provider's
//! answer), from the moment it was asked for to a stream or an error, per
//! service and result.
//!
//! The `service` label is bounded: the services this member is configured
//! to call (`--forward`) are named from the start, every result pre-created;
//! a service first called through the Unix socket or by an embedder gets a
//! label of its own while fewer than `--max-call-metric-services` have one,
//! and is counted as `other` after that (also a name that is not a plain
//! service name: over 128 bytes, or characters other than letters, digits
//! and `._-/:`). The `other` series shows the cap biting; the set is never
//! emptied, so a service keeps its series for the node's life.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::OUTBOUND_RESULTS;

/// Services with a label of their own by default (`--max-call-metric-services`).
pub const DEFAULT_MAX_CALL_METRIC_SERVICES: usize = 64;
/// The `service` label of every service past the cap.
pub const OTHER_SERVICE: &str = "other";
/// Longest service name that gets a label of its own, bytes.
const MAX_LABEL_NAME_BYTES: usize = 128;

/// `{service, result}`: a bounded service name and one of
/// [`OUTBOUND_RESULTS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceResultLabels {
    /// The service called, or [`OTHER_SERVICE`].
    pub service: String,
    /// One of [`OUTBOUND_RESULTS`].
    pub result: &'static str,
}

type Histograms = Family<ServiceResultLabels, Histogram, fn() -> Histogram>;

/// 1 ms to about 33 s, doubling: a call set-up over a circuit on loopback
/// takes a few ms; one that spends its whole budget (connect + call
/// timeout, 20 s by default) lands in the last buckets.
fn new_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The call-duration histograms and the services that have a label of
/// their own. Cloning shares both.
#[derive(Clone, Debug)]
pub struct CallDurations {
    histograms: Histograms,
    /// Services with a label of their own; at most `cap`. Its one writer
    /// is [`CallDurations::observe`] (under the lock).
    named: Arc<Mutex<HashSet<String>>>,
    cap: usize,
}

impl Default for CallDurations {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CALL_METRIC_SERVICES)
    }
}

impl CallDurations {
    /// Empty, naming at most `cap` services.
    pub fn new(cap: usize) -> Self {
        Self {
            histograms: Family::new_with_constructor(new_histogram as fn() -> Histogram),
            named: Arc::new(Mutex::new(HashSet::new())),
            cap,
        }
    }

    /// Names `known` services (the ones this member is configured to
    /// call), while the cap allows, with every result pre-created, and
    /// pre-creates `{service="other", result="ok"}`.
    pub(crate) fn precreate<'a>(&self, known: impl IntoIterator<Item = &'a str>) {
        for service in known {
            let label = self.label(service);
            if label == OTHER_SERVICE {
                continue;
            }
            for result in OUTBOUND_RESULTS {
                let _ = self.histograms.get_or_create(&ServiceResultLabels {
                    service: label.clone(),
                    result,
                });
            }
        }
        let _ = self.histograms.get_or_create(&ServiceResultLabels {
            service: OTHER_SERVICE.to_string(),
            result: "ok",
        });
    }

    /// Records one call to `service` that ended with `result` after `took`.
    pub(crate) fn observe(&self, service: &str, result: &'static str, took: Duration) {
        let service = self.label(service);
        self.histograms
            .get_or_create(&ServiceResultLabels { service, result })
            .observe(took.as_secs_f64());
    }

    /// The label `service` is counted under: its name if it has one or
    /// may still take one, else [`OTHER_SERVICE`].
    fn label(&self, service: &str) -> String {
        if !labelable(service) {
            return OTHER_SERVICE.to_string();
        }
        let mut named = self.named.lock();
        if named.contains(service) {
            return service.to_string();
        }
        if named.len() < self.cap {
            named.insert(service.to_string());
            return service.to_string();
        }
        OTHER_SERVICE.to_string()
    }

    /// Registers the histograms in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "call_duration_seconds",
            "Outbound call set-up time (lookup, route, circuit, the provider's answer), by service (at most --max-call-metric-services named, the rest \"other\") and result",
            self.histograms.clone(),
        );
    }
}

/// Whether `service` is a plain service name that may be a label value.
fn labelable(service: &str) -> bool {
    !service.is_empty()
        && service != OTHER_SERVICE
        && service.len() <= MAX_LABEL_NAME_BYTES
        && service
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(d: &CallDurations) -> String {
        let mut reg = Registry::default();
        d.register(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        out
    }

    fn count(text: &str, service: &str, result: &str) -> Option<u64> {
        let key =
            format!("call_duration_seconds_count{{service=\"{service}\",result=\"{result}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&key))?;
        line[key.len()..].trim().parse().ok()
    }

    #[test]
    fn configured_services_are_there_from_the_start_with_every_result() {
        let d = CallDurations::new(4);
        d.precreate(["payments/api", "echo"]);
        let t = text(&d);
        for r in OUTBOUND_RESULTS {
            assert_eq!(count(&t, "payments/api", r), Some(0), "{r}: {t}");
            assert_eq!(count(&t, "echo", r), Some(0), "{r}: {t}");
        }
        assert_eq!(count(&t, OTHER_SERVICE, "ok"), Some(0), "{t}");
        d.observe("echo", "ok", Duration::from_millis(3));
        d.observe("echo", "denied", Duration::from_millis(1));
        let t = text(&d);
        assert_eq!(count(&t, "echo", "ok"), Some(1), "{t}");
        assert_eq!(count(&t, "echo", "denied"), Some(1), "{t}");
        // 3 ms lands in the 4 ms bucket and above, not in the 2 ms one.
        assert!(
            t.contains(r#"call_duration_seconds_bucket{le="0.002",service="echo",result="ok"} 0"#)
                || t.contains(
                    r#"call_duration_seconds_bucket{service="echo",result="ok",le="0.002"} 0"#
                ),
            "{t}"
        );
    }

    #[test]
    fn past_the_cap_services_are_counted_as_other() {
        let d = CallDurations::new(2);
        d.precreate(["a"]);
        d.observe("b", "ok", Duration::from_millis(1));
        // The cap (2) is reached: c and d share `other`.
        d.observe("c", "ok", Duration::from_millis(1));
        d.observe("d", "no_providers", Duration::from_millis(1));
        // Named services keep their label after the cap is reached.
        d.observe("a", "ok", Duration::from_millis(1));
        d.observe("b", "ok", Duration::from_millis(1));
        let t = text(&d);
        assert_eq!(count(&t, "a", "ok"), Some(1), "{t}");
        assert_eq!(count(&t, "b", "ok"), Some(2), "{t}");
        assert_eq!(count(&t, "c", "ok"), None, "{t}");
        assert_eq!(count(&t, "d", "no_providers"), None, "{t}");
        assert_eq!(count(&t, OTHER_SERVICE, "ok"), Some(1), "{t}");
        assert_eq!(count(&t, OTHER_SERVICE, "no_providers"), Some(1), "{t}");
        // However many more services are called, the label set stays put.
        for i in 0..1000 {
            d.observe(&format!("s{i}"), "ok", Duration::from_millis(1));
        }
        let t = text(&d);
        assert_eq!(count(&t, OTHER_SERVICE, "ok"), Some(1001), "{t}");
        let series = t
            .lines()
            .filter(|l| l.starts_with("call_duration_seconds_count{"))
            .count();
        // a × 9 results, b ok, other ok and no_providers.
        assert_eq!(series, OUTBOUND_RESULTS.len() + 3, "{t}");
    }

    #[test]
    fn names_that_are_not_plain_service_names_are_other() {
        let d = CallDurations::new(8);
        for bad in ["", "other", "a\"b", "a b", "x\n", &"x".repeat(129)] {
            d.observe(bad, "ok", Duration::from_millis(1));
        }
        d.observe("team.a/svc-1:v2_x", "ok", Duration::from_millis(1));
        let t = text(&d);
        assert_eq!(count(&t, OTHER_SERVICE, "ok"), Some(6), "{t}");
        assert_eq!(count(&t, "team.a/svc-1:v2_x", "ok"), Some(1), "{t}");
        // None of them took a slot under the cap.
        assert_eq!(d.named.lock().len(), 1);
    }
}
