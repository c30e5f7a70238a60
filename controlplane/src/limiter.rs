//! Admission limits: a global token bucket (GCRA form) and a per-source-IP
//! guard that counts only failures.
//!
//! Both take `now` (time since a [`crate::clock::Clock`]'s origin) as an
//! argument, so they are pure and property-testable.

use std::{collections::HashMap, net::IpAddr, time::Duration};

/// A token bucket of `burst` tokens refilled at `rate` per second, kept as a
/// theoretical arrival time in integer nanoseconds (no float drift): at any
/// `t`, at most `burst + floor(t * rate)` requests have been admitted.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Nanoseconds per token.
    interval: u128,
    /// How far ahead of `now` the arrival time may run: `(burst - 1) * interval`.
    tolerance: u128,
    /// Theoretical arrival time of the next request, nanoseconds.
    tat: u128,
}

impl TokenBucket {
    /// A full bucket. `rate` and `burst` are clamped to at least 1.
    pub fn new(rate_per_sec: u32, burst: u32) -> Self {
        let interval = 1_000_000_000u128 / u128::from(rate_per_sec.max(1));
        Self {
            interval,
            tolerance: interval * u128::from(burst.max(1) - 1),
            tat: 0,
        }
    }

    /// Takes one token at `now`, or says how long until one is free.
    pub fn try_acquire(&mut self, now: Duration) -> Result<(), Duration> {
        let now = now.as_nanos();
        let tat = self.tat.max(now);
        let allowed_at = tat.saturating_sub(self.tolerance);
        if now >= allowed_at {
            self.tat = tat + self.interval;
            Ok(())
        } else {
            Err(nanos(allowed_at - now))
        }
    }
}

fn nanos(n: u128) -> Duration {
    Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}

/// The `retry-after` value for a wait: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    s.max(1)
}

/// Counts failures per source IP in fixed one-minute windows; an IP with
/// `max_per_min` failures in its window is refused until the window ends.
/// Successes are never counted, so many members behind one NAT are never
/// throttled by it. Tracks at most `max_ips` addresses (expired windows are
/// dropped first, then the oldest).
#[derive(Debug)]
pub struct FailureGuard {
    max_per_min: u32,
    max_ips: usize,
    windows: HashMap<IpAddr, (Duration, u32)>,
}

const WINDOW: Duration = Duration::from_secs(60);

impl FailureGuard {
    /// A guard allowing `max_per_min` failures per IP per minute.
    pub fn new(max_per_min: u32, max_ips: usize) -> Self {
        Self {
            max_per_min,
            max_ips: max_ips.max(1),
            windows: HashMap::new(),
        }
    }

    /// `Err(wait)` when `ip` has used up its failures for this window.
    pub fn check(&self, ip: IpAddr, now: Duration) -> Result<(), Duration> {
        match self.windows.get(&ip) {
            Some((start, n)) if *n >= self.max_per_min && now < *start + WINDOW => {
                Err(*start + WINDOW - now)
            }
            _ => Ok(()),
        }
    }

    /// Records one failure from `ip`.
    pub fn record_failure(&mut self, ip: IpAddr, now: Duration) {
        if !self.windows.contains_key(&ip) && self.windows.len() >= self.max_ips {
            self.windows.retain(|_, (start, _)| now < *start + WINDOW);
            let oldest = (self.windows.len() >= self.max_ips)
                .then(|| {
                    self.windows
                        .iter()
                        .min_by_key(|(_, (s, _))| *s)
                        .map(|(k, _)| *k)
                })
                .flatten();
            if let Some(oldest) = oldest {
                self.windows.remove(&oldest);
            }
        }
        let e = self.windows.entry(ip).or_insert((now, 0));
        if now >= e.0 + WINDOW {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn burst_then_rate() {
        let mut b = TokenBucket::new(10, 20);
        let t0 = Duration::ZERO;
        for _ in 0..20 {
            assert!(b.try_acquire(t0).is_ok());
        }
        let wait = b.try_acquire(t0).expect_err("bucket empty");
        assert_eq!(wait, Duration::from_millis(100));
        assert_eq!(retry_after_secs(wait), 1);
        assert!(b.try_acquire(Duration::from_millis(100)).is_ok());
        assert!(b.try_acquire(Duration::from_millis(100)).is_err());
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    proptest! {
        /// However requests arrive, admissions up to `t` never exceed
        /// `burst + floor(t * rate)`, and a refusal's wait is exact: asking
        /// again after it succeeds.
        #[test]
        fn never_admits_more_than_burst_plus_rate(
            rate in 1u32..50, burst in 1u32..50,
            gaps in proptest::collection::vec(0u64..400, 1..300),
        ) {
            let mut b = TokenBucket::new(rate, burst);
            let mut t = Duration::ZERO;
            let mut admitted = 0u64;
            for g in gaps {
                t += Duration::from_millis(g);
                match b.try_acquire(t) {
                    Ok(()) => admitted += 1,
                    Err(wait) => {
                        prop_assert!(wait > Duration::ZERO);
                        let mut probe = b.clone();
                        prop_assert!(probe.try_acquire(t + wait).is_ok());
                    }
                }
                let cap = u64::from(burst) + (t.as_nanos() / (1_000_000_000u128 / u128::from(rate))) as u64;
                prop_assert!(admitted <= cap, "admitted {} > cap {}", admitted, cap);
            }
        }

        /// The guard refuses only after `max` failures in a window and never
        /// tracks more than `max_ips` addresses.
        #[test]
        fn guard_counts_failures_only(max in 1u32..10, fails in 0u32..20, ips in 1usize..5) {
            let mut g = FailureGuard::new(max, ips);
            let ip: IpAddr = "10.0.0.1".parse().expect("ip");
            for _ in 0..fails {
                g.record_failure(ip, Duration::from_secs(1));
            }
            prop_assert_eq!(g.check(ip, Duration::from_secs(2)).is_err(), fails >= max);
            // A new window forgives.
            prop_assert!(g.check(ip, Duration::from_secs(61)).is_ok());
            for i in 0..10u8 {
                g.record_failure(IpAddr::from([10, 1, 0, i]), Duration::from_secs(3));
            }
            prop_assert!(g.tracked() <= ips);
        }
    }
}
