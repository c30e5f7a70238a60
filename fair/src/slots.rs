//! Slots held for a while (an auth stream until its login ends, a request
//! in flight), shared max-min fairly among sources once all are taken.
//!
//! While a slot is free anyone gets it. When all are taken, a source that
//! holds fewer slots than the heaviest source (by at least two, so two
//! equal sources do not take slots from each other back and forth) takes
//! the heaviest source's **least recently active** slot: the one acquired
//! longest ago, unless its holder reports activity ([`Slot::touch`], e.g.
//! a call that moves bytes), in which case the one whose activity is
//! oldest. The longest-idle slot is the one most likely stalled on
//! purpose, and a peer that renews its stalled streams keeps losing its
//! oldest, while a slot doing work is cut last. Otherwise the request is refused: the
//! source already holds its share. The result is that under contention no
//! source holds more than about `capacity / sources` while another source
//! wants more, and without contention one source may hold all of them.
//!
//! A source is either an address ([`FairSlots::new`], [`FairSlots::try_acquire`]:
//! keyed through a [`SourceMap`], so IPv6 prefixes count as one source and
//! a flood of prefixes is aggregated) or any key the caller already trusts
//! to name one party ([`FairSlots::keyed`], [`FairSlots::try_acquire_key`]:
//! e.g. the PeerId a connection's handshake proved, where minting a new key
//! costs the party an enrollment). Keyed tables need no bound of their
//! own: a source is in the table only while it holds a slot, so there are
//! never more sources than slots.
//!
//! The holder of a taken slot learns it through [`Slot::revoked`] and must
//! stop what the slot paid for (close the stream, fail the request); the
//! slot is already accounted to its new source when `try_acquire` returns.
//! One mutex guards the state; each operation is O(log sources).

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

use crate::map::{MapStats, SourceMap};
use crate::source::SourceKey;

/// What [`FairSlots`] can count sources by: [`SourceKey`] (addresses) or
/// any small copyable key (a PeerId).
pub trait SlotKey: Copy + Ord + Hash + fmt::Debug + Send + 'static {}

impl<T: Copy + Ord + Hash + fmt::Debug + Send + 'static> SlotKey for T {}

/// A budget of `capacity` slots shared fairly among sources keyed by `K`.
#[derive(Debug, Clone)]
pub struct FairSlots<K: SlotKey = SourceKey> {
    inner: Arc<Mutex<State<K>>>,
    /// Orders acquisitions and activity: each takes the next tick, so the
    /// lowest stamp is the least recently active slot (no clock needed).
    ticks: Arc<AtomicU64>,
}

/// One held slot: its id, its revocation, and the tick of its last
/// activity (its acquisition until [`Slot::touch`]).
#[derive(Debug)]
struct HeldSlot {
    id: u64,
    revoked: CancellationToken,
    active: Arc<AtomicU64>,
}

/// Slots held by one source, oldest first.
type Held = VecDeque<HeldSlot>;

#[derive(Debug)]
struct State<K: SlotKey> {
    capacity: usize,
    used: usize,
    /// Every source holding a slot, and its slots.
    held: HashMap<K, Held>,
    /// Address sources only: the table that decides which key a new
    /// address counts under. Its entries are exactly the keys of `held`.
    addresses: Option<SourceMap<()>>,
    /// Drops a source that holds no slot any more from `addresses`.
    forget: fn(&mut Option<SourceMap<()>>, &K),
    /// (slots held, source) of every source holding any: the heaviest last.
    by_held: BTreeSet<(usize, K)>,
    next_id: u64,
    preempted_total: u64,
}

/// A slot granted by [`FairSlots::try_acquire`] or [`FairSlots::try_acquire_key`].
#[derive(Debug)]
pub struct Acquired<K: SlotKey = SourceKey> {
    /// The slot; dropping it frees it.
    pub slot: Slot<K>,
    /// The source whose oldest slot was taken for this one, if any (count
    /// it: it is the share binding).
    pub preempted: Option<K>,
}

/// Why a slot was refused: every slot is taken and this source already
/// holds at least its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRefusal<K = SourceKey> {
    /// The source refused.
    pub source: K,
    /// Slots it holds.
    pub held: usize,
    /// `capacity / sources holding slots`, for the log line.
    pub fair_share: usize,
}

fn forget_address(addresses: &mut Option<SourceMap<()>>, source: &SourceKey) {
    if let Some(a) = addresses {
        a.remove(source);
    }
}

fn forget_nothing<K>(_: &mut Option<SourceMap<()>>, _: &K) {}

impl FairSlots<SourceKey> {
    /// `capacity` slots (at least 1) shared by addresses, per-source state
    /// for at most `max_sources` sources (see [`SourceMap`]), IPv6 sources
    /// keyed at `ipv6_prefix_len` bits.
    pub fn new(capacity: usize, max_sources: usize, ipv6_prefix_len: u8) -> Self {
        Self::with_state(
            capacity,
            Some(SourceMap::new(max_sources, ipv6_prefix_len)),
            forget_address,
        )
    }

    /// A slot for a request from `ip`, taking the heaviest source's oldest
    /// slot when all are taken and `ip`'s source holds fewer (see the module
    /// docs).
    pub fn try_acquire(&self, ip: IpAddr) -> Result<Acquired, SlotRefusal> {
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let key = st.address_key(ip);
        let tick = self.tick();
        // After a preemption the table may key `ip` differently (it has
        // room again): the slot goes to the key it has now.
        let r = st.acquire(key, tick, |st| match &mut st.addresses {
            Some(a) => a.entry(ip).0,
            None => key,
        });
        drop(guard);
        r.map(|granted| self.granted(granted))
    }

    /// Slots the source of `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let st = self.inner.lock();
        let key = st.address_key(ip);
        st.held.get(&key).map_or(0, VecDeque::len)
    }

    /// The source table's numbers.
    pub fn source_stats(&self) -> MapStats {
        let st = self.inner.lock();
        match &st.addresses {
            Some(a) => a.stats(),
            None => MapStats {
                sources: st.held.len(),
                ..MapStats::default()
            },
        }
    }
}

impl<K: SlotKey> FairSlots<K> {
    /// `capacity` slots (at least 1) shared by sources named by keys the
    /// caller hands in as they are (no aggregation).
    pub fn keyed(capacity: usize) -> Self {
        Self::with_state(capacity, None, forget_nothing::<K>)
    }

    fn with_state(
        capacity: usize,
        addresses: Option<SourceMap<()>>,
        forget: fn(&mut Option<SourceMap<()>>, &K),
    ) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                capacity: capacity.max(1),
                used: 0,
                held: HashMap::new(),
                addresses,
                forget,
                by_held: BTreeSet::new(),
                next_id: 0,
                preempted_total: 0,
            })),
            ticks: Arc::default(),
        }
    }

    /// A slot for source `key`, taking the heaviest source's oldest slot
    /// when all are taken and `key` holds fewer (see the module docs).
    pub fn try_acquire_key(&self, key: K) -> Result<Acquired<K>, SlotRefusal<K>> {
        let tick = self.tick();
        let r = self.inner.lock().acquire(key, tick, |_| key);
        r.map(|granted| self.granted(granted))
    }

    fn tick(&self) -> u64 {
        self.ticks.fetch_add(1, Ordering::Relaxed)
    }

    fn granted(&self, (source, id, revoked, active, preempted): Granted<K>) -> Acquired<K> {
        Acquired {
            slot: Slot {
                inner: self.inner.clone(),
                ticks: self.ticks.clone(),
                source,
                id,
                revoked,
                active,
            },
            preempted,
        }
    }

    /// Slots `key` holds now.
    pub fn held_by_key(&self, key: &K) -> usize {
        self.inner.lock().held.get(key).map_or(0, VecDeque::len)
    }

    /// Sources holding at least one slot now.
    pub fn sources(&self) -> usize {
        self.inner.lock().held.len()
    }

    /// Slots taken now.
    pub fn in_use(&self) -> usize {
        self.inner.lock().used
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.inner.lock().capacity
    }

    /// Slots taken from one source for another, since start.
    pub fn preempted_total(&self) -> u64 {
        self.inner.lock().preempted_total
    }
}

/// A slot booked under the lock: (source, id, revocation, activity tick,
/// preempted source).
type Granted<K> = (K, u64, CancellationToken, Arc<AtomicU64>, Option<K>);

impl State<SourceKey> {
    /// The key `ip` counts under now.
    fn address_key(&self, ip: IpAddr) -> SourceKey {
        match &self.addresses {
            Some(a) => a.key_of(ip),
            None => SourceKey::new(ip, crate::source::IPV6_MAX_PREFIX_LEN),
        }
    }
}

impl<K: SlotKey> State<K> {
    /// Books a slot for `key` (preempting if the share allows), active as
    /// of `tick`; `rekey` gives the key the slot is booked under once room
    /// is made.
    fn acquire(
        &mut self,
        key: K,
        tick: u64,
        rekey: impl FnOnce(&mut Self) -> K,
    ) -> Result<Granted<K>, SlotRefusal<K>> {
        let mine = self.held.get(&key).map_or(0, VecDeque::len);
        let mut preempted = None;
        if self.used >= self.capacity {
            let heaviest = self.by_held.iter().next_back().copied();
            match heaviest {
                Some((max, heavy)) if mine + 1 < max => {
                    self.take_least_active(heavy);
                    preempted = Some(heavy);
                }
                _ => {
                    let fair_share = self.capacity / self.by_held.len().max(1);
                    return Err(SlotRefusal {
                        source: key,
                        held: mine,
                        fair_share,
                    });
                }
            }
        }
        let key = rekey(self);
        let id = self.next_id;
        self.next_id += 1;
        let token = CancellationToken::new();
        let active = Arc::new(AtomicU64::new(tick));
        let held = self.held.entry(key).or_default();
        let before = held.len();
        held.push_back(HeldSlot {
            id,
            revoked: token.clone(),
            active: active.clone(),
        });
        self.by_held.remove(&(before, key));
        self.by_held.insert((before + 1, key));
        self.used += 1;
        Ok((key, id, token, active, preempted))
    }

    /// Takes `source`'s least recently active slot (its oldest among
    /// equals): cancels its token and frees it here. A scan of the
    /// source's slots, at most `capacity`.
    fn take_least_active(&mut self, source: K) {
        let Some(held) = self.held.get_mut(&source) else {
            return;
        };
        let before = held.len();
        let idlest = held
            .iter()
            .enumerate()
            .min_by_key(|(i, h)| (h.active.load(Ordering::Relaxed), *i))
            .map(|(i, _)| i);
        let Some(taken) = idlest.and_then(|i| held.remove(i)) else {
            return;
        };
        taken.revoked.cancel();
        self.after_release(source, before);
        self.preempted_total += 1;
    }

    /// Frees slot `id` of `source`, unless it was taken already.
    fn release(&mut self, source: K, id: u64) {
        let Entry::Occupied(mut e) = self.held.entry(source) else {
            return;
        };
        let held = e.get_mut();
        let before = held.len();
        let Some(pos) = held.iter().position(|h| h.id == id) else {
            return;
        };
        held.remove(pos);
        self.after_release(source, before);
    }

    /// Books one slot of `source` (which held `before`) as freed.
    fn after_release(&mut self, source: K, before: usize) {
        self.used -= 1;
        self.by_held.remove(&(before, source));
        if before > 1 {
            self.by_held.insert((before - 1, source));
        } else {
            self.held.remove(&source);
            if self.held.capacity() > 64 && self.held.len() * 4 < self.held.capacity() {
                self.held.shrink_to(self.held.len() * 2);
            }
            (self.forget)(&mut self.addresses, &source);
        }
    }
}

/// One slot of a [`FairSlots`]; freed on drop.
#[derive(Debug)]
pub struct Slot<K: SlotKey = SourceKey> {
    inner: Arc<Mutex<State<K>>>,
    ticks: Arc<AtomicU64>,
    source: K,
    id: u64,
    revoked: CancellationToken,
    active: Arc<AtomicU64>,
}

impl<K: SlotKey> Slot<K> {
    /// Notes that what the slot pays for is doing work now (a call moved
    /// bytes): when its source's slots are preempted, slots that were
    /// active more recently go last. Two atomic operations, no lock.
    pub fn touch(&self) {
        let tick = self.ticks.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_max(tick, Ordering::Relaxed);
    }

    /// The source this slot is charged to.
    pub fn source(&self) -> K {
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

impl<K: SlotKey> Drop for Slot<K> {
    fn drop(&mut self) {
        if self.revoked.is_cancelled() {
            return; // already freed by `take_least_active`
        }
        self.inner.lock().release(self.source, self.id);
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
    fn the_slot_taken_is_the_least_recently_active_one() {
        let slots: FairSlots<u8> = FairSlots::keyed(4);
        let attacker: Vec<_> = (0..4)
            .map(|_| slots.try_acquire_key(1).expect("free").slot)
            .collect();
        // The two oldest move bytes; the third was never active since it
        // was acquired, so it is the idlest.
        attacker[1].touch();
        attacker[0].touch();
        let first = slots.try_acquire_key(2).expect("newcomer");
        assert_eq!(first.preempted, Some(1));
        assert!(attacker[2].is_revoked(), "the idlest went first");
        assert!(!attacker[0].is_revoked() && !attacker[1].is_revoked());
        // Then the fourth (idle too), then the one active longest ago.
        let _second = slots.try_acquire_key(3).expect("another newcomer");
        assert!(attacker[3].is_revoked());
        assert_eq!(slots.held_by_key(&1), 2);
        let _third = slots.try_acquire_key(4).expect("a third");
        assert!(attacker[1].is_revoked(), "touched before the other");
        assert!(!attacker[0].is_revoked(), "the most recently active stays");
        // Slots that never report activity go oldest first, as before.
        let plain: FairSlots<u8> = FairSlots::keyed(2);
        let a = plain.try_acquire_key(1).expect("a").slot;
        let b = plain.try_acquire_key(1).expect("b").slot;
        let _c = plain.try_acquire_key(2).expect("c");
        assert!(a.is_revoked() && !b.is_revoked());
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
                prop_assert_eq!(st.by_held.len(), st.held.len());
                prop_assert_eq!(st.addresses.as_ref().map(SourceMap::len), Some(st.held.len()));
            }
        }

        /// The same for keyed slots, and the share: once all are taken, a
        /// key refused holds at least the heaviest key's count minus one.
        #[test]
        fn keyed_accounting_holds(ops in proptest::collection::vec((0u8..5, any::<bool>()), 1..300)) {
            let slots: FairSlots<u8> = FairSlots::keyed(6);
            let mut live: Vec<Slot<u8>> = Vec::new();
            for (src, drop_one) in ops {
                if drop_one && !live.is_empty() {
                    live.remove(usize::from(src) % live.len());
                    continue;
                }
                match slots.try_acquire_key(src) {
                    Ok(a) => {
                        prop_assert_eq!(a.slot.source(), src);
                        live.push(a.slot);
                    }
                    Err(r) => {
                        let st = slots.inner.lock();
                        let max = st.by_held.iter().next_back().map_or(0, |(n, _)| *n);
                        prop_assert!(r.held + 1 >= max);
                        prop_assert_eq!(st.used, st.capacity);
                    }
                }
                live.retain(|s| !s.is_revoked());
                prop_assert_eq!(slots.in_use(), live.len());
                for k in 0u8..5 {
                    let mine = live.iter().filter(|s| s.source() == k).count();
                    prop_assert_eq!(slots.held_by_key(&k), mine);
                }
                let st = slots.inner.lock();
                prop_assert_eq!(st.by_held.len(), st.held.len());
                prop_assert!(st.addresses.is_none());
            }
        }
    }

    /// A PeerId-like key: 32 opaque bytes.
    type Peer = [u8; 32];

    fn peer(n: u8) -> Peer {
        [n; 32]
    }

    #[test]
    fn keyed_slots_share_by_key_not_by_address() {
        let slots: FairSlots<Peer> = FairSlots::keyed(4);
        // One key may take every slot while nobody else asks.
        let attacker: Vec<_> = (0..4)
            .map(|_| slots.try_acquire_key(peer(1)).expect("free").slot)
            .collect();
        assert_eq!((slots.in_use(), slots.sources()), (4, 1));
        let r = slots.try_acquire_key(peer(1)).expect_err("full, holds all");
        assert_eq!((r.source, r.held, r.fair_share), (peer(1), 4, 4));
        // A second key takes the first key's oldest slot.
        let member = slots.try_acquire_key(peer(2)).expect("newcomer gets in");
        assert_eq!(member.preempted, Some(peer(1)));
        assert!(attacker[0].is_revoked());
        assert_eq!(slots.held_by_key(&peer(1)), 3);
        assert_eq!(slots.held_by_key(&peer(2)), 1);
        // Renewing is refused now; a third key still gets in (3, 1 -> 2, 1, 1).
        assert!(slots.try_acquire_key(peer(1)).is_err());
        let third = slots.try_acquire_key(peer(3)).expect("third");
        assert_eq!(third.preempted, Some(peer(1)));
        assert_eq!(slots.preempted_total(), 2);
        // Freed slots leave no source behind.
        drop((attacker, member, third));
        assert_eq!((slots.in_use(), slots.sources()), (0, 0));
    }

    #[test]
    fn address_slots_forget_sources_that_hold_nothing() {
        let slots = FairSlots::new(8, 4, 64);
        for n in 1..=20u8 {
            let a = slots.try_acquire(ip(n)).expect("room");
            assert_eq!(a.slot.source().prefix_len(), 32, "never aggregated: {n}");
        }
        assert_eq!(slots.source_stats().sources, 0);
        assert_eq!(slots.source_stats().aggregated_total, 0);
    }
}
