//! The memory budget of strangers, as pure policy: what connections and
//! inbound streams of peers that are not admitted may be charged, on top
//! of (not instead of) the router's memory budget. Strangers' charges can
//! never take more than this pool, so they never crowd members out of the
//! rest of the budget.
//!
//! Inside the pool, sources share fairly without preemption: while the
//! pool is at most half used anyone may charge it; past half, a source may
//! hold at most `pool / (n + 2)`, `n` being the other sources holding part
//! of it. The `+ 2` counts the source itself and leaves room for one more,
//! so a newcomer always finds some pool left: a lone source stops at half,
//! two at a third each, sixteen at a seventeenth.
//!
//! - [`admit`]: the decision (counts in, decision out);
//! - [`StrangerPool`]: what the pool holds, in total and by source.
//!
//! The manager's bookkeeping per peer (charges in, out on release, moved
//! out at admission) is `resources::strangers`.

use std::collections::HashMap;

use super::{CONTROL_STREAM_CHARGE_BYTES, Refusal, Resource, Scope};
use crate::resources::source::SourceKey;
use crate::shrink::ShrinkSparse;

/// The strangers' charges relevant to one more charge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StrangerUsage {
    /// Charged to the pool now, bytes.
    pub(crate) used_bytes: u64,
    /// Charged to the pool by this charge's source now, bytes.
    pub(crate) source_bytes: u64,
    /// Other sources holding part of the pool.
    pub(crate) other_sources: u32,
    /// Whether the charge's source is known (direct connections): without
    /// one, only the pool's size applies.
    pub(crate) has_source: bool,
}

/// The pool for a memory budget of `memory_budget_bytes`: `percent` of it,
/// at least one source's whole share of unauthenticated connections
/// (`unauthenticated_per_source` connections, each with an auth and an
/// identify stream in flight), at most the budget.
pub(crate) fn pool_bytes(
    memory_budget_bytes: u64,
    percent: u8,
    connection_charge_bytes: u64,
    unauthenticated_per_source: u32,
) -> u64 {
    let floor = u64::from(unauthenticated_per_source)
        .saturating_mul(connection_charge_bytes.saturating_add(2 * CONTROL_STREAM_CHARGE_BYTES));
    crate::resources::memory::budget(memory_budget_bytes, percent)
        .max(floor)
        .min(memory_budget_bytes)
}

/// May strangers' charges grow by `charge` bytes? Refused with scope
/// `unauthenticated` when the pool is full, `source` when past half and
/// the source holds its share (see the module docs).
pub(crate) fn admit(pool_bytes: u64, u: StrangerUsage, charge: u64) -> Result<(), Refusal> {
    let after = u.used_bytes.saturating_add(charge);
    if after > pool_bytes {
        return Err(Refusal::new(Resource::Memory, Scope::Unauthenticated));
    }
    let share = pool_bytes / (u64::from(u.other_sources) + 2);
    if u.has_source && after > pool_bytes / 2 && u.source_bytes.saturating_add(charge) > share {
        return Err(Refusal::new(Resource::Memory, Scope::Source));
    }
    Ok(())
}

/// What strangers hold of the pool, in total and by source (the manager's
/// per-peer records say which peer holds what).
#[derive(Debug, Default)]
pub(crate) struct StrangerPool {
    used: u64,
    by_source: HashMap<SourceKey, u64>,
}

impl StrangerPool {
    /// The usage a charge from `source` sees.
    pub(crate) fn usage(&self, source: Option<SourceKey>) -> StrangerUsage {
        let mine = source.and_then(|s| self.by_source.get(&s).copied());
        let holders = u32::try_from(self.by_source.len()).unwrap_or(u32::MAX);
        StrangerUsage {
            used_bytes: self.used,
            source_bytes: mine.unwrap_or(0),
            other_sources: holders - u32::from(mine.is_some()),
            has_source: source.is_some(),
        }
    }

    /// Adds `bytes` charged by `source`.
    pub(crate) fn charge(&mut self, source: Option<SourceKey>, bytes: u64) {
        self.used = self.used.saturating_add(bytes);
        if let Some(s) = source {
            let v = self.by_source.entry(s).or_default();
            *v = v.saturating_add(bytes);
        }
    }

    /// Removes `bytes` charged by `source`.
    pub(crate) fn uncharge(&mut self, source: Option<SourceKey>, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
        if let Some(s) = source
            && let Some(v) = self.by_source.get_mut(&s)
        {
            *v = v.saturating_sub(bytes);
            if *v == 0 {
                self.by_source.remove(&s);
                self.by_source.shrink_sparse();
            }
        }
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Sources holding part of the pool.
    pub(crate) fn sources(&self) -> usize {
        self.by_source.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POOL: u64 = 1000;

    fn usage(used: u64, source: u64, others: u32) -> StrangerUsage {
        StrangerUsage {
            used_bytes: used,
            source_bytes: source,
            other_sources: others,
            has_source: true,
        }
    }

    #[test]
    fn a_lone_source_stops_at_half_and_leaves_room_for_a_newcomer() {
        assert!(admit(POOL, usage(0, 0, 0), 500).is_ok());
        assert_eq!(
            admit(POOL, usage(500, 500, 0), 1),
            Err(Refusal::new(Resource::Memory, Scope::Source))
        );
        // The newcomer (one other source holds 500) gets up to a third.
        assert!(admit(POOL, usage(500, 0, 1), 333).is_ok());
        assert!(admit(POOL, usage(833, 333, 1), 1).is_err());
        assert_eq!(
            admit(POOL, usage(999, 0, 5), 2),
            Err(Refusal::new(Resource::Memory, Scope::Unauthenticated))
        );
        let unknown = StrangerUsage {
            has_source: false,
            ..usage(900, 900, 0)
        };
        assert!(admit(POOL, unknown, 100).is_ok(), "only the pool's size");
    }

    #[test]
    fn the_pool_holds_at_least_one_sources_share_of_connections() {
        let charge = 64 * 1024;
        let floor = 64 * (charge + 2 * CONTROL_STREAM_CHARGE_BYTES);
        assert_eq!(pool_bytes(1 << 30, 20, charge, 64), (1u64 << 30) / 5);
        assert_eq!(pool_bytes(32 << 20, 20, charge, 64), floor);
        assert_eq!(
            pool_bytes(4 << 20, 20, charge, 64),
            4 << 20,
            "at most the budget"
        );
    }

    #[test]
    fn the_pool_books_by_source_and_empties() {
        let a = SourceKey::new("10.0.0.1".parse().expect("ip"), 64);
        let b = SourceKey::new("10.0.0.2".parse().expect("ip"), 64);
        let mut p = StrangerPool::default();
        p.charge(Some(a), 100);
        p.charge(Some(b), 50);
        p.charge(None, 7);
        assert_eq!(p.usage(Some(a)), usage(157, 100, 1));
        assert_eq!(
            p.usage(Some(SourceKey::new("10.0.0.3".parse().expect("ip"), 64))),
            usage(157, 0, 2)
        );
        p.uncharge(Some(a), 100);
        p.uncharge(Some(b), 50);
        p.uncharge(None, 7);
        assert_eq!((p.used(), p.sources()), (0, 0));
    }

    proptest! {
        /// Sources charging in any order never exceed the pool; a source
        /// charging alone, however it splits its charges, stops at half,
        /// and the next source still gets a third.
        #[test]
        fn the_pool_is_never_exceeded_and_a_lone_source_leaves_room(
            ops in proptest::collection::vec((0usize..6, 1u64..120), 1..400),
            alone in proptest::collection::vec(1u64..120, 1..100),
        ) {
            let mut held = [0u64; 6];
            for (src, charge) in ops {
                let used: u64 = held.iter().sum();
                let others = held.iter().enumerate().filter(|(i, h)| *i != src && **h > 0).count() as u32;
                if admit(POOL, usage(used, held[src], others), charge).is_ok() {
                    held[src] += charge;
                }
                prop_assert!(held.iter().sum::<u64>() <= POOL);
            }
            let mut lone = 0u64;
            for charge in alone {
                if admit(POOL, usage(lone, lone, 0), charge).is_ok() {
                    lone += charge;
                }
            }
            prop_assert!(lone <= POOL / 2);
            prop_assert!(admit(POOL, usage(lone, 0, 1), POOL / 3).is_ok());
        }
    }
}
