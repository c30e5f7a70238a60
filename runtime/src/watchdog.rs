//! Runtime stall watchdog.
//!
//! A probe task asks to wake every [`PROBE_INTERVAL`]. When it wakes late by
//! [`STALL_THRESHOLD`] or more, something held a worker thread (blocking I/O,
//! a slow hash, a long loop without an await): the probe logs a warning with
//! the stall length and counts it. One probe per worker thread, pinned by
//! nothing but the scheduler; with work-stealing a stall of one worker is
//! seen when the probe happened to be queued on it, which is what the
//! counter then reports: stalls that delayed runnable tasks.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the probe asks to run.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// A wake-up this late is a stall.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(1);

/// The watchdog's metrics.
#[derive(Clone, Debug)]
pub struct StallMetrics {
    /// `agentmesh_runtime_stalls_total`.
    pub stalls: Counter,
    /// `agentmesh_runtime_stall_seconds`: length of each stall seen.
    pub stall_seconds: Histogram,
}

impl StallMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            stalls: Counter::default(),
            stall_seconds: Histogram::new([1.0, 2.0, 5.0, 10.0, 30.0]),
        };
        registry.register(
            "agentmesh_runtime_stalls",
            "Times the async runtime could not run a probe task for 1 s or more",
            m.stalls.clone(),
        );
        registry.register(
            "agentmesh_runtime_stall_seconds",
            "Length of each runtime stall seen by the watchdog",
            m.stall_seconds.clone(),
        );
        m
    }
}

/// Starts the probe on the current runtime; abort the handle to stop it.
pub fn spawn(metrics: StallMetrics) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut expected = Instant::now() + PROBE_INTERVAL;
        loop {
            tokio::time::sleep_until(expected).await;
            let now = Instant::now();
            let late = now.saturating_duration_since(expected);
            if let Some(stall) = record(&metrics, late) {
                tracing::warn!(
                    stall_ms = stall.as_millis() as u64,
                    "async runtime stalled: a task held a worker thread without yielding"
                );
            }
            expected = now + PROBE_INTERVAL;
        }
    })
}

/// Counts `late` as a stall when it reaches the threshold; returns it if so.
fn record(metrics: &StallMetrics, late: Duration) -> Option<Duration> {
    if late < STALL_THRESHOLD {
        return None;
    }
    metrics.stalls.inc();
    metrics.stall_seconds.observe(late.as_secs_f64());
    Some(late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_late_wakeups_count() {
        let mut reg = Registry::default();
        let m = StallMetrics::register(&mut reg);
        assert_eq!(record(&m, Duration::from_millis(999)), None);
        assert_eq!(m.stalls.get(), 0);
        assert_eq!(
            record(&m, Duration::from_millis(1500)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(m.stalls.get(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_is_seen() {
        let mut reg = Registry::default();
        let m = StallMetrics::register(&mut reg);
        let probe = spawn(m.clone());
        // Let the probe arm its first timer, then hold the only worker thread.
        tokio::time::sleep(Duration::from_millis(150)).await;
        std::thread::sleep(Duration::from_millis(1300));
        // Give the probe its chance to wake (deadline-bounded wait, no timing assert).
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.stalls.get() == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        probe.abort();
        assert_eq!(
            m.stalls.get(),
            1,
            "one stall of ~1.3 s must be counted once"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        assert!(text.contains("agentmesh_runtime_stalls_total 1"), "{text}");
    }
}
