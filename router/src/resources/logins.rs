//! The failed-login guard: a source (IPv4 address, IPv6 prefix) whose
//! logins fail `--failed-logins-per-ip-per-minute` times within a minute
//! is blocked for `--failed-login-block-secs`: its new connections whose
//! peers are not admitted are refused, before the handshake and again
//! when it ends. Admitted peers (members behind the same NAT) are never
//! refused by it.
//!
//! Blocks are short and not extended by failures during them: a source
//! shared by members and one broken or hostile client loses a few seconds,
//! not the rest of the minute, and a persistent attacker spends most of its
//! time blocked (it must fail the whole limit again after each block). The
//! failure count starts over when a block begins.
//!
//! The table is a [`SourceMap`]: bounded, it aggregates new sources to
//! wider prefixes as it fills and never evicts, so a flood of new
//! addresses cannot flush the blocks already in it. Entries age out in
//! arrival order (each entry queued once), so every call is O(1)
//! amortized: no scan under the lock.
//!
//! What counts as a failed login, its counter and the block log line are
//! the manager's ([`ResourceManager::failed_login`]), below the table.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Duration;

use agentmesh_fair::{SourceKey, SourceMap};
use tokio::time::Instant;

use super::ResourceManager;

/// The window failed logins are counted in.
pub(crate) const FAILED_LOGIN_WINDOW: Duration = Duration::from_secs(60);
/// Sources with failed logins remembered at most (wider prefixes, then
/// one shared source, beyond; see [`SourceMap`]).
pub(crate) const MAX_FAILED_LOGIN_SOURCES: usize = 16_384;

#[derive(Debug, Default)]
struct Entry {
    /// Failures in the window, oldest first (fewer than the limit).
    failures: VecDeque<Instant>,
    blocked_until: Option<Instant>,
    /// Last failure (or block start): the entry ages out from here.
    last: Option<Instant>,
}

/// Failed logins and blocks by source.
#[derive(Debug)]
pub(crate) struct FailedLogins {
    sources: SourceMap<Entry>,
    /// Each entry once, in the order its `last` was last queued.
    order: VecDeque<(Instant, SourceKey)>,
    limit: usize,
    block: Duration,
    blocks_total: u64,
}

impl FailedLogins {
    /// A guard blocking a source for `block` after `limit` failures (at
    /// least 1) within a minute, IPv6 sources keyed at `ipv6_prefix_len`.
    pub(crate) fn new(limit: u32, block: Duration, ipv6_prefix_len: u8) -> Self {
        Self {
            sources: SourceMap::new(MAX_FAILED_LOGIN_SOURCES, ipv6_prefix_len),
            order: VecDeque::new(),
            limit: usize::try_from(limit.max(1)).unwrap_or(usize::MAX),
            block,
            blocks_total: 0,
        }
    }

    /// How long an entry is kept after its last event.
    fn keep(&self) -> Duration {
        FAILED_LOGIN_WINDOW.max(self.block)
    }

    /// Records a failed login from `ip` at `now`; returns the source if
    /// this failure blocked it.
    pub(crate) fn record(&mut self, ip: IpAddr, now: Instant) -> Option<SourceKey> {
        self.expire(now);
        let (limit, block) = (self.limit, self.block);
        let (key, e) = self.sources.entry(ip);
        let queued = e.last.is_some();
        e.last = Some(now);
        if !queued {
            self.order.push_back((now, key));
        }
        if e.blocked_until.is_some_and(|t| t > now) {
            return None; // blocks are not extended
        }
        while e
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > FAILED_LOGIN_WINDOW)
        {
            e.failures.pop_front();
        }
        e.failures.push_back(now);
        if e.failures.len() < limit {
            return None;
        }
        e.failures.clear();
        e.blocked_until = Some(now + block);
        self.blocks_total += 1;
        Some(key)
    }

    /// Whether the source of `ip` is blocked at `now`.
    pub(crate) fn is_blocked(&mut self, ip: IpAddr, now: Instant) -> bool {
        self.expire(now);
        let key = self.sources.key_of(ip);
        self.sources
            .get(&key)
            .and_then(|e| e.blocked_until)
            .is_some_and(|t| t > now)
    }

    /// Drops entries whose last event is older than the window and the
    /// block; each pop either removes its entry or queues it again at its
    /// newer time.
    fn expire(&mut self, now: Instant) {
        let keep = self.keep();
        while let Some(&(t, key)) = self.order.front() {
            if now.duration_since(t) <= keep {
                break;
            }
            self.order.pop_front();
            let last = self.sources.get(&key).and_then(|e| e.last);
            match last {
                Some(last) if now.duration_since(last) <= keep => {
                    self.order.push_back((last, key));
                }
                _ => {
                    self.sources.remove(&key);
                }
            }
        }
    }

    /// Sources in the table.
    pub(crate) fn len(&self) -> usize {
        self.sources.len()
    }

    /// Blocks begun since start.
    #[cfg(test)]
    pub(crate) fn blocks_total(&self) -> u64 {
        self.blocks_total
    }
}

/// Auth results that are failed logins (the `reason` label of
/// `agentmesh_router_failed_logins_total`).
pub(crate) const FAILED_LOGIN_REASONS: &[&str] = &[
    "malformed",
    "bad_signature",
    "wrong_peer",
    "revoked",
    "wrong_role",
    "silent",
    "refused_streams",
];

/// Whether an auth result is a failed login for the per-source limit: a
/// forged, foreign, garbled or revoked credential, a stream that sent no
/// byte within the first-byte deadline, or a stranger's connection closed
/// for its refused streams (`crate::streams`); not a refusal the router or the
/// clock caused (`unknown_key`, `no_keys`, `expired`, `not_yet_valid`), nor
/// a stream that started its request and was slow (`io`).
fn counts_as_failed_login(reason: &str) -> bool {
    FAILED_LOGIN_REASONS.contains(&reason)
}

impl ResourceManager {
    /// Whether the source of `ip` is blocked for failed logins now.
    pub(crate) fn source_blocked(&self, ip: IpAddr) -> bool {
        self.logins.lock().is_blocked(ip, Instant::now())
    }

    /// Records a failed login from `ip` (the source of the connection that
    /// carried it) with auth result `reason`; enough of them block the
    /// source for a short while (`logins.rs`). Refusals that are not the
    /// peer's doing (keys not synced yet, clock, I/O) do not count; a
    /// stream that sent no byte in time (`silent`) does.
    pub(crate) fn failed_login(&self, ip: Option<IpAddr>, reason: &'static str) {
        if !counts_as_failed_login(reason) {
            return;
        }
        self.metrics
            .failed_logins
            .get_or_create(&[("reason", reason)])
            .inc();
        let Some(ip) = ip else {
            return;
        };
        let blocked = self.logins.lock().record(ip, Instant::now());
        if let Some(source) = blocked {
            self.metrics.failed_login_blocks.inc();
            let key = source.to_string();
            if let Some(suppressed) = self.log_pass(&key, "login_blocked") {
                tracing::warn!(
                    source = key,
                    suppressed,
                    failed_logins = self.budgets.failed_logins_per_ip_per_minute,
                    block_secs = self.budgets.failed_login_block.as_secs(),
                    "source blocked for failed logins (logged at most once a minute per source)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_limit_blocks_for_a_short_while_and_the_count_starts_over() {
        let mut g = FailedLogins::new(3, Duration::from_secs(10), 64);
        let t0 = Instant::now();
        assert_eq!(g.record(ip("10.0.0.1"), t0), None);
        assert_eq!(g.record(ip("10.0.0.1"), t0), None);
        assert!(!g.is_blocked(ip("10.0.0.1"), t0));
        let k = g.record(ip("10.0.0.1"), t0).expect("third failure blocks");
        assert_eq!(k.to_string(), "10.0.0.1");
        assert!(g.is_blocked(ip("10.0.0.1"), t0 + Duration::from_secs(9)));
        assert!(!g.is_blocked(ip("10.0.0.2"), t0), "another source");
        // Failures during the block neither extend it nor count.
        let during = t0 + Duration::from_secs(5);
        for _ in 0..10 {
            assert_eq!(g.record(ip("10.0.0.1"), during), None);
        }
        let after = t0 + Duration::from_secs(10);
        assert!(
            !g.is_blocked(ip("10.0.0.1"), after),
            "short: over after 10 s"
        );
        assert_eq!(g.record(ip("10.0.0.1"), after), None);
        assert_eq!(g.record(ip("10.0.0.1"), after), None);
        assert!(g.record(ip("10.0.0.1"), after).is_some(), "blocked again");
        assert_eq!(g.blocks_total(), 2);
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let mut g = FailedLogins::new(2, Duration::from_secs(10), 64);
        let t0 = Instant::now();
        g.record(ip("10.0.0.1"), t0);
        let later = t0 + FAILED_LOGIN_WINDOW + Duration::from_secs(1);
        assert_eq!(g.record(ip("10.0.0.1"), later), None);
        assert!(!g.is_blocked(ip("10.0.0.1"), later));
    }

    #[test]
    fn a_whole_ipv6_prefix_is_one_source() {
        let mut g = FailedLogins::new(2, Duration::from_secs(10), 64);
        let t0 = Instant::now();
        g.record(ip("2001:db8:9:9::1"), t0);
        g.record(ip("2001:db8:9:9::2"), t0);
        assert!(g.is_blocked(ip("2001:db8:9:9::3"), t0));
        assert!(!g.is_blocked(ip("2001:db8:9:a::1"), t0));
    }

    #[test]
    fn entries_age_out_and_the_table_stays_bounded() {
        let mut g = FailedLogins::new(30, Duration::from_secs(10), 64);
        let t0 = Instant::now();
        for n in 0..100u32 {
            let a = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            g.record(a, t0);
        }
        assert_eq!(g.len(), 100);
        let later = t0 + FAILED_LOGIN_WINDOW + Duration::from_secs(1);
        g.record(ip("192.0.2.1"), later);
        assert_eq!(g.len(), 1, "the old sources aged out");
        assert_eq!(g.order.len(), 1, "each entry queued once");
    }

    #[test]
    fn a_flood_of_new_sources_cannot_flush_a_block() {
        let mut g = FailedLogins::new(1, Duration::from_secs(10), 64);
        let t0 = Instant::now();
        g.record(ip("2001:db8:1:1::1"), t0).expect("blocked");
        for n in 0..(3 * MAX_FAILED_LOGIN_SOURCES as u128) {
            let a = IpAddr::from(std::net::Ipv6Addr::from(
                (0x2001_0db9u128 << 96) | (n << 64),
            ));
            g.record(a, t0);
        }
        assert!(g.len() <= MAX_FAILED_LOGIN_SOURCES + 1);
        assert!(g.is_blocked(ip("2001:db8:1:1::2"), t0), "still blocked");
    }
}
