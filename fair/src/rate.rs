//! A rate shared by sources: a global token bucket that, once contended,
//! gives each active source at most its share.
//!
//! The global bucket admits `rate` per second with a burst of `burst`
//! (GCRA, integer nanoseconds, as the control plane's other buckets). It
//! counts as **contended** once more than half of its burst is spent. Each
//! source also has a bucket of its own whose rate is `rate / n` and burst
//! `burst / n` (at least 1), `n` being the sources active in the last
//! `idle` period; it is charged on every admission but only consulted while
//! the global bucket is contended. So a lone source may use the whole rate,
//! and a source flooding it is refused once others arrive, while they still
//! get their share: the flood spends its own bucket, not theirs.
//!
//! A source's own bucket never runs more than `idle` ahead of now, so a
//! source that used the whole rate alone is refused for at most that long
//! once contention starts. Time is passed in (`now` since an origin), so
//! the bucket is pure and testable; each call is O(1) amortized.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use crate::map::{MapStats, SourceMap};
use crate::source::SourceKey;

/// Which bucket refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateReason {
    /// The global rate is spent.
    Global,
    /// The global rate is contended and this source used its share.
    FairShare,
}

impl RateReason {
    /// Label values, pre-created by the programs' counters.
    pub const ALL: [RateReason; 2] = [RateReason::Global, RateReason::FairShare];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RateReason::Global => "global",
            RateReason::FairShare => "source_share",
        }
    }
}

/// A refusal of [`FairRate::try_acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRefusal {
    /// Which bucket refused.
    pub reason: RateReason,
    /// When the refusing bucket has a token again (for `retry-after`).
    pub wait: Duration,
    /// The source refused.
    pub source: SourceKey,
}

#[derive(Debug, Default)]
struct SourceRate {
    /// Theoretical arrival time of this source's next request, ns.
    tat: u128,
    /// Last request, ns (for idling out).
    last: u128,
}

/// A rate shared fairly by sources (see the module docs).
#[derive(Debug)]
pub struct FairRate {
    /// Nanoseconds per token of the whole budget (`rate_per_sec`).
    base_interval: u128,
    /// The whole budget's burst.
    base_burst: u32,
    interval: u128,
    tolerance: u128,
    burst: u32,
    tat: u128,
    idle: u128,
    sources: SourceMap<SourceRate>,
    /// Sources in arrival order of their last known request, to idle them
    /// out without scanning: each entry is popped and either removed or
    /// pushed back with its newer time.
    order: VecDeque<(u128, SourceKey)>,
}

impl FairRate {
    /// `rate_per_sec` and `burst` (at least 1 each), sources active for
    /// `idle` after their last request, per-source state for at most
    /// `max_sources` (see [`SourceMap`]).
    pub fn new(
        rate_per_sec: u32,
        burst: u32,
        idle: Duration,
        max_sources: usize,
        ipv6_prefix_len: u8,
    ) -> Self {
        let interval = 1_000_000_000u128 / u128::from(rate_per_sec.max(1));
        let burst = burst.max(1);
        Self {
            base_interval: interval,
            base_burst: burst,
            interval,
            tolerance: interval * u128::from(burst - 1),
            burst,
            tat: 0,
            idle: idle.as_nanos().max(1),
            sources: SourceMap::new(max_sources, ipv6_prefix_len),
            order: VecDeque::new(),
        }
    }

    /// Serves `1 / parts` of the configured budget: the rate divided by
    /// `parts`, the burst too (at least 1), so `parts` processes each
    /// holding a share admit at most the configured budget between them
    /// (the control plane's replicas). `parts` 1 is the whole budget.
    pub fn set_share(&mut self, parts: u32) {
        let parts = parts.max(1);
        self.interval = self.base_interval.saturating_mul(u128::from(parts));
        self.burst = (self.base_burst / parts).max(1);
        self.tolerance = self.interval * u128::from(self.burst - 1);
    }

    /// Takes one token for a request from `ip` at `now`.
    pub fn try_acquire(&mut self, ip: IpAddr, now: Duration) -> Result<SourceKey, RateRefusal> {
        let now = now.as_nanos();
        self.expire(now);
        let (key, src) = self.sources.entry(ip);
        if src.last == 0 && src.tat == 0 {
            self.order.push_back((now, key));
        }
        let n = u128::try_from(self.sources.len().max(1)).unwrap_or(u128::MAX);
        let Some(src) = self.sources.get_mut(&key) else {
            unreachable!("the entry was just made");
        };
        src.last = now.max(1);

        let global_tat = self.tat.max(now);
        let contended = global_tat - now > self.tolerance / 2;
        let share_interval = self.interval.saturating_mul(n);
        let share_burst = u128::from(self.burst).div_ceil(n).max(1);
        let share_tolerance = share_interval.saturating_mul(share_burst - 1);
        let src_tat = src.tat.max(now);
        let allowed_at = global_tat.saturating_sub(self.tolerance);
        if now < allowed_at {
            return Err(RateRefusal {
                reason: RateReason::Global,
                wait: nanos(allowed_at - now),
                source: key,
            });
        }
        if contended {
            let allowed_at = src_tat.saturating_sub(share_tolerance);
            if now < allowed_at {
                return Err(RateRefusal {
                    reason: RateReason::FairShare,
                    wait: nanos(allowed_at - now),
                    source: key,
                });
            }
        }
        self.tat = global_tat + self.interval;
        src.tat = (src_tat + share_interval).min(now + share_tolerance + self.idle);
        Ok(key)
    }

    /// Idles out sources whose last request is older than `idle`.
    fn expire(&mut self, now: u128) {
        for _ in 0..2 {
            let Some(&(seen, key)) = self.order.front() else {
                return;
            };
            if seen + self.idle > now {
                return;
            }
            self.order.pop_front();
            match self.sources.get(&key) {
                Some(s) if s.last + self.idle > now => self.order.push_back((s.last, key)),
                Some(_) => {
                    self.sources.remove(&key);
                }
                None => {}
            }
        }
    }

    /// Sources active now.
    pub fn active_sources(&self) -> usize {
        self.sources.len()
    }

    /// The source table's numbers.
    pub fn source_stats(&self) -> MapStats {
        self.sources.stats()
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_share_admits_its_part_of_the_rate_and_burst() {
        // 100/s, burst 10, one of 4 parts (25/s, burst 2): in 1 s a lone
        // source gets its burst at once, then one every 40 ms (40..=960).
        let mut r = FairRate::new(100, 10, Duration::from_secs(2), 64, 64);
        r.set_share(4);
        let ok = (0..1000u64)
            .filter(|i| {
                r.try_acquire(ip(1), Duration::from_micros(i * 1000))
                    .is_ok()
            })
            .count();
        assert_eq!(ok, 2 + 24, "burst 2 then one every 40 ms below 1 s");
        // Back to the whole budget.
        let mut r = FairRate::new(100, 10, Duration::from_secs(2), 64, 64);
        r.set_share(4);
        r.set_share(1);
        let ok = (0..1000u64)
            .filter(|i| {
                r.try_acquire(ip(1), Duration::from_micros(i * 1000))
                    .is_ok()
            })
            .count();
        assert_eq!(
            ok,
            10 + 99,
            "the whole budget again: burst 10, then one every 10 ms"
        );
    }

    #[test]
    fn a_lone_source_gets_the_whole_rate() {
        // 100/s, burst 10: in 1 s a lone source gets burst + 100.
        let mut r = FairRate::new(100, 10, Duration::from_secs(2), 64, 64);
        let mut ok = 0;
        for t in 0..1000u64 {
            for _ in 0..5 {
                if r.try_acquire(ip(1), ms(t)).is_ok() {
                    ok += 1;
                }
            }
        }
        assert!((105..=111).contains(&ok), "{ok}");
    }

    #[test]
    fn a_flood_leaves_others_their_share() {
        // 100/s; source 1 asks 50 times per ms, sources 2..=4 once per 20 ms
        // each (50/s each: 150/s of demand from them, more than their
        // 3/4 share of 75/s).
        let mut r = FairRate::new(100, 10, Duration::from_secs(2), 64, 64);
        let mut got = [0u32; 5];
        for t in 0..10_000u64 {
            for _ in 0..50 {
                if r.try_acquire(ip(1), ms(t)).is_ok() {
                    got[1] += 1;
                }
            }
            if t % 20 == 0 {
                for s in 2..=4u8 {
                    if r.try_acquire(ip(s), ms(t)).is_ok() {
                        got[usize::from(s)] += 1;
                    }
                }
            }
        }
        // 10 s at 100/s: about 1,000 in all; each of 2..=4 gets close to a
        // quarter (the flood can take what they leave, no more).
        let total: u32 = got.iter().sum();
        assert!((990..=1_015).contains(&total), "{got:?}");
        for s in 2..=4 {
            assert!(got[s] >= 200, "source {s} starved: {got:?}");
        }
        assert!(got[1] <= 400, "the flood took more than its share: {got:?}");
    }

    #[test]
    fn refusals_say_which_bucket_and_when() {
        let mut r = FairRate::new(10, 1, Duration::from_secs(1), 64, 64);
        r.try_acquire(ip(1), ms(0)).expect("first");
        let e = r
            .try_acquire(ip(1), ms(0))
            .expect_err("global bucket spent");
        assert_eq!(e.reason, RateReason::Global);
        assert_eq!(e.wait, ms(100));
        assert_eq!(e.source.to_string(), "10.0.0.1");
    }

    #[test]
    fn idle_sources_leave_the_table() {
        let mut r = FairRate::new(1000, 10, Duration::from_secs(1), 64, 64);
        for s in 1..=10u8 {
            r.try_acquire(ip(s), ms(0)).expect("ok");
        }
        assert_eq!(r.active_sources(), 10);
        for t in 0..20u64 {
            let _ = r.try_acquire(ip(1), ms(1_000 + t * 100));
        }
        assert_eq!(r.active_sources(), 1);
    }
}
