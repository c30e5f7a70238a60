//! Giving back the capacity of per-peer tables once peers leave.
//!
//! A `HashMap` keeps its largest table after entries go: a router that held
//! 5,000 members keeps every per-peer and per-connection table sized for
//! 5,000 after they leave (the 10,003-member ladder's routers stayed at
//! ~3.8× their pre-ladder RSS; jemalloc's statistics showed the largest
//! live allocations after everyone left were such tables). Each table
//! calls [`ShrinkSparse::shrink_sparse`] after a removal: when it is under a
//! quarter full it is rebuilt at twice its length. The hysteresis (grow at
//! full, shrink at a quarter) keeps the rehash cost amortised O(1) per
//! removal, and small tables (≤ [`KEEP_CAPACITY`]) are never touched.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Tables this small keep their capacity (not worth a rehash).
pub(crate) const KEEP_CAPACITY: usize = 64;

/// Whether a table of `len` entries and `capacity` slots should shrink.
fn sparse(len: usize, capacity: usize) -> bool {
    capacity > KEEP_CAPACITY && len.saturating_mul(4) < capacity
}

/// Shrinks a collection whose capacity far exceeds its length.
pub(crate) trait ShrinkSparse {
    /// Rebuilds the collection at twice its length when under a quarter full.
    fn shrink_sparse(&mut self);
}

impl<K: Eq + Hash, V, S: BuildHasher> ShrinkSparse for HashMap<K, V, S> {
    fn shrink_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<K: Eq + Hash, S: BuildHasher> ShrinkSparse for HashSet<K, S> {
    fn shrink_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<T> ShrinkSparse for Vec<T> {
    fn shrink_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<T> ShrinkSparse for VecDeque<T> {
    fn shrink_sparse(&mut self) {
        if sparse(self.len(), self.capacity()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_table_gives_its_capacity_back_and_a_small_one_is_kept() {
        let mut m: HashMap<u32, [u8; 64]> = (0..10_000).map(|i| (i, [0; 64])).collect();
        let full = m.capacity();
        for i in 0..10_000 {
            m.remove(&i);
            m.shrink_sparse();
            assert!(
                m.capacity() <= KEEP_CAPACITY.max(m.len() * 8) || m.capacity() == full,
                "len {} capacity {}",
                m.len(),
                m.capacity()
            );
        }
        assert!(m.capacity() <= KEEP_CAPACITY * 2, "{}", m.capacity());
        let mut small: HashMap<u32, u32> = (0..40).map(|i| (i, i)).collect();
        let cap = small.capacity();
        small.clear();
        small.shrink_sparse();
        assert_eq!(small.capacity(), cap, "tables ≤ KEEP_CAPACITY keep theirs");
    }

    #[test]
    fn shrinking_is_amortised() {
        // Removing one by one shrinks O(log n) times, not on every removal.
        let mut v: Vec<u64> = (0..100_000).collect();
        let mut shrinks = 0;
        while v.pop().is_some() {
            let before = v.capacity();
            v.shrink_sparse();
            if v.capacity() != before {
                shrinks += 1;
            }
        }
        assert!((1..=20).contains(&shrinks), "{shrinks} shrinks");
    }
}
