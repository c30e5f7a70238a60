//! The router's slot budgets that strangers reach before they are
//! admitted, each shared fairly by source ([`agentmesh_fair::FairSlots`]):
//!
//! - `auth`: auth streams being served (`--auth-max-inflight-streams`);
//! - `catalog`: catalog streams being served (`--catalog-max-inflight-streams`;
//!   peers that are not admitted get none at all);
//! - `auth_queue`: auth streams waiting for an `auth` slot
//!   (`--auth-queue-max-streams`; see `crate::streams`).
//!
//! While a budget has a free slot anyone gets it. When all are taken, a
//! source holding fewer than the heaviest source takes that source's
//! oldest slot (its holder is told and stops: the stream is closed);
//! otherwise it is refused, since it holds
//! its share already. One source may use a whole budget while nobody else
//! asks, so a ladder joining from a few addresses is never slowed.
//!
//! A request refused a slot may also wait for one ([`FairBudget::acquire_waiting`],
//! within a deadline): every freed slot wakes the longest waiter, and while
//! anyone waits newcomers queue behind them ([`FairBudget::has_waiters`]).
//! The waiting itself holds a place of another fair budget, so the queue
//! is bounded and shared by source the same way.
//!
//! Counted in `agentmesh_router_slots_refused_total{budget,reason}` and
//! `agentmesh_router_slots_preempted_total{budget}`; slots held in
//! `agentmesh_router_slots_in_use{budget}`; waits by how they ended in
//! `agentmesh_router_slots_waits_total{budget,outcome}`.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentmesh_fair::{FairSlots, Slot, SlotRefusal};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A slot budget (the `budget` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SlotBudget {
    /// Auth streams being served.
    Auth,
    /// Catalog streams being served.
    Catalog,
    /// Auth streams waiting for an `Auth` slot.
    AuthQueue,
}

impl SlotBudget {
    /// Every budget, to pre-create labels.
    pub(crate) const ALL: [SlotBudget; 3] =
        [SlotBudget::Auth, SlotBudget::Catalog, SlotBudget::AuthQueue];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Catalog => "catalog",
            Self::AuthQueue => "auth_queue",
        }
    }

    /// Whether requests of this budget may wait for a slot (the waits
    /// counted by outcome).
    fn waits(self) -> bool {
        self == Self::Auth
    }

    /// The refusal reasons this budget can count.
    pub(crate) fn reasons(self) -> &'static [SlotRefusalReason] {
        match self {
            Self::Catalog => &[
                SlotRefusalReason::SourceShare,
                SlotRefusalReason::NotAdmitted,
            ],
            Self::Auth | Self::AuthQueue => &[SlotRefusalReason::SourceShare],
        }
    }
}

/// Why a slot was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SlotRefusalReason {
    /// Every slot is taken and the source holds its share.
    SourceShare,
    /// The peer is not admitted, and the budget serves admitted peers only.
    NotAdmitted,
}

impl SlotRefusalReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::SourceShare => "source_share",
            Self::NotAdmitted => "not_admitted",
        }
    }
}

/// How a wait for a slot ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum WaitOutcome {
    /// It got a slot.
    Served,
    /// Its deadline passed first.
    TimedOut,
    /// Its place in the queue was taken for a source holding fewer.
    Preempted,
    /// There was no place in the queue for its source: not waited.
    Full,
}

impl WaitOutcome {
    /// Every outcome, to pre-create labels.
    pub(crate) const ALL: [WaitOutcome; 4] = [
        WaitOutcome::Served,
        WaitOutcome::TimedOut,
        WaitOutcome::Preempted,
        WaitOutcome::Full,
    ];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Served => "served",
            Self::TimedOut => "timed_out",
            Self::Preempted => "preempted",
            Self::Full => "full",
        }
    }
}

/// The counters of every slot budget (registered by the resource metrics).
#[derive(Debug, Clone, Default)]
pub(crate) struct SlotMetrics {
    pub(crate) refused: Family<[(&'static str, &'static str); 2], Counter>,
    pub(crate) preempted: Family<[(&'static str, &'static str); 1], Counter>,
    pub(crate) in_use: Family<[(&'static str, &'static str); 1], Gauge>,
    pub(crate) capacity: Family<[(&'static str, &'static str); 1], Gauge>,
    pub(crate) waits: Family<[(&'static str, &'static str); 2], Counter>,
}

impl SlotMetrics {
    /// Creates every label value at 0.
    pub(crate) fn precreate(&self) {
        for b in SlotBudget::ALL {
            if b.waits() {
                for o in WaitOutcome::ALL {
                    let _ = self
                        .waits
                        .get_or_create(&[("budget", b.as_str()), ("outcome", o.as_str())]);
                }
            }
            for r in b.reasons() {
                let _ = self
                    .refused
                    .get_or_create(&[("budget", b.as_str()), ("reason", r.as_str())]);
            }
            let _ = self.preempted.get_or_create(&[("budget", b.as_str())]);
            let _ = self.in_use.get_or_create(&[("budget", b.as_str())]);
            let _ = self.capacity.get_or_create(&[("budget", b.as_str())]);
        }
    }
}

/// The address a source-less stream or connection counts under (one
/// shared source: only direct connections carry an address).
const NO_SOURCE: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// One slot budget, shared fairly by source, with its counters.
#[derive(Debug, Clone)]
pub(crate) struct FairBudget {
    budget: SlotBudget,
    slots: FairSlots,
    metrics: SlotMetrics,
    /// Woken (one waiter) each time a slot is freed.
    freed: Arc<Notify>,
    /// Requests waiting for a slot now.
    waiting: Arc<AtomicUsize>,
}

/// A slot held; freed (and uncounted) on drop.
#[derive(Debug)]
pub(crate) struct HeldSlot {
    slot: Slot,
    in_use: Gauge,
    freed: Arc<Notify>,
}

impl HeldSlot {
    /// Completes when the slot was taken for another source: stop what it
    /// paid for.
    pub(crate) async fn revoked(&self) {
        self.slot.revoked().await;
    }

    /// Whether the slot was taken for another source.
    #[cfg(test)]
    pub(crate) fn is_revoked(&self) -> bool {
        self.slot.is_revoked()
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.in_use.dec();
        // The slot is free once `slot` drops, right after this: the woken
        // waiter runs later, on its own task.
        self.freed.notify_one();
    }
}

/// Why a wait for a slot ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// The deadline passed.
    TimedOut,
    /// The waiter's place was taken for a source holding fewer.
    Preempted,
}

/// Counts a request as waiting while it lives.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FairBudget {
    /// `capacity` slots of `budget` (at least 1), IPv6 sources keyed at
    /// `ipv6_prefix_len` bits; counted in `metrics`.
    pub(crate) fn new(
        budget: SlotBudget,
        capacity: usize,
        ipv6_prefix_len: u8,
        metrics: SlotMetrics,
    ) -> Self {
        let capacity = capacity.max(1);
        metrics
            .capacity
            .get_or_create(&[("budget", budget.as_str())])
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        // At most `capacity` sources hold slots at once: the table never
        // needs more, and aggregates IPv6 sources once half of them are
        // distinct (a flood of /64s then counts as its /56 or /48).
        Self {
            budget,
            slots: FairSlots::new(capacity, capacity, ipv6_prefix_len),
            metrics,
            freed: Arc::new(Notify::new()),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A slot for a request from `ip` (`None`: a connection without an
    /// address), taking the heaviest source's oldest when all are taken;
    /// refusals and preemptions counted.
    pub(crate) fn try_acquire(&self, ip: Option<IpAddr>) -> Result<HeldSlot, SlotRefusal> {
        let r = self.acquire_now(ip);
        if r.is_err() {
            self.refused(SlotRefusalReason::SourceShare);
        }
        r
    }

    /// [`Self::try_acquire`] without counting a refusal (the caller counts
    /// what becomes of the request).
    pub(crate) fn try_acquire_quiet(&self, ip: Option<IpAddr>) -> Result<HeldSlot, SlotRefusal> {
        self.acquire_now(ip)
    }

    fn acquire_now(&self, ip: Option<IpAddr>) -> Result<HeldSlot, SlotRefusal> {
        let label = [("budget", self.budget.as_str())];
        let a = self.slots.try_acquire(ip.unwrap_or(NO_SOURCE))?;
        if a.preempted.is_some() {
            self.metrics.preempted.get_or_create(&label).inc();
        }
        let in_use = self.metrics.in_use.get_or_create(&label).clone();
        in_use.inc();
        Ok(HeldSlot {
            slot: a.slot,
            in_use,
            freed: self.freed.clone(),
        })
    }

    /// Whether requests are waiting for a slot now (a newcomer should wait
    /// behind them rather than take a slot just freed for them).
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    /// A slot for a request from `ip`, waiting for one to be freed until
    /// `until` while `place` (its place in a queue) is not taken. Waiters
    /// are woken one per freed slot, longest waiting first; a woken waiter
    /// that finds no slot free (a request without waiters' courtesy took
    /// it) waits again. The outcome is counted.
    pub(crate) async fn acquire_waiting(
        &self,
        ip: Option<IpAddr>,
        until: Instant,
        place: &HeldSlot,
    ) -> Result<HeldSlot, NoSlot> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(self.waiting.clone());
        let r = loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Ok(slot) = self.acquire_now(ip) {
                break Ok(slot);
            }
            tokio::select! {
                biased;
                () = place.revoked() => break Err(NoSlot::Preempted),
                () = tokio::time::sleep_until(until) => break Err(NoSlot::TimedOut),
                () = &mut notified => {}
            }
        };
        if r.is_err() && self.slots.in_use() < self.slots.capacity() {
            // This waiter may have been woken for a slot it now leaves:
            // pass the wake-up on.
            self.freed.notify_one();
        }
        let outcome = match r {
            Ok(_) => WaitOutcome::Served,
            Err(NoSlot::TimedOut) => WaitOutcome::TimedOut,
            Err(NoSlot::Preempted) => WaitOutcome::Preempted,
        };
        self.count_wait(outcome);
        r
    }

    /// Counts a wait of this budget ending in `outcome`.
    pub(crate) fn count_wait(&self, outcome: WaitOutcome) {
        self.metrics
            .waits
            .get_or_create(&[
                ("budget", self.budget.as_str()),
                ("outcome", outcome.as_str()),
            ])
            .inc();
    }

    /// Counts a refusal of this budget for `reason`.
    pub(crate) fn refused(&self, reason: SlotRefusalReason) {
        self.metrics
            .refused
            .get_or_create(&[
                ("budget", self.budget.as_str()),
                ("reason", reason.as_str()),
            ])
            .inc();
    }

    /// The budget's label.
    pub(crate) fn label(&self) -> &'static str {
        self.budget.as_str()
    }

    /// Slots taken now.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.in_use()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, n]))
    }

    #[tokio::test]
    async fn a_newcomer_takes_the_heaviest_sources_oldest_and_both_are_counted() {
        let m = SlotMetrics::default();
        m.precreate();
        let b = FairBudget::new(SlotBudget::Auth, 2, 64, m.clone());
        let first = b.try_acquire(ip(66)).expect("free");
        let _second = b.try_acquire(ip(66)).expect("free");
        let label = [("budget", "auth")];
        assert_eq!(m.in_use.get_or_create(&label).get(), 2);
        // The attacker's renewal is refused: it holds every slot.
        assert!(b.try_acquire(ip(66)).is_err());
        let refused = [("budget", "auth"), ("reason", "source_share")];
        assert_eq!(m.refused.get_or_create(&refused).get(), 1);
        // A member from elsewhere gets in; the oldest is revoked.
        let _member = b.try_acquire(ip(9)).expect("preempts");
        assert_eq!(m.preempted.get_or_create(&label).get(), 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), first.revoked())
            .await
            .expect("the holder is told");
        assert!(first.is_revoked());
        drop(first);
        assert_eq!(m.in_use.get_or_create(&label).get(), 2);
        assert_eq!(b.in_use(), 2);
        // Source-less requests share one source.
        assert!(b.try_acquire(None).is_err(), "full, and 1 + 1 < 1 fails");
    }

    #[tokio::test]
    async fn a_waiter_gets_the_next_freed_slot_or_ends_at_its_deadline_or_preemption() {
        let m = SlotMetrics::default();
        m.precreate();
        let b = FairBudget::new(SlotBudget::Auth, 1, 64, m.clone());
        let q = FairBudget::new(SlotBudget::AuthQueue, 2, 64, m.clone());
        let held = b.try_acquire(ip(9)).expect("free");
        let waits = |o: WaitOutcome| {
            m.waits
                .get_or_create(&[("budget", "auth"), ("outcome", o.as_str())])
                .get()
        };
        // Nobody frees it: the deadline ends the wait.
        let place = q.try_acquire(ip(9)).expect("a place");
        let until = Instant::now() + std::time::Duration::from_millis(50);
        assert_eq!(
            b.acquire_waiting(ip(9), until, &place).await.err(),
            Some(NoSlot::TimedOut)
        );
        assert_eq!(waits(WaitOutcome::TimedOut), 1);
        // Freed while waiting: the waiter gets it.
        let far = Instant::now() + std::time::Duration::from_secs(30);
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let r = b.acquire_waiting(ip(9), far, &place).await.map(|_| ());
                drop(place);
                r
            })
        };
        while !b.has_waiters() {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert_eq!(waiter.await.expect("join"), Ok(()));
        assert_eq!(waits(WaitOutcome::Served), 1);
        assert!(!b.has_waiters());
        // Its place taken for a lighter source: the wait ends at once.
        let _held = b.try_acquire(ip(9)).expect("free again");
        let p1 = q.try_acquire(ip(9)).expect("a place");
        let _p2 = q.try_acquire(ip(9)).expect("a place");
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire_waiting(ip(9), far, &p1).await.map(|_| ()) })
        };
        while !b.has_waiters() {
            tokio::task::yield_now().await;
        }
        let _newcomer = q.try_acquire(ip(7)).expect("preempts the oldest place");
        assert_eq!(waiter.await.expect("join"), Err(NoSlot::Preempted));
        assert_eq!(waits(WaitOutcome::Preempted), 1);
        // Waiting retries are not counted as refusals.
        let refused = [("budget", "auth"), ("reason", "source_share")];
        assert_eq!(m.refused.get_or_create(&refused).get(), 0);
    }
}
