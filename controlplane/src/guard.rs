//! The failure guard: failed authentications per source, in fixed
//! one-minute windows; a source with `max_per_min` failures in its window is
//! over its limit until the window ends. What that costs the source's
//! requests is decided in [`crate::request_limits`]: only requests that fail to
//! prove who sent them are refused (a caller that proves itself is served
//! whatever its address's count), so the members and routers behind a NAT
//! are never refused for an attacker among them.
//!
//! Only failures count (a token, proof or credential that does not check
//! out, a malformed request, a wrong admin token), never a caller that
//! proved itself and was refused all the same. Sources are keyed as everywhere else
//! ([`agentmesh_fair::SourceKey`]: an IPv4 address, an IPv6 /64 by
//! default), so one host cannot spread its failures over the addresses of
//! its prefix.
//!
//! The table is an [`agentmesh_fair::SourceMap`]: bounded, never evicting.
//! A flood of new addresses cannot push a blocked source out (it would come
//! back unblocked); new sources are aggregated to wider prefixes as the
//! table fills and, once it is full, share one overflow source, whose
//! window then counts the failures of every source that did not fit. Each
//! call is O(1): windows that ended leave through a queue in the order they
//! were opened, at most two per call, never by a scan.

use std::{collections::VecDeque, net::IpAddr, time::Duration};

use agentmesh_fair::{MapStats, SourceKey, SourceMap};

/// The window failures are counted in.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Window {
    start: Duration,
    failures: u32,
}

/// Failures per source (see the module docs).
#[derive(Debug)]
pub struct FailureGuard {
    /// `--auth-failures-per-source-per-min`, for the whole control plane.
    base_per_min: u32,
    /// This replica's part of it.
    max_per_min: u32,
    windows: SourceMap<Window>,
    /// (window start, source) of every entry, oldest first: each entry has
    /// exactly one item, pushed back with its newer start when it is popped
    /// while its window is still open.
    order: VecDeque<(Duration, SourceKey)>,
}

/// A refusal of [`FailureGuard::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The source refused.
    pub source: SourceKey,
    /// Until its window ends.
    pub wait: Duration,
}

impl FailureGuard {
    /// A guard allowing `max_per_min` failures per source per minute, for at
    /// most `max_sources` sources, IPv6 sources keyed at `ipv6_prefix_len`
    /// bits while the table has room.
    pub fn new(max_per_min: u32, max_sources: usize, ipv6_prefix_len: u8) -> Self {
        Self {
            base_per_min: max_per_min,
            max_per_min,
            windows: SourceMap::new(max_sources, ipv6_prefix_len),
            order: VecDeque::new(),
        }
    }

    /// Allows `1 / parts` of the configured failures per source (at least
    /// 1): a source's requests spread over `parts` replicas, so each
    /// replica's part adds up to the limit for the whole control plane.
    pub fn set_share(&mut self, parts: u32) {
        self.max_per_min = (self.base_per_min / parts.max(1)).max(1);
    }

    /// `Err` when `ip`'s source has used up its failures for this window.
    pub fn check(&self, ip: IpAddr, now: Duration) -> Result<(), Blocked> {
        let source = self.windows.key_of(ip);
        match self.windows.get(&source) {
            Some(w) if w.failures >= self.max_per_min && now < w.start + WINDOW => Err(Blocked {
                source,
                wait: w.start + WINDOW - now,
            }),
            _ => Ok(()),
        }
    }

    /// Records one failure from `ip`; returns the source it counted against.
    pub fn record_failure(&mut self, ip: IpAddr, now: Duration) -> SourceKey {
        self.expire(now);
        let (source, w) = self.windows.entry(ip);
        if w.failures == 0 {
            // New entry: it gets its one item in the queue.
            w.start = now;
            self.order.push_back((now, source));
        } else if now >= w.start + WINDOW {
            // Its item is still queued; it is pushed back when popped.
            w.start = now;
            w.failures = 0;
        }
        w.failures = w.failures.saturating_add(1);
        source
    }

    /// Drops entries whose window ended, at most two per call.
    fn expire(&mut self, now: Duration) {
        for _ in 0..2 {
            let Some(&(start, source)) = self.order.front() else {
                return;
            };
            if now < start + WINDOW {
                return;
            }
            self.order.pop_front();
            match self.windows.get(&source) {
                Some(w) if now < w.start + WINDOW => self.order.push_back((w.start, source)),
                Some(_) => {
                    self.windows.remove(&source);
                }
                None => {}
            }
        }
    }

    /// Sources tracked now.
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }

    /// The source table's numbers.
    pub fn source_stats(&self) -> MapStats {
        self.windows.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv6Addr;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Address `host` in the n-th /64 under 2001:db8::/32.
    fn v6(n: u128, host: u128) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | (n << 64) | host))
    }

    #[test]
    fn failures_from_one_ipv6_prefix_add_up() {
        let mut g = FailureGuard::new(3, 1_000, 64);
        for host in 1..=3 {
            g.record_failure(v6(1, host), secs(1));
        }
        // Any address of that /64 is refused, for the rest of the window.
        let b = g.check(v6(1, 0xdead_beef), secs(2)).expect_err("blocked");
        assert_eq!(b.wait, secs(59));
        assert_eq!(b.source.to_string(), "2001:db8:0:1::/64");
        // Another /64 is not.
        assert!(g.check(v6(2, 1), secs(2)).is_ok());
        assert!(g.check(v6(1, 7), secs(61)).is_ok(), "a new window forgives");
        assert_eq!(g.tracked(), 1);
    }

    #[test]
    fn a_flood_of_new_sources_cannot_flush_a_block() {
        let mut g = FailureGuard::new(3, 64, 64);
        let attacker = IpAddr::from([203, 0, 113, 9]);
        for _ in 0..3 {
            g.record_failure(attacker, secs(1));
        }
        // 10,000 fresh sources fail once each, all within the window.
        for n in 0..10_000u128 {
            g.record_failure(v6(n << 16, 1), secs(2));
        }
        assert!(g.tracked() <= 65, "bounded: {}", g.tracked());
        assert!(g.check(attacker, secs(3)).is_err(), "still blocked");
        let s = g.source_stats();
        assert_eq!(s.overflowed_total, 1, "{s:?}");
    }

    #[test]
    fn ended_windows_leave_without_a_scan() {
        let mut g = FailureGuard::new(3, 1_000, 64);
        for i in 0..100u8 {
            g.record_failure(IpAddr::from([10, 0, 0, i]), secs(1));
        }
        assert_eq!(g.tracked(), 100);
        // One source keeps failing after the others' windows ended: each of
        // its calls drops up to two ended windows.
        let me = IpAddr::from([10, 1, 0, 1]);
        for t in 0..60 {
            g.record_failure(me, secs(61 + t));
        }
        assert_eq!(g.tracked(), 1);
        // A source whose window reopened is kept, and blocked in it.
        let mut g = FailureGuard::new(2, 1_000, 64);
        let ip = IpAddr::from([10, 0, 0, 1]);
        g.record_failure(ip, secs(0));
        g.record_failure(ip, secs(70));
        g.record_failure(ip, secs(71));
        g.record_failure(IpAddr::from([10, 0, 0, 2]), secs(125));
        assert!(
            g.check(ip, secs(125)).is_err(),
            "blocked in its second window"
        );
    }

    proptest! {
        /// The guard refuses only after `max` failures in a window, forgives
        /// in the next, and never tracks more than its capacity (plus the
        /// overflow source).
        #[test]
        fn guard_counts_failures_only(max in 1u32..10, fails in 0u32..20, cap in 1usize..8) {
            let mut g = FailureGuard::new(max, cap, 64);
            let ip: IpAddr = "10.0.0.1".parse().expect("ip");
            for _ in 0..fails {
                g.record_failure(ip, secs(1));
            }
            prop_assert_eq!(g.check(ip, secs(2)).is_err(), fails >= max);
            prop_assert!(g.check(ip, secs(61)).is_ok());
            for i in 0..50u8 {
                g.record_failure(IpAddr::from([10, 1, i, 1]), secs(3));
                prop_assert!(g.tracked() <= cap + 1);
            }
        }
    }
}
