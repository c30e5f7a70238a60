//! Slots held for a while (an auth stream until its login ends, a request
//! in flight), shared max-min fairly among sources once all are taken.
//!
//! While a slot is free anyone gets it. When all are taken, a source that
//! holds fewer slots than the heaviest source (by at least two, so two
//! equal sources do not take slots from each other back and forth) takes
//! the heaviest source's **oldest** slot: the longest-held slot is the one
//! most likely stalled on purpose, and a peer that renews its stalled
//! streams keeps losing its oldest. Otherwise the request is refused: the
//! source already holds its share. The result is that under contention no
//! source holds more than about `capacity / sources` while another source
//! wants more, and without contention one source may hold all of them.
//!
//! The holder of a taken slot learns it through [`Slot::revoked`] and must
//! stop what the slot paid for (close the stream, fail the request); the
//! slot is already accounted to its new source when `try_acquire` returns.
//! One mutex guards the state; each operation is O(log sources).

use std::collections::{BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::map::{MapStats, SourceMap};
use crate::source::SourceKey;

/// A budget of `capacity` slots shared fairly among sources.
#[derive(Debug, Clone)]
pub struct FairSlots {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    capacity: usize,
    used: usize,
    sources: SourceMap<Held>,
    /// (slots held, source) of every source holding any: the heaviest last.
    by_held: BTreeSet<(usize, SourceKey)>,
    next_id: u64,
    preempted_total: u64,
}

#[derive(Debug, Default)]
struct Held {
    /// Oldest first.
    slots: VecDeque<(u64, CancellationToken)>,
}

/// A slot granted by [`FairSlots::try_acquire`].
#[derive(Debug)]
pub struct Acquired {
    /// The slot; dropping it frees it.
    pub slot: Slot,
    /// The source whose oldest slot was taken for this one, if any (count
    /// it: it is the share binding).
    pub preempted: Option<SourceKey>,
}

/// Why [`FairSlots::try_acquire`] refused: every slot is taken and this
/// source already holds at least its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRefusal {
    /// The source refused.
    pub source: SourceKey,
    /// Slots it holds.
    pub held: usize,
    /// `capacity / sources holding slots`, for the log line.
    pub fair_share: usize,
}

impl FairSlots {
    /// `capacity` slots (at least 1), per-source state for at most
    /// `max_sources` sources (see [`SourceMap`]), IPv6 sources keyed at
    /// `ipv6_prefix_len` bits.
    pub fn new(capacity: usize, max_sources: usize, ipv6_prefix_len: u8) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                capacity: capacity.max(1),
                used: 0,
                sources: SourceMap::new(max_sources, ipv6_prefix_len),
                by_held: BTreeSet::new(),
                next_id: 0,
                preempted_total: 0,
            })),
        }
    }

    /// A slot for a request from `ip`, taking the heaviest source's oldest
    /// slot when all are taken and `ip`'s source holds fewer (see the module
    /// docs).
    pub fn try_acquire(&self, ip: IpAddr) -> Result<Acquired, SlotRefusal> {
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let key = st.sources.key_of(ip);
        let mine = st.sources.get(&key).map_or(0, |h| h.slots.len());
        let mut preempted = None;
        if st.used >= st.capacity {
            let heaviest = st.by_held.iter().next_back().copied();
            match heaviest {
                Some((max, heavy)) if mine + 1 < max => {
                    st.take_oldest(heavy);
                    preempted = Some(heavy);
                }
                _ => {
                    let fair_share = st.capacity / st.by_held.len().max(1);
                    return Err(SlotRefusal {
                        source: key,
                        held: mine,
                        fair_share,
                    });
                }
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        let token = CancellationToken::new();
        let (key, held) = st.sources.entry(ip);
        let before = held.slots.len();
        held.slots.push_back((id, token.clone()));
        st.by_held.remove(&(before, key));
        st.by_held.insert((before + 1, key));
        st.used += 1;
        drop(guard);
        Ok(Acquired {
            slot: Slot {
                inner: self.inner.clone(),
                source: key,
                id,
                revoked: token,
            },
            preempted,
        })
    }

    /// Slots taken now.
    pub fn in_use(&self) -> usize {
        self.inner.lock().used
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.inner.lock().capacity
    }

    /// Slots the source of `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let st = self.inner.lock();
        let key = st.sources.key_of(ip);
        st.sources.get(&key).map_or(0, |h| h.slots.len())
    }

    /// Slots taken from one source for another, since start.
    pub fn preempted_total(&self) -> u64 {
        self.inner.lock().preempted_total
    }

    /// The source table's numbers.
    pub fn source_stats(&self) -> MapStats {
        self.inner.lock().sources.stats()
    }
}

impl State {
    /// Takes `source`'s oldest slot: cancels its token and frees it here.
    fn take_oldest(&mut self, source: SourceKey) {
        let Some(held) = self.sources.get_mut(&source) else {
            return;
        };
        let before = held.slots.len();
        let Some((_, token)) = held.slots.pop_front() else {
            return;
        };
        token.cancel();
        self.after_release(source, before);
        self.preempted_total += 1;
    }

    /// Books one slot of `source` (which held `before`) as freed.
    fn after_release(&mut self, source: SourceKey, before: usize) {
        self.used -= 1;
        self.by_held.remove(&(before, source));
        if before > 1 {
            self.by_held.insert((before - 1, source));
        } else {
            self.sources.remove(&source);
        }
    }
}

/// One slot of a [`FairSlots`]; freed on drop.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Mutex<State>>,
    source: SourceKey,
    id: u64,
    revoked: CancellationToken,
}

impl Slot {
    /// The source this slot is charged to.
    pub fn source(&self) -> SourceKey {
        self.source
    }

    /// Whether the slot was taken for another source.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// Completes once the slot is taken for another source: stop what it
    /// paid for.
    pub fn revoked(&self) -> WaitForCancellationFuture<'_> {
        self.revoked.cancelled()
    }

    /// [`Slot::revoked`] as a future that owns what it waits on, for a
    /// holder that polls it from its own `poll` (an I/O wrapper).
    pub fn revoked_owned(&self) -> WaitForCancellationFutureOwned {
        self.revoked.clone().cancelled_owned()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.revoked.is_cancelled() {
            return; // already freed by `take_oldest`
        }
        let mut st = self.inner.lock();
        let Some(held) = st.sources.get_mut(&self.source) else {
            return;
        };
        let before = held.slots.len();
        let Some(pos) = held.slots.iter().position(|(id, _)| *id == self.id) else {
            return;
        };
        held.slots.remove(pos);
        st.after_release(self.source, before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn one_source_may_take_every_slot_while_nobody_else_asks() {
        let slots = FairSlots::new(8, 64, 64);
        let held: Vec<_> = (0..8)
            .map(|_| slots.try_acquire(ip(1)).expect("free slot"))
            .collect();
        assert!(held.iter().all(|a| a.preempted.is_none()));
        assert_eq!(slots.in_use(), 8);
        let r = slots
            .try_acquire(ip(1))
            .expect_err("full, and it holds all");
        assert_eq!((r.held, r.fair_share), (8, 8));
    }

    #[test]
    fn a_newcomer_takes_the_heaviest_sources_oldest_slot() {
        let slots = FairSlots::new(4, 64, 64);
        let attacker: Vec<_> = (0..4)
            .map(|_| slots.try_acquire(ip(1)).expect("slot").slot)
            .collect();
        let member = slots.try_acquire(ip(2)).expect("the newcomer gets in");
        assert_eq!(member.preempted, Some(attacker[0].source()));
        assert!(attacker[0].is_revoked(), "the oldest was taken");
        assert!(attacker[1..].iter().all(|s| !s.is_revoked()));
        assert_eq!((slots.in_use(), slots.held_by(ip(1))), (4, 3));
        // The attacker renews: refused, it holds more than the member.
        assert!(slots.try_acquire(ip(1)).is_err());
        // Dropping the revoked slot does not free a second time.
        drop(attacker);
        assert_eq!(slots.in_use(), 1);
        assert_eq!(slots.preempted_total(), 1);
    }

    #[test]
    fn equal_sources_do_not_take_from_each_other() {
        let slots = FairSlots::new(4, 64, 64);
        let _a: Vec<_> = (0..2)
            .map(|_| slots.try_acquire(ip(1)).expect("a"))
            .collect();
        let _b: Vec<_> = (0..2)
            .map(|_| slots.try_acquire(ip(2)).expect("b"))
            .collect();
        assert!(slots.try_acquire(ip(1)).is_err());
        assert!(slots.try_acquire(ip(2)).is_err());
        // A third source takes from one of them: 2, 1, 1 is as fair as 4 allows.
        let c = slots.try_acquire(ip(3)).expect("c");
        assert!(c.preempted.is_some());
        assert!(slots.try_acquire(ip(3)).is_err(), "1 + 1 < 2 does not hold");
    }

    #[tokio::test]
    async fn the_holder_sees_revocation() {
        let slots = FairSlots::new(2, 8, 64);
        let a = slots.try_acquire(ip(1)).expect("a").slot;
        let _a2 = slots.try_acquire(ip(1)).expect("a2").slot;
        let waiter = tokio::spawn(async move {
            a.revoked().await;
        });
        let _b = slots.try_acquire(ip(2)).expect("b");
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("revoked within the deadline")
            .expect("task");
    }

    #[tokio::test]
    async fn the_owned_revocation_future_outlives_a_borrow() {
        let slots = FairSlots::new(2, 8, 64);
        let a = slots.try_acquire(ip(1)).expect("a").slot;
        let _a2 = slots.try_acquire(ip(1)).expect("a2").slot;
        let revoked = a.revoked_owned();
        let _b = slots.try_acquire(ip(2)).expect("b");
        tokio::time::timeout(std::time::Duration::from_secs(5), revoked)
            .await
            .expect("revoked within the deadline");
        assert!(a.is_revoked());
    }

    proptest! {
        /// Under any sequence of acquires and drops: never more than
        /// `capacity` live slots, accounting matches the live slots, and a
        /// refused source holds at least as many as every other source
        /// minus one.
        #[test]
        fn accounting_holds(ops in proptest::collection::vec((0u8..5, any::<bool>()), 1..300)) {
            let slots = FairSlots::new(6, 64, 64);
            let mut live: Vec<Slot> = Vec::new();
            for (src, drop_one) in ops {
                if drop_one && !live.is_empty() {
                    live.remove(usize::from(src) % live.len());
                    continue;
                }
                match slots.try_acquire(ip(src)) {
                    Ok(a) => live.push(a.slot),
                    Err(r) => {
                        let st = slots.inner.lock();
                        let max = st.by_held.iter().next_back().map_or(0, |(n, _)| *n);
                        prop_assert!(r.held + 1 >= max);
                        prop_assert_eq!(st.used, st.capacity);
                    }
                }
                live.retain(|s| !s.is_revoked());
                prop_assert_eq!(slots.in_use(), live.len());
                prop_assert!(live.len() <= 6);
                let st = slots.inner.lock();
                let sum: usize = st.by_held.iter().map(|(n, _)| *n).sum();
                prop_assert_eq!(sum, st.used);
                prop_assert_eq!(st.by_held.len(), st.sources.len());
            }
        }
    }
}
