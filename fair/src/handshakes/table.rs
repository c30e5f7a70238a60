//! The pending handshakes and who gives way to a newcomer: pure state, no
//! I/O and no clock (a handshake's progress is read from its
//! [`Progress`], which orders events by a counter, not by time).
//!
//! A newcomer from source S is admitted, in this order:
//! 1. S holds fewer than its room (what the program lets S hold now) and
//!    a handshake slot is free: admitted.
//! 2. S holds its whole room: S's **least progressed** handshake gives way
//!    (the lowest stage, the one that reached it first), reason
//!    [`ShedReason::SourceFull`]. With no handshake to give (its room is 0),
//!    refused ([`RefuseReason::SourceFull`]).
//! 3. Every slot is taken: a source holding fewer than the heaviest
//!    source by at least two takes the heaviest source's least progressed
//!    handshake ([`ShedReason::LighterSource`]); otherwise S holds its
//!    share and gives way its own least progressed one
//!    ([`ShedReason::BudgetFull`]), or is refused without one
//!    ([`RefuseReason::BudgetShare`]).
//!
//! Before the handshake a member looks like any other connection from its
//! address; what tells them apart is that a member's handshake moves at
//! once. An attacker renewing stalled handshakes keeps shedding its own
//! (each of them is older at its stage than the member's); a member whose
//! handshake progresses is younger at every stage it reaches, so it is the
//! last of its source to give way.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::progress::Progress;
use crate::map::SourceMap;
use crate::source::SourceKey;

/// The budgets of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Handshakes in progress at once, all sources together (at least 1).
    pub max_pending: usize,
    /// IPv6 prefix length sources are keyed at (see [`SourceKey`]).
    pub ipv6_prefix_len: u8,
}

/// Why a handshake was shed for a newcomer (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// Its source held all it may and a newcomer of the same source came.
    SourceFull,
    /// Every slot was taken and a newcomer of its source, which holds its
    /// share, came.
    BudgetFull,
    /// Every slot was taken and a source holding fewer than its own came.
    LighterSource,
}

impl ShedReason {
    /// Every reason, to pre-create labels.
    pub const ALL: [ShedReason; 3] = [
        ShedReason::SourceFull,
        ShedReason::BudgetFull,
        ShedReason::LighterSource,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SourceFull => "source_full",
            Self::BudgetFull => "budget_full",
            Self::LighterSource => "lighter_source",
        }
    }
}

/// Why a newcomer was refused (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// Its source may hold no handshake now and holds none to give way.
    SourceFull,
    /// Every slot is taken, its source holds its share, and none of them
    /// is its own to give way.
    BudgetShare,
}

impl RefuseReason {
    /// Every reason, to pre-create labels.
    pub const ALL: [RefuseReason; 2] = [RefuseReason::SourceFull, RefuseReason::BudgetShare];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SourceFull => "source_full",
            Self::BudgetShare => "budget_share",
        }
    }
}

/// How far a shed handshake had got (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Progressed {
    /// Not a byte received: it never started.
    None,
    /// It had started.
    Partial,
}

impl Progressed {
    /// Both, to pre-create labels.
    pub const ALL: [Progressed; 2] = [Progressed::None, Progressed::Partial];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Partial => "partial",
        }
    }
}

/// A handshake that gave way to a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    /// Why.
    pub reason: ShedReason,
    /// The source it came from.
    pub source: SourceKey,
    /// How far it had got.
    pub progressed: Progressed,
}

/// One handshake in progress.
#[derive(Debug)]
struct Entry {
    id: u64,
    progress: Arc<Progress>,
    shed: CancellationToken,
}

/// A newcomer admitted.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) source: SourceKey,
    pub(crate) id: u64,
    /// Cancelled when this handshake is shed in its turn.
    pub(crate) shed: CancellationToken,
    /// The handshake that gave way to it, if any (its token is cancelled).
    pub(crate) gave_way: Option<Shed>,
}

/// The handshakes in progress, by source.
#[derive(Debug)]
pub(crate) struct Table {
    capacity: usize,
    used: usize,
    /// Each source's handshakes (a source is present while it holds one).
    sources: SourceMap<Vec<Entry>>,
    /// (handshakes held, source) of every source present: the heaviest last.
    by_held: BTreeSet<(usize, SourceKey)>,
    next_id: u64,
}

impl Table {
    pub(crate) fn new(limits: Limits) -> Self {
        let capacity = limits.max_pending.max(1);
        Self {
            capacity,
            used: 0,
            // Never more sources than handshakes; aggregates IPv6 sources
            // once half of them are distinct.
            sources: SourceMap::new(capacity, limits.ipv6_prefix_len),
            by_held: BTreeSet::new(),
            next_id: 0,
        }
    }

    /// Handshakes in progress.
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// Slots in all.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Handshakes the source of `ip` holds.
    pub(crate) fn held_by(&self, ip: IpAddr) -> usize {
        let key = self.sources.key_of(ip);
        self.sources.get(&key).map_or(0, Vec::len)
    }

    /// Handshakes the source of `ip` holds that have started (a byte
    /// received, or waiting unread).
    pub(crate) fn started_by(&self, ip: IpAddr) -> usize {
        let key = self.sources.key_of(ip);
        self.sources.get(&key).map_or(0, |v| {
            v.iter()
                .filter(|e| e.progress.stage() > 0 || e.progress.unread())
                .count()
        })
    }

    /// Sources holding a handshake.
    pub(crate) fn sources(&self) -> usize {
        self.sources.len()
    }

    /// Admits a newcomer from `ip`, whose source may hold `room`
    /// handshakes now, with `progress` (see the module docs).
    pub(crate) fn admit(
        &mut self,
        ip: IpAddr,
        room: usize,
        progress: Arc<Progress>,
    ) -> Result<Admitted, RefuseReason> {
        let key = self.sources.key_of(ip);
        let mine = self.sources.get(&key).map_or(0, Vec::len);
        let mut gave_way = None;
        if mine >= room {
            if mine == 0 {
                return Err(RefuseReason::SourceFull);
            }
            gave_way = self.shed_from(key, ShedReason::SourceFull);
        } else if self.used >= self.capacity {
            let heaviest = self.by_held.iter().next_back().copied();
            gave_way = match heaviest {
                Some((max, heavy)) if mine + 1 < max => {
                    self.shed_from(heavy, ShedReason::LighterSource)
                }
                _ if mine > 0 => self.shed_from(key, ShedReason::BudgetFull),
                _ => return Err(RefuseReason::BudgetShare),
            };
        }
        // After a shed the table may key `ip` differently (it has room
        // again): the newcomer counts under the key it has now.
        let (source, entries) = self.sources.entry(ip);
        let before = entries.len();
        let id = self.next_id;
        self.next_id += 1;
        let shed = CancellationToken::new();
        entries.push(Entry {
            id,
            progress,
            shed: shed.clone(),
        });
        self.by_held.remove(&(before, source));
        self.by_held.insert((before + 1, source));
        self.used += 1;
        Ok(Admitted {
            source,
            id,
            shed,
            gave_way,
        })
    }

    /// Sheds `source`'s least progressed handshake: cancels it and frees
    /// its slot here.
    fn shed_from(&mut self, source: SourceKey, reason: ShedReason) -> Option<Shed> {
        let entries = self.sources.get(&source)?;
        let ranks: Vec<_> = entries.iter().map(|e| e.progress.rank()).collect();
        let (victim, started) = least_progressed(&ranks, |i| entries[i].progress.unread())?;
        let e = self.remove_at(source, victim)?;
        e.shed.cancel();
        Some(Shed {
            reason,
            source,
            progressed: if started {
                Progressed::Partial
            } else {
                Progressed::None
            },
        })
    }

    /// The handshake `id` of `source` ended (completed, failed or
    /// dropped); nothing if it was shed already.
    pub(crate) fn release(&mut self, source: SourceKey, id: u64) {
        let Some(i) = self
            .sources
            .get(&source)
            .and_then(|v| v.iter().position(|e| e.id == id))
        else {
            return;
        };
        self.remove_at(source, i);
    }

    fn remove_at(&mut self, source: SourceKey, i: usize) -> Option<Entry> {
        let entries = self.sources.get_mut(&source)?;
        let before = entries.len();
        let e = entries.swap_remove(i);
        self.used -= 1;
        self.by_held.remove(&(before, source));
        if before > 1 {
            self.by_held.insert((before - 1, source));
        } else {
            self.sources.remove(&source);
        }
        Some(e)
    }
}

/// Which of the handshakes ranked `ranks` (stage, order it reached it)
/// gives way first, and whether it had started: the lowest stage, and of
/// those the one that reached it first. A handshake at stage 0 whose bytes
/// wait unread (`unread(i)`, asked in rank order, only of stage 0 ones
/// until one is silent) counts as having reached stage 1 just now. `None`
/// for no handshake.
pub fn least_progressed(
    ranks: &[(u8, u64)],
    mut unread: impl FnMut(usize) -> bool,
) -> Option<(usize, bool)> {
    let mut order: Vec<usize> = (0..ranks.len()).collect();
    order.sort_unstable_by_key(|&i| ranks[i]);
    let mut first_unread = None;
    for i in order {
        let stage = ranks[i].0;
        if stage == 0 {
            if !unread(i) {
                return Some((i, false));
            }
            first_unread.get_or_insert(i);
            continue;
        }
        // Unread ones rank as stage 1 reached now: after every other
        // stage 1, before stage 2.
        return match first_unread {
            Some(u) if stage >= 2 => Some((u, true)),
            _ => Some((i, true)),
        };
    }
    first_unread.map(|u| (u, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    /// A table and the clock its handshakes' progress is ordered by.
    fn table(max_pending: usize) -> (Table, Arc<AtomicU64>) {
        let t = Table::new(Limits {
            max_pending,
            ipv6_prefix_len: 64,
        });
        (t, Arc::new(AtomicU64::new(0)))
    }

    fn arrive(clock: &Arc<AtomicU64>) -> Arc<Progress> {
        Arc::new(Progress::new(clock.clone()))
    }

    #[test]
    fn the_least_progressed_is_the_lowest_stage_reached_first() {
        let none = |_| false;
        assert_eq!(least_progressed(&[], none), None);
        let ranks = [(2, 1), (0, 7), (1, 3), (0, 9)];
        assert_eq!(least_progressed(&ranks, none), Some((1, false)));
        let ranks = [(2, 5), (2, 4), (3, 1)];
        assert_eq!(least_progressed(&ranks, none), Some((1, true)));
    }

    #[test]
    fn bytes_waiting_unread_count_as_a_start() {
        // The oldest silent one has bytes waiting: the next silent one goes.
        let ranks = [(0, 1), (0, 2), (0, 3)];
        let mut asked = Vec::new();
        let got = least_progressed(&ranks, |i| {
            asked.push(i);
            i == 0
        });
        assert_eq!(got, Some((1, false)));
        assert_eq!(
            asked,
            [0, 1],
            "asked in rank order, only until a silent one"
        );
        // Every stage-0 one has bytes waiting: they rank as stage 1 reached
        // now, after a stage-1 one, before a stage-2 one.
        let all = |_| true;
        assert_eq!(least_progressed(&[(0, 1), (1, 9)], all), Some((1, true)));
        assert_eq!(least_progressed(&[(0, 1), (2, 0)], all), Some((0, true)));
        assert_eq!(least_progressed(&[(0, 4), (0, 1)], all), Some((1, true)));
    }

    #[test]
    fn a_newcomer_at_its_sources_room_sheds_the_silent_oldest_not_the_progressing() {
        let (mut t, clock) = table(1024);
        // The flood's silent handshakes fill the source's room of 4...
        let flood: Vec<_> = (0..4)
            .map(|_| {
                let p = arrive(&clock);
                let a = t.admit(ip(5), 4, p.clone()).expect("room");
                (p, a)
            })
            .collect();
        // ...a member from the same address takes the oldest one's place...
        let member = arrive(&clock);
        let m = t.admit(ip(5), 4, member.clone()).expect("sheds");
        let shed = m.gave_way.expect("one gave way");
        assert_eq!(
            (shed.reason, shed.progressed),
            (ShedReason::SourceFull, Progressed::None)
        );
        assert!(flood[0].1.shed.is_cancelled(), "the oldest silent one");
        assert_eq!((t.len(), t.held_by(ip(5))), (4, 4));
        // ...and its handshake moves at once.
        member.advance();
        // The flood renews: each newcomer sheds the flood's own, never the
        // member's, however many come.
        for _ in 0..100 {
            let a = t.admit(ip(5), 4, arrive(&clock)).expect("sheds its own");
            assert_eq!(a.gave_way.map(|s| s.progressed), Some(Progressed::None));
            assert!(!m.shed.is_cancelled(), "the member's handshake stays");
        }
        assert_eq!(t.len(), 4);
        t.release(m.source, m.id);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_flood_that_starts_its_handshakes_sheds_its_older_ones_first() {
        let (mut t, clock) = table(1024);
        // Four that started and stall at the same stage.
        let flood: Vec<_> = (0..4)
            .map(|_| {
                let p = arrive(&clock);
                let a = t.admit(ip(5), 4, p.clone()).expect("room");
                p.advance();
                p.advance();
                (p, a)
            })
            .collect();
        // The member arrives (it sheds the stalled one that reached its
        // stage first) and reaches the same stage: it did so last.
        let member = arrive(&clock);
        let m = t.admit(ip(5), 4, member.clone()).expect("sheds");
        assert_eq!(m.gave_way.map(|s| s.progressed), Some(Progressed::Partial));
        assert!(flood[0].1.shed.is_cancelled());
        member.advance();
        member.advance();
        // Renewals arrive silent, then stall at the stage too: the older
        // stalled ones give way first, the member last.
        for (i, (_, stalled)) in flood.iter().enumerate().skip(1) {
            let p = arrive(&clock);
            let a = t.admit(ip(5), 4, p.clone()).expect("sheds");
            assert!(stalled.shed.is_cancelled(), "stalled one {i}");
            assert!(a.gave_way.is_some());
            p.advance();
            p.advance();
            assert!(!m.shed.is_cancelled());
        }
    }

    #[test]
    fn a_source_with_no_room_and_nothing_to_give_is_refused() {
        let (mut t, clock) = table(8);
        assert_eq!(
            t.admit(ip(5), 0, arrive(&clock)).err(),
            Some(RefuseReason::SourceFull)
        );
        assert_eq!(t.len(), 0);
        // A source whose room shrank below what it holds sheds one per newcomer.
        let a = t.admit(ip(5), 2, arrive(&clock)).expect("room");
        let b = t.admit(ip(5), 0, arrive(&clock)).expect("sheds");
        assert!(a.shed.is_cancelled());
        assert_eq!(b.gave_way.map(|s| s.reason), Some(ShedReason::SourceFull));
    }

    #[test]
    fn the_global_budget_is_shared_fairly_by_source() {
        let (mut t, clock) = table(4);
        let flood: Vec<_> = (0..4)
            .map(|_| t.admit(ip(5), 64, arrive(&clock)).expect("free"))
            .collect();
        // A lighter source takes the heaviest one's least progressed.
        let m = t.admit(ip(9), 64, arrive(&clock)).expect("lighter");
        assert_eq!(
            m.gave_way.map(|s| (s.reason, s.source)),
            Some((ShedReason::LighterSource, SourceKey::new(ip(5), 64)))
        );
        assert!(flood[0].shed.is_cancelled());
        // The flood renews: all taken, it holds more, so it sheds its own.
        let r = t.admit(ip(5), 64, arrive(&clock)).expect("its own");
        assert_eq!(r.gave_way.map(|s| s.reason), Some(ShedReason::BudgetFull));
        assert!(flood[1].shed.is_cancelled());
        assert!(!m.shed.is_cancelled());
        // 3 + 1: a third source takes one of the heaviest's (2, 1, 1).
        let c = t.admit(ip(7), 64, arrive(&clock)).expect("lighter");
        assert_eq!(
            c.gave_way.map(|s| s.reason),
            Some(ShedReason::LighterSource)
        );
        // Four sources holding one each (in /24s of their own: the table
        // keys IPv4 sources per /24 once it fills): a fifth is refused its
        // share.
        let (mut t, clock) = table(4);
        let far = |n: u8| IpAddr::from([10, n, 0, 1]);
        for n in 1..=4 {
            t.admit(far(n), 64, arrive(&clock)).expect("free");
        }
        assert_eq!(
            t.admit(far(5), 64, arrive(&clock)).err(),
            Some(RefuseReason::BudgetShare)
        );
        assert_eq!(t.sources(), 4);
    }

    #[test]
    fn a_shed_handshake_released_later_frees_nothing_twice() {
        let (mut t, clock) = table(2);
        let a = t.admit(ip(5), 1, arrive(&clock)).expect("free");
        let b = t.admit(ip(5), 1, arrive(&clock)).expect("sheds a");
        assert!(a.shed.is_cancelled());
        t.release(a.source, a.id);
        assert_eq!(t.len(), 1);
        t.release(b.source, b.id);
        assert_eq!((t.len(), t.sources()), (0, 0));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Under any sequence of arrivals, progress and ends: never more
            /// than the capacity, the counts match the live handshakes, a
            /// source past its room never grows, and a handshake that moved
            /// last among its source's is never the one shed while an
            /// older one of a lower or equal stage is there.
            #[test]
            fn accounting_and_order_hold(
                ops in proptest::collection::vec((0u8..4, 0u8..3, 0usize..6), 1..300)
            ) {
                let (mut t, clock) = table(6);
                let mut live: Vec<(Arc<Progress>, Admitted)> = Vec::new();
                for (src, op, room) in ops {
                    match op {
                        0 => {
                            let before = t.held_by(ip(src));
                            let p = arrive(&clock);
                            let ranks: Vec<_> = live
                                .iter()
                                .filter(|(_, a)| a.source == SourceKey::new(ip(src), 64))
                                .map(|(p, a)| (p.rank(), a.id))
                                .collect();
                            match t.admit(ip(src), room, p.clone()) {
                                Ok(a) => {
                                    if let Some(s) = a.gave_way
                                        && s.reason == ShedReason::SourceFull
                                    {
                                        prop_assert!(before >= room);
                                        prop_assert_eq!(t.held_by(ip(src)), before);
                                        // The one shed had the least rank of its source.
                                        let shed = live
                                            .iter()
                                            .find(|(_, l)| l.shed.is_cancelled())
                                            .map(|(p, _)| p.rank());
                                        let min = ranks.iter().map(|(r, _)| *r).min();
                                        prop_assert_eq!(shed, min);
                                    }
                                    live.push((p, a));
                                }
                                Err(_) => prop_assert_eq!(t.held_by(ip(src)), before),
                            }
                        }
                        1 => {
                            if let Some((p, _)) = live.get(room % live.len().max(1)) {
                                p.advance();
                            }
                        }
                        _ => {
                            if !live.is_empty() {
                                let (_, a) = live.remove(room % live.len());
                                t.release(a.source, a.id);
                            }
                        }
                    }
                    live.retain(|(_, a)| !a.shed.is_cancelled());
                    prop_assert_eq!(t.len(), live.len());
                    prop_assert!(t.len() <= t.capacity());
                    let sum: usize = t.by_held.iter().map(|(n, _)| *n).sum();
                    prop_assert_eq!(sum, t.len());
                    prop_assert_eq!(t.by_held.len(), t.sources());
                }
            }
        }
    }
}
