//! Log lines that a peer can cause, at most once a minute per peer and kind.
//!
//! A peer that repeats a refused request thousands of times a second must
//! not turn each refusal into a log line: the log would grow at the
//! attacker's rate (20,000 policy pushes and 20,000 go-aways over one
//! circuit once added 716 KB to a member's log in a fraction of a second).
//! Every such line goes through one [`LogGate`]: it lets the first line of
//! a kind about a key (a PeerId, a source address) through, then lets none
//! of that key and kind through for [`LOG_EVERY`], counting what it holds
//! back; the next line that passes reports that count (`suppressed`), and
//! every line held back is counted in the program's
//! `…_log_suppressed_total{kind}` (each kind created at 0).
//!
//! The table is bounded ([`MAX_LOG_KEYS`] entries). A key that does not
//! fit shares one entry per kind with every other key that does not fit
//! (the overflow entry), so a flood of fresh PeerIds or addresses costs at
//! most one line a minute per kind, and cannot flush the entries already
//! there. Entries leave through a queue in the order they were logged,
//! never by a scan: one whose minute is over leaves at the next call, or,
//! if it held lines back, one minute later (so its count still reaches the
//! next line about it if that comes soon).
//!
//! Pure bookkeeping under one short lock; [`LogGate::pass_at`] takes the
//! time so tests need no clock.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Shortest interval between two lines of one kind about one key.
pub const LOG_EVERY: Duration = Duration::from_secs(60);
/// Keys (with their kind) remembered at most; past it they share the
/// overflow entry of their kind. 4,096 entries are about 400 KiB with
/// PeerId keys.
pub const MAX_LOG_KEYS: usize = 4096;

/// `{kind}` of `…_log_suppressed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// What the held-back lines were about (a name the program declares).
    pub kind: &'static str,
}

/// A per-key, per-kind gate for log lines; cloning shares it.
#[derive(Clone, Debug)]
pub struct LogGate<K> {
    inner: Arc<Mutex<Table<K>>>,
    suppressed: Family<KindLabel, Counter>,
    /// Time zero of [`LogGate::pass`]'s clock.
    origin: tokio::time::Instant,
}

#[derive(Debug)]
struct Table<K> {
    entries: HashMap<(K, &'static str), Entry>,
    /// One entry per kind for the keys that did not fit.
    overflow: HashMap<&'static str, Entry>,
    /// (time queued, key, kind), oldest first: each entry has one live item
    /// (the one whose time is its `queued`); older ones are skipped.
    queue: VecDeque<(Duration, K, &'static str)>,
    max: usize,
    every: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When its last line passed.
    logged: Duration,
    /// Lines held back since then.
    suppressed: u64,
    /// The time of its live queue item.
    queued: Duration,
    /// Whether it was kept one more interval for its held-back count.
    kept: bool,
}

impl Entry {
    fn new(now: Duration) -> Self {
        Self {
            logged: now,
            suppressed: 0,
            queued: now,
            kept: false,
        }
    }

    /// A line arrives at `now`: `Some(held back before it)` if it passes.
    fn hit(&mut self, now: Duration, every: Duration) -> Option<u64> {
        if now < self.logged.saturating_add(every) {
            self.suppressed += 1;
            return None;
        }
        let n = std::mem::take(&mut self.suppressed);
        self.logged = now;
        self.kept = false;
        Some(n)
    }
}

impl<K: Hash + Eq + Clone> Default for LogGate<K> {
    /// A gate of [`MAX_LOG_KEYS`] keys, one line per [`LOG_EVERY`], no kind
    /// created yet (see [`LogGate::new`]).
    fn default() -> Self {
        Self::with_bounds(&[], MAX_LOG_KEYS, LOG_EVERY)
    }
}

impl<K: Hash + Eq + Clone> LogGate<K> {
    /// A gate of [`MAX_LOG_KEYS`] keys letting one line per [`LOG_EVERY`]
    /// through per key and kind; `kinds` are created at 0 in the metric.
    pub fn new(kinds: &[&'static str]) -> Self {
        Self::with_bounds(kinds, MAX_LOG_KEYS, LOG_EVERY)
    }

    /// As [`LogGate::new`], with `max_keys` entries (at least 1) and one
    /// line per `every`.
    pub fn with_bounds(kinds: &[&'static str], max_keys: usize, every: Duration) -> Self {
        let suppressed = Family::<KindLabel, Counter>::default();
        for kind in kinds {
            let _ = suppressed.get_or_create(&KindLabel { kind });
        }
        Self {
            inner: Arc::new(Mutex::new(Table {
                entries: HashMap::new(),
                overflow: HashMap::new(),
                queue: VecDeque::new(),
                max: max_keys.max(1),
                every,
            })),
            suppressed,
            origin: tokio::time::Instant::now(),
        }
    }

    /// A gate of its own table, keyed by `K2`, counting into this gate's
    /// metric (for a site keyed by something else, e.g. a source name).
    pub fn sharing<K2: Hash + Eq + Clone>(&self) -> LogGate<K2> {
        let t = self.inner.lock();
        LogGate {
            inner: Arc::new(Mutex::new(Table {
                entries: HashMap::new(),
                overflow: HashMap::new(),
                queue: VecDeque::new(),
                max: t.max,
                every: t.every,
            })),
            suppressed: self.suppressed.clone(),
            origin: self.origin,
        }
    }

    /// Creates `kinds` at 0 in the metric (for a gate made with `default`).
    pub fn precreate(&self, kinds: &[&'static str]) {
        for kind in kinds {
            let _ = self.suppressed.get_or_create(&KindLabel { kind });
        }
    }

    /// Registers the held-back lines as `log_suppressed_total{kind}` in
    /// `registry` (under the program's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "log_suppressed",
            "Log lines held back because a line of the same kind about the same \
             peer or source was logged less than a minute before",
            self.suppressed.clone(),
        );
    }

    /// Whether a line of `kind` about `key` is to be logged now: `Some(n)`
    /// if so, `n` lines of that kind and key having been held back since
    /// the last one (log it as `suppressed = n`); `None` if it is held back
    /// (and counted).
    pub fn pass(&self, key: &K, kind: &'static str) -> Option<u64> {
        self.pass_at(key, kind, self.origin.elapsed())
    }

    /// [`LogGate::pass`] at `now` (any clock that never goes back).
    pub fn pass_at(&self, key: &K, kind: &'static str, now: Duration) -> Option<u64> {
        let passed = self.inner.lock().pass(key, kind, now);
        if passed.is_none() {
            self.suppressed.get_or_create(&KindLabel { kind }).inc();
        }
        passed
    }

    /// Entries held now (overflow entries not counted).
    pub fn tracked(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// Lines of `kind` held back so far (what the metric says).
    pub fn suppressed(&self, kind: &'static str) -> u64 {
        self.suppressed.get_or_create(&KindLabel { kind }).get()
    }
}

impl<K: Hash + Eq + Clone> Table<K> {
    fn pass(&mut self, key: &K, kind: &'static str, now: Duration) -> Option<u64> {
        // Monotonic, so the queue stays in order whatever the caller's clock does.
        let now = self.queue.back().map_or(now, |b| now.max(b.0));
        self.expire(now);
        let every = self.every;
        let k = (key.clone(), kind);
        if let Some(e) = self.entries.get_mut(&k) {
            let passed = e.hit(now, every);
            if passed.is_some() {
                e.queued = now;
                self.queue.push_back((now, k.0, kind));
            }
            return passed;
        }
        if self.entries.len() < self.max {
            self.entries.insert(k, Entry::new(now));
            self.queue.push_back((now, key.clone(), kind));
            return Some(0);
        }
        match self.overflow.get_mut(kind) {
            Some(e) => e.hit(now, every),
            None => {
                self.overflow.insert(kind, Entry::new(now));
                Some(0)
            }
        }
    }

    /// Drops the entries whose interval is over (see the module doc).
    fn expire(&mut self, now: Duration) {
        while let Some((at, _, _)) = self.queue.front() {
            if now < at.saturating_add(self.every) {
                return;
            }
            let Some((at, key, kind)) = self.queue.pop_front() else {
                return;
            };
            let k = (key, kind);
            let Some(e) = self.entries.get_mut(&k) else {
                continue;
            };
            if e.queued != at {
                continue; // a newer item stands for it
            }
            if e.suppressed == 0 || e.kept {
                self.entries.remove(&k);
            } else {
                e.kept = true;
                e.queued = now;
                self.queue.push_back((now, k.0, kind));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn one_line_a_minute_per_key_and_kind_with_the_count_held_back() {
        let g = LogGate::<u32>::new(&["a", "b"]);
        assert_eq!(g.pass_at(&1, "a", S), Some(0));
        for _ in 0..999 {
            assert_eq!(g.pass_at(&1, "a", 2 * S), None);
        }
        assert_eq!(g.pass_at(&1, "b", 2 * S), Some(0), "per kind");
        assert_eq!(g.pass_at(&2, "a", 2 * S), Some(0), "per key");
        assert_eq!(g.pass_at(&1, "a", 60 * S), None, "59 s after its line");
        assert_eq!(
            g.pass_at(&1, "a", 61 * S),
            Some(1000),
            "the count comes next"
        );
        assert_eq!(g.pass_at(&1, "a", 62 * S), None);
        assert_eq!(g.suppressed("a"), 1001);
        assert_eq!(g.suppressed("b"), 0);
    }

    #[test]
    fn kinds_are_created_at_zero_and_registered() {
        let g = LogGate::<u32>::new(&["policy_push", "goaway"]);
        let mut r = Registry::with_prefix("agentmesh_test");
        g.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        assert!(
            text.contains(r#"agentmesh_test_log_suppressed_total{kind="policy_push"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentmesh_test_log_suppressed_total{kind="goaway"} 0"#),
            "{text}"
        );
    }

    #[test]
    fn a_flood_of_keys_stays_bounded_and_shares_one_line_per_kind() {
        let g = LogGate::<u32>::with_bounds(&["k"], 16, LOG_EVERY);
        let mut passed = 0;
        for key in 0..100_000 {
            if g.pass_at(&key, "k", S).is_some() {
                passed += 1;
            }
        }
        // 16 keys in the table, one line for all the others.
        assert_eq!(passed, 17);
        assert_eq!(g.tracked(), 16);
        assert_eq!(g.suppressed("k"), 100_000 - 17);
        // The entries already there keep their minute: no flush.
        assert_eq!(g.pass_at(&3, "k", 2 * S), None);
        // A minute on, the table empties as lines come, and new keys get in.
        let later = S + LOG_EVERY;
        assert_eq!(g.pass_at(&500_000, "k", later), Some(0));
        assert_eq!(
            g.tracked(),
            2,
            "old entries left through the queue; 3 stays a minute for its held-back line"
        );
    }

    #[test]
    fn an_entry_that_held_lines_back_is_kept_one_more_minute_then_leaves() {
        let g = LogGate::<u32>::new(&["k"]);
        assert_eq!(g.pass_at(&1, "k", S), Some(0));
        assert_eq!(g.pass_at(&1, "k", 2 * S), None);
        assert_eq!(g.pass_at(&1, "k", 3 * S), None);
        // Another key's line a minute on expires entries, but 1 stays for its count.
        assert_eq!(g.pass_at(&2, "k", 70 * S), Some(0));
        assert_eq!(g.tracked(), 2);
        assert_eq!(g.pass_at(&1, "k", 100 * S), Some(2));
        // Quiet for two minutes: it leaves.
        assert_eq!(g.pass_at(&3, "k", 200 * S), Some(0));
        assert_eq!(g.pass_at(&3, "k", 300 * S), Some(0));
        assert_eq!(g.tracked(), 1);
    }

    #[test]
    fn the_queue_stays_bounded_under_a_steady_flood_of_one_key() {
        let g = LogGate::<u32>::with_bounds(&["k"], 4, LOG_EVERY);
        for ms in 0..200_000u64 {
            let _ = g.pass_at(&1, "k", Duration::from_millis(ms * 500));
        }
        let t = g.inner.lock();
        assert!(t.queue.len() <= 4, "{}", t.queue.len());
        assert_eq!(t.entries.len(), 1);
    }

    #[test]
    fn a_sharing_gate_has_its_own_table_and_the_same_metric() {
        let g = LogGate::<u32>::new(&["k"]);
        let by_name = g.sharing::<&'static str>();
        assert_eq!(g.pass_at(&1, "k", S), Some(0));
        assert_eq!(by_name.pass_at(&"push", "k", S), Some(0));
        assert_eq!(by_name.pass_at(&"push", "k", S), None);
        assert_eq!(g.suppressed("k"), 1);
        assert_eq!(g.tracked(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn pass_reads_tokio_time() {
        let g = LogGate::<u32>::new(&["k"]);
        assert_eq!(g.pass(&1, "k"), Some(0));
        assert_eq!(g.pass(&1, "k"), None);
        tokio::time::advance(LOG_EVERY).await;
        assert_eq!(g.pass(&1, "k"), Some(1));
    }
}
