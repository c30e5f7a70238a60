//! Backing off a router whose connection was refused or closed before or
//! while handshaking (not a refusal by the router: that has its own shun).
//! When a router holding thousands of members dies they all re-attach to
//! the survivors at once, and a survivor refuses, before the handshake,
//! more not-yet-admitted connections per source IP than its limit. A fixed
//! 10 s shun made everyone come back together 10 s later; here each member
//! retries after a jittered, exponentially growing delay (short base, a
//! cap, a time budget), so the storm spreads itself out and most members
//! are back within a second or two.
//!
//! Past the budget the router is passed over for a while; a member with
//! nothing else left tries it again early (see `super::shun`). That next
//! run resumes at the delay the spent one reached ([`Redials::renew`])
//! rather than at the base: a router that keeps refusing (or is down
//! while the whole mesh restarts) is asked about every [`CAP`] ± 50% by
//! each member, never in a fresh burst of quick retries every cycle.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// First delay (before jitter).
pub(crate) const BASE: Duration = Duration::from_millis(250);
/// Growth per failure.
pub(crate) const FACTOR: u32 = 2;
/// Longest delay (before jitter).
pub(crate) const CAP: Duration = Duration::from_secs(5);
/// Time from the first failure after which the router is shunned instead.
pub(crate) const BUDGET: Duration = Duration::from_secs(30);
/// Jitter: the delay is drawn from `[d × (1 − JITTER), d × (1 + JITTER)]`.
pub(crate) const JITTER: f64 = 0.5;

/// Connection failures in a row to one router.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Redials {
    /// The first failure of this run.
    first: Instant,
    /// Retries scheduled so far.
    attempts: u32,
    /// The budget ran out and the router was passed over.
    spent: bool,
}

impl Redials {
    /// A run of failures starting at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            first: now,
            attempts: 0,
            spent: false,
        }
    }

    /// Whether this run is long over (its budget ended a budget ago): a new
    /// failure then starts a fresh run.
    pub(crate) fn is_stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.first) > BUDGET * 2
    }

    /// The budget ran out: the router is passed over (and tried again
    /// early when nothing else is left).
    pub(crate) fn spend(&mut self) {
        self.spent = true;
    }

    /// A new failure at `now`: a stale run starts afresh at the base; a
    /// spent one (the router tried again after being passed over) gets a
    /// new budget but resumes at the delay it had reached.
    pub(crate) fn renew(&mut self, now: Instant) {
        if self.is_stale(now) {
            *self = Self::new(now);
        } else if self.spent {
            self.first = now;
            self.spent = false;
        }
    }

    /// Retries scheduled so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The delay before the next retry, or `None` once the budget is spent
    /// (the retry would start after [`BUDGET`] from the first failure).
    pub(crate) fn next_delay(&mut self, now: Instant, rng: &mut impl Rng) -> Option<Duration> {
        let d = delay(self.attempts, rng);
        if now.saturating_duration_since(self.first) + d > BUDGET {
            return None;
        }
        self.attempts += 1;
        Some(d)
    }
}

impl Redials {
    /// Like [`Redials::next_delay`], after a router answered busy and named
    /// `retry_after`: the delay is at least `retry_after` (clamped to
    /// [`MIN_RETRY_AFTER`]..=[`MAX_RETRY_AFTER`]) stretched by a jitter of up
    /// to [`RETRY_AFTER_JITTER`], so members refused together do not come
    /// back together, and never shorter than the backoff itself.
    pub(crate) fn next_after(
        &mut self,
        now: Instant,
        retry_after: Duration,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let asked = retry_after
            .clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER)
            .mul_f64(1.0 + rng.gen_range(0.0..=RETRY_AFTER_JITTER));
        let d = asked.max(delay(self.attempts, rng));
        if now.saturating_duration_since(self.first) + d > BUDGET {
            return None;
        }
        self.attempts += 1;
        Some(d)
    }
}

/// Shortest retry-after a busy router may ask for (a lying one cannot make
/// members hammer it).
pub(crate) const MIN_RETRY_AFTER: Duration = Duration::from_millis(100);
/// Longest retry-after honoured (past it the router is passed over by the budget).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// A busy router's retry-after is stretched by up to this share.
pub(crate) const RETRY_AFTER_JITTER: f64 = 0.5;

/// The jittered delay before retry number `attempt` (0-based).
pub(crate) fn delay(attempt: u32, rng: &mut impl Rng) -> Duration {
    let exp = BASE.saturating_mul(FACTOR.saturating_pow(attempt.min(16)));
    let d = exp.min(CAP);
    d.mul_f64(rng.gen_range((1.0 - JITTER)..=(1.0 + JITTER)))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;

    #[test]
    fn delays_grow_from_the_base_to_the_cap_within_the_jitter() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for attempt in 0..20u32 {
            let nominal = BASE
                .saturating_mul(2u32.saturating_pow(attempt.min(16)))
                .min(CAP);
            let (lo, hi) = (nominal.mul_f64(1.0 - JITTER), nominal.mul_f64(1.0 + JITTER));
            let mut seen_lo = nominal;
            let mut seen_hi = nominal;
            for _ in 0..2000 {
                let d = delay(attempt, &mut rng);
                assert!(
                    d >= lo && d <= hi,
                    "attempt {attempt}: {d:?} not in {lo:?}..={hi:?}"
                );
                seen_lo = seen_lo.min(d);
                seen_hi = seen_hi.max(d);
            }
            // The jitter is used: draws cover most of the range both ways.
            let spread = hi - lo;
            assert!(
                seen_lo < lo + spread / 10,
                "attempt {attempt}: lowest {seen_lo:?}"
            );
            assert!(
                seen_hi > hi - spread / 10,
                "attempt {attempt}: highest {seen_hi:?}"
            );
        }
        // First retry: 125–375 ms; from the 5th on: capped at 5 s ± 50%.
        assert_eq!(BASE.mul_f64(1.0 - JITTER), Duration::from_millis(125));
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        assert!(delay(30, &mut rng) <= CAP.mul_f64(1.0 + JITTER));
    }

    #[test]
    fn retries_stop_once_the_budget_is_spent() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let start = Instant::now();
        let mut r = Redials::new(start);
        let mut now = start;
        let mut delays = Vec::new();
        while let Some(d) = r.next_delay(now, &mut rng) {
            delays.push(d);
            now += d;
            assert!(now.duration_since(start) <= BUDGET, "retry past the budget");
            assert!(delays.len() < 100, "never ends");
        }
        // 0.25 + 0.5 + 1 + 2 + 4 + 5 + 5 ... nominal: at least 5 retries fit
        // in 30 s even at +50% jitter, and each retry counted.
        assert!(delays.len() >= 5, "{delays:?}");
        assert_eq!(r.attempts() as usize, delays.len());
        // Spent: still none later.
        assert!(r.next_delay(now + BUDGET, &mut rng).is_none());
        assert!(!r.is_stale(start + BUDGET));
        assert!(r.is_stale(start + BUDGET * 3));
        // A fresh run starts over at the base.
        let mut fresh = Redials::new(now);
        let d = fresh.next_delay(now, &mut rng).expect("first retry");
        assert!(d <= BASE.mul_f64(1.0 + JITTER), "{d:?}");
    }

    #[test]
    fn a_busy_answer_is_honoured_with_jitter_and_within_the_budget() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let start = Instant::now();
        let ask = Duration::from_secs(2);
        let mut seen = Vec::new();
        for _ in 0..1000 {
            let mut r = Redials::new(start);
            let d = r.next_after(start, ask, &mut rng).expect("within budget");
            assert!(
                d >= ask && d <= ask.mul_f64(1.0 + RETRY_AFTER_JITTER),
                "{d:?}"
            );
            seen.push(d);
        }
        // Spread over the jitter window, not one instant.
        seen.sort();
        assert!(
            seen[900] - seen[100] > Duration::from_millis(600),
            "{:?}",
            (seen[100], seen[900])
        );
        // A lying router cannot make members come back at once, nor keep them forever.
        let mut r = Redials::new(start);
        assert!(r.next_after(start, Duration::ZERO, &mut rng).expect("ok") >= MIN_RETRY_AFTER);
        let mut r = Redials::new(start);
        assert!(
            r.next_after(start, Duration::from_secs(3600), &mut rng)
                .is_none(),
            "past the budget"
        );
        // The budget counts busy retries too.
        let mut r = Redials::new(start);
        let mut now = start;
        let mut n = 0;
        while let Some(d) = r.next_after(now, ask, &mut rng) {
            now += d;
            n += 1;
            assert!(now.duration_since(start) <= BUDGET);
        }
        assert!(n >= 3, "{n}");
        assert_eq!(r.attempts(), n);
    }

    #[test]
    fn a_run_after_a_spent_one_resumes_at_its_delay_and_a_stale_one_starts_over() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let start = Instant::now();
        let mut r = Redials::new(start);
        let mut now = start;
        while let Some(d) = r.next_delay(now, &mut rng) {
            now += d;
        }
        let reached = r.attempts();
        r.spend();
        // Passed over, then tried again early (10-15 s later): a new
        // budget, and the delays stay at the cap instead of 250 ms again.
        let again = now + Duration::from_secs(12);
        r.renew(again);
        assert_eq!(r.attempts(), reached);
        let d = r.next_delay(again, &mut rng).expect("a new budget");
        assert!(d >= CAP.mul_f64(1.0 - JITTER), "{d:?}");
        // A renewal of a run that is not spent changes nothing.
        let before = r.attempts();
        r.renew(again + Duration::from_secs(1));
        assert_eq!(r.attempts(), before);
        // Long after, a failure starts a fresh run at the base.
        let later = again + BUDGET * 3;
        r.spend();
        r.renew(later);
        assert_eq!(r.attempts(), 0);
        let d = r.next_delay(later, &mut rng).expect("fresh");
        assert!(d <= BASE.mul_f64(1.0 + JITTER), "{d:?}");
    }

    #[test]
    fn a_storm_of_members_spreads_its_first_retries() {
        // 1,000 members failing at the same instant: their first retries
        // land across the whole jitter window, not on one instant.
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let mut buckets = [0usize; 10];
        let (lo, hi) = (BASE.mul_f64(1.0 - JITTER), BASE.mul_f64(1.0 + JITTER));
        for _ in 0..1000 {
            let d = delay(0, &mut rng);
            let i = ((d - lo).as_secs_f64() / (hi - lo).as_secs_f64() * 10.0) as usize;
            buckets[i.min(9)] += 1;
        }
        // Uniform would be 100 per tenth; none gets more than a quarter.
        assert!(buckets.iter().all(|b| *b > 30 && *b < 250), "{buckets:?}");
    }
}
