//! Recent call counts for `agentmesh-node status`: calls that ended in
//! the last [`WINDOW`], by direction and outcome, in [`BUCKETS`] buckets of
//! [`WINDOW`] / [`BUCKETS`] each (so the count covers between
//! `WINDOW - bucket` and `WINDOW`). Fixed size, whatever the call rate.
//! Transitions take `now`, so the window is tested without waiting.

use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// How far back the counts go.
pub(crate) const WINDOW: Duration = Duration::from_secs(300);
/// Buckets in the window.
const BUCKETS: usize = 30;

/// Call counts over a window, as reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCounts {
    /// Outbound calls accepted by a provider.
    pub outbound_ok: u64,
    /// Outbound calls that failed (no provider, refused, timed out, ...).
    pub outbound_failed: u64,
    /// Inbound calls accepted and spliced to the backend.
    pub inbound_ok: u64,
    /// Inbound calls refused or dropped.
    pub inbound_failed: u64,
}

impl CallCounts {
    fn add(&mut self, o: &CallCounts) {
        self.outbound_ok += o.outbound_ok;
        self.outbound_failed += o.outbound_failed;
        self.inbound_ok += o.inbound_ok;
        self.inbound_failed += o.inbound_failed;
    }
}

#[derive(Debug)]
struct Buckets {
    start: Instant,
    /// Per bucket: the period it holds (periods since `start`) and its counts.
    slots: [(u64, CallCounts); BUCKETS],
}

/// Calls that ended recently.
#[derive(Debug)]
pub(crate) struct RecentCalls {
    inner: Mutex<Buckets>,
}

impl Default for RecentCalls {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

fn bucket_len() -> Duration {
    WINDOW / BUCKETS as u32
}

impl RecentCalls {
    /// Empty, counting from `start`.
    pub(crate) fn new(start: Instant) -> Self {
        Self {
            inner: Mutex::new(Buckets {
                start,
                slots: [(u64::MAX, CallCounts::default()); BUCKETS],
            }),
        }
    }

    fn period(start: Instant, now: Instant) -> u64 {
        (now.saturating_duration_since(start).as_millis() / bucket_len().as_millis()) as u64
    }

    /// A call ended at `now`: `outbound` or inbound, accepted (`ok`) or not.
    pub(crate) fn record(&self, outbound: bool, ok: bool, now: Instant) {
        let mut b = self.inner.lock();
        let p = Self::period(b.start, now);
        let slot = &mut b.slots[(p % BUCKETS as u64) as usize];
        if slot.0 != p {
            *slot = (p, CallCounts::default());
        }
        let c = &mut slot.1;
        match (outbound, ok) {
            (true, true) => c.outbound_ok += 1,
            (true, false) => c.outbound_failed += 1,
            (false, true) => c.inbound_ok += 1,
            (false, false) => c.inbound_failed += 1,
        }
    }

    /// Counts over the window ending at `now`.
    pub(crate) fn counts(&self, now: Instant) -> CallCounts {
        let b = self.inner.lock();
        let p = Self::period(b.start, now);
        let oldest = p.saturating_sub(BUCKETS as u64 - 1);
        let mut total = CallCounts::default();
        for (period, c) in &b.slots {
            if *period != u64::MAX && *period >= oldest && *period <= p {
                total.add(c);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cover_the_window_and_forget_what_is_older() {
        let start = Instant::now();
        let r = RecentCalls::new(start);
        r.record(true, true, start);
        r.record(true, false, start + Duration::from_secs(1));
        r.record(false, true, start + Duration::from_secs(100));
        r.record(false, false, start + Duration::from_secs(299));
        let all = CallCounts {
            outbound_ok: 1,
            outbound_failed: 1,
            inbound_ok: 1,
            inbound_failed: 1,
        };
        assert_eq!(r.counts(start + Duration::from_secs(299)), all);
        // One window later, the first bucket (0-10 s) has left.
        let later = r.counts(start + WINDOW + Duration::from_secs(1));
        assert_eq!((later.outbound_ok, later.outbound_failed), (0, 0));
        assert_eq!((later.inbound_ok, later.inbound_failed), (1, 1));
        // A bucket reused for a later period starts from zero.
        r.record(true, true, start + WINDOW + Duration::from_secs(2));
        let c = r.counts(start + WINDOW + Duration::from_secs(2));
        assert_eq!(c.outbound_ok, 1);
        assert_eq!(r.counts(start + WINDOW * 3), CallCounts::default());
        // Many calls in one bucket still take no room.
        for _ in 0..10_000 {
            r.record(false, true, start + WINDOW * 3);
        }
        assert_eq!(r.counts(start + WINDOW * 3).inbound_ok, 10_000);
    }
}
