//! Lapsed router leases, as the routers' own counters show them.
//!
//! A router leases its place in the directory every `--lease-interval-secs`
//! (15 s, jittered) and the control plane keeps it for `--lease-ttl-secs`
//! (30 s): a router whose accepted leases stop for longer than the TTL has
//! dropped out of the directory members choose from. Its readiness does not
//! show it (a router stays ready once its first lease was accepted), but its
//! `agentmesh_router_lease_total{result="ok"}` stops growing. The ladder
//! reads that counter every poll; each time a router that answers goes
//! longer than the TTL without a new accepted lease counts one lapse. The
//! gaps are measured between the polls that saw the counter move, so they
//! are exact to one poll period. A router that does not answer (killed by
//! an event, restarting) is not counted as lapsing: it starts afresh when
//! it answers again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::prom::Metrics;

/// The routers' lease counter (label `result`: `ok`, `error`).
pub const LEASE_COUNTER: &str = "agentmesh_router_lease_total";

/// The lease counters of a router's `/metrics` page: (ok, error), None
/// when the page has no such counter.
pub fn lease_counters(page: &Metrics) -> Option<(f64, f64)> {
    page.has(LEASE_COUNTER).then(|| {
        (
            page.sum(LEASE_COUNTER, &[("result", "ok")]),
            page.sum(LEASE_COUNTER, &[("result", "error")]),
        )
    })
}

/// One router's leases over the watched time.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RouterLeases {
    /// Accepted leases counted (restarts' counters added up).
    pub ok: u64,
    /// Leases refused or failed.
    pub errors: u64,
    /// Times its accepted leases stopped for longer than the lease TTL.
    pub lapses: u64,
    /// Longest time without a new accepted lease while it answered, ms.
    pub max_gap_ms: u64,
    /// Polls its `/metrics` did not answer.
    pub unanswered: u64,
}

/// Every router's leases.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LeaseRecord {
    /// The control plane's lease TTL the gaps are held against, seconds.
    pub lease_ttl_secs: u64,
    /// Period of the polls, ms.
    pub poll_every_ms: u64,
    /// Lapses over every router.
    pub lapses: u64,
    /// Routers that lapsed at least once.
    pub routers_lapsed: u64,
    /// Per router.
    pub by_router: BTreeMap<String, RouterLeases>,
}

/// One router's state between polls.
#[derive(Debug, Default)]
struct Track {
    /// The counters at the last poll that answered.
    last: Option<(f64, f64)>,
    /// When the ok counter was last seen to move (or first seen).
    since: Option<Instant>,
    /// Whether the current gap was counted as a lapse already.
    lapsed: bool,
    record: RouterLeases,
}

/// Turns polls of the routers' counters into [`LeaseRecord`].
#[derive(Debug)]
pub struct LeaseTracker {
    ttl: Duration,
    poll_every: Duration,
    routers: BTreeMap<String, Track>,
}

/// What a counter grew by between two readings (a restart starts it at 0).
fn grown(before: f64, now: f64) -> u64 {
    if now >= before {
        (now - before) as u64
    } else {
        now.max(0.0) as u64
    }
}

impl LeaseTracker {
    /// A tracker holding gaps against `ttl`, polled every `poll_every`.
    pub fn new(ttl: Duration, poll_every: Duration) -> Self {
        Self {
            ttl,
            poll_every,
            routers: BTreeMap::new(),
        }
    }

    /// One poll of `router` at `now`: its (ok, error) counters, or None
    /// when it did not answer.
    pub fn observe(&mut self, router: &str, now: Instant, counters: Option<(f64, f64)>) {
        let t = self.routers.entry(router.to_string()).or_default();
        let Some((ok, err)) = counters else {
            t.record.unanswered += 1;
            (t.last, t.since, t.lapsed) = (None, None, false);
            return;
        };
        let since = *t.since.get_or_insert(now);
        if let Some((last_ok, last_err)) = t.last {
            t.record.ok += grown(last_ok, ok);
            t.record.errors += grown(last_err, err);
            let gap = now.saturating_duration_since(since);
            t.record.max_gap_ms = t.record.max_gap_ms.max(gap.as_millis() as u64);
            if ok != last_ok {
                (t.since, t.lapsed) = (Some(now), false);
            } else if gap > self.ttl && !t.lapsed {
                t.record.lapses += 1;
                t.lapsed = true;
            }
        }
        t.last = Some((ok, err));
    }

    /// What the polls so far saw.
    pub fn record(&self) -> LeaseRecord {
        let by_router: BTreeMap<String, RouterLeases> = self
            .routers
            .iter()
            .map(|(name, t)| (name.clone(), t.record.clone()))
            .collect();
        LeaseRecord {
            lease_ttl_secs: self.ttl.as_secs(),
            poll_every_ms: self.poll_every.as_millis() as u64,
            lapses: by_router.values().map(|r| r.lapses).sum(),
            routers_lapsed: by_router.values().filter(|r| r.lapses > 0).count() as u64,
            by_router,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn a_router_leasing_in_time_never_lapses() {
        let t0 = Instant::now();
        let mut t = LeaseTracker::new(TTL, Duration::from_secs(2));
        for s in 0..=120u64 {
            // One accepted lease every 15 s.
            let ok = (s / 15) as f64;
            t.observe("r0", t0 + Duration::from_secs(s), Some((ok, 0.0)));
        }
        let r = t.record();
        assert_eq!((r.lapses, r.routers_lapsed), (0, 0));
        let r0 = &r.by_router["r0"];
        assert_eq!((r0.ok, r0.max_gap_ms), (8, 15_000));
    }

    #[test]
    fn a_gap_above_the_ttl_counts_once_and_a_restart_starts_afresh() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut t = LeaseTracker::new(TTL, Duration::from_secs(2));
        t.observe("r1", at(0), Some((5.0, 0.0)));
        t.observe("r1", at(10), Some((6.0, 0.0)));
        // Leases fail from here: 40 s without a new accepted one.
        for s in [20, 30, 41, 45, 50] {
            t.observe("r1", at(s), Some((6.0, (s / 10) as f64)));
        }
        t.observe("r1", at(52), Some((7.0, 5.0)));
        // Killed: no answer, then a fresh process whose counter restarted.
        t.observe("r1", at(54), None);
        t.observe("r1", at(90), Some((1.0, 0.0)));
        t.observe("r1", at(100), Some((2.0, 0.0)));
        let r = t.record();
        let r1 = &r.by_router["r1"];
        assert_eq!(r1.lapses, 1, "{r1:?}");
        assert_eq!(r1.max_gap_ms, 42_000);
        assert_eq!(r1.errors, 5);
        assert_eq!(r1.ok, 1 + 1 + 1, "{r1:?}");
        assert_eq!(r1.unanswered, 1);
        assert_eq!((r.lapses, r.routers_lapsed, r.lease_ttl_secs), (1, 1, 30));
    }

    #[test]
    fn the_counters_are_read_from_a_router_page() {
        let page = Metrics::parse(
            "# TYPE agentmesh_router_lease counter\n\
             agentmesh_router_lease_total{result=\"ok\"} 12\n\
             agentmesh_router_lease_total{result=\"error\"} 3\n",
        );
        assert_eq!(lease_counters(&page), Some((12.0, 3.0)));
        assert_eq!(lease_counters(&Metrics::parse("other_total 1\n")), None);
    }
}
