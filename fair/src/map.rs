//! A bounded table of per-source state that aggregates as it fills.
//!
//! Each source is looked up at most at three prefix lengths, finest first,
//! so a lookup is O(1). A new source is keyed by how full the table is:
//! below half, at the finest length (IPv4 address, IPv6 /64 or the
//! configured prefix); below three quarters, IPv6 at /56; below full, IPv6
//! at /48 and IPv4 at /24; when full, the one overflow source. Entries are
//! never evicted to make room: a flood of new addresses cannot push out the
//! state (counts, blocks) of sources already in the table, it can only
//! crowd itself into wider and wider keys. Entries leave when their owner
//! removes them (a slot count back at 0, a window expired).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;

use crate::source::{IPV4_MAX_PREFIX_LEN, SourceKey};

/// IPv6 prefix new sources get once the table is half full.
const IPV6_MID_PREFIX_LEN: u8 = 56;
/// IPv6 prefix new sources get once the table is three quarters full.
const IPV6_WIDE_PREFIX_LEN: u8 = 48;
/// IPv4 prefix new sources get once the table is three quarters full.
const IPV4_WIDE_PREFIX_LEN: u8 = 24;

/// What a [`SourceMap`] did so far, for the programs' gauges and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapStats {
    /// Sources in the table now (the overflow source included).
    pub sources: usize,
    /// Sources created at a wider prefix than the finest, since start.
    pub aggregated_total: u64,
    /// Lookups of new sources that landed in the overflow source.
    pub overflowed_total: u64,
}

/// Per-source state `V` for at most `capacity` sources (plus the overflow
/// source).
#[derive(Debug)]
pub struct SourceMap<V> {
    entries: HashMap<SourceKey, V>,
    capacity: usize,
    /// (IPv4, IPv6) prefix lengths, finest first.
    levels: [(u8, u8); 3],
    aggregated_total: u64,
    overflowed_total: u64,
}

impl<V> SourceMap<V> {
    /// A table of at most `capacity` sources (at least 1), IPv6 sources
    /// keyed at `ipv6_prefix_len` bits while it has room.
    pub fn new(capacity: usize, ipv6_prefix_len: u8) -> Self {
        let fine = ipv6_prefix_len.max(1);
        Self {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            levels: [
                (IPV4_MAX_PREFIX_LEN, fine),
                (IPV4_MAX_PREFIX_LEN, fine.min(IPV6_MID_PREFIX_LEN)),
                (IPV4_WIDE_PREFIX_LEN, fine.min(IPV6_WIDE_PREFIX_LEN)),
            ],
            aggregated_total: 0,
            overflowed_total: 0,
        }
    }

    /// The key `ip` counts under: the finest existing entry that holds it,
    /// else the key a new entry would get now (see the module docs).
    pub fn key_of(&self, ip: IpAddr) -> SourceKey {
        for (v4, v6) in self.levels {
            let key = SourceKey::with_lengths(ip, v4, v6);
            if self.entries.contains_key(&key) {
                return key;
            }
        }
        self.new_key(ip)
    }

    fn new_key(&self, ip: IpAddr) -> SourceKey {
        let len = self.sources_excluding_overflow();
        let level = if len < self.capacity / 2 {
            0
        } else if len < self.capacity * 3 / 4 {
            1
        } else if len < self.capacity {
            2
        } else {
            return SourceKey::overflow();
        };
        let (v4, v6) = self.levels[level];
        SourceKey::with_lengths(ip, v4, v6)
    }

    fn sources_excluding_overflow(&self) -> usize {
        self.entries.len() - usize::from(self.entries.contains_key(&SourceKey::overflow()))
    }

    /// The entry of `ip`, created with `V::default()` if new.
    pub fn entry(&mut self, ip: IpAddr) -> (SourceKey, &mut V)
    where
        V: Default,
    {
        let key = self.key_of(ip);
        let finest = SourceKey::with_lengths(ip, self.levels[0].0, self.levels[0].1);
        let value = match self.entries.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                if key.is_overflow() {
                    self.overflowed_total += 1;
                } else if key != finest {
                    self.aggregated_total += 1;
                }
                e.insert(V::default())
            }
        };
        (key, value)
    }

    /// The state of `key`, if present.
    pub fn get(&self, key: &SourceKey) -> Option<&V> {
        self.entries.get(key)
    }

    /// The state of `key`, if present.
    pub fn get_mut(&mut self, key: &SourceKey) -> Option<&mut V> {
        self.entries.get_mut(key)
    }

    /// Removes `key`'s state.
    pub fn remove(&mut self, key: &SourceKey) -> Option<V> {
        let v = self.entries.remove(key);
        if self.entries.capacity() > 64 && self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        v
    }

    /// Sources in the table (the overflow source included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds no source.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sources the table holds at most (not counting the overflow source).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every source and its state.
    pub fn iter(&self) -> impl Iterator<Item = (&SourceKey, &V)> {
        self.entries.iter()
    }

    /// What the table did so far.
    pub fn stats(&self) -> MapStats {
        MapStats {
            sources: self.entries.len(),
            aggregated_total: self.aggregated_total,
            overflowed_total: self.overflowed_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn v6(n: u128) -> IpAddr {
        IpAddr::V6(Ipv6Addr::from(n))
    }

    /// The n-th /64 under 2001:db8::/32.
    fn slash64(n: u128) -> IpAddr {
        v6((0x2001_0db8u128 << 96) | (n << 64) | 1)
    }

    #[test]
    fn a_flood_of_prefixes_is_aggregated_then_overflows_and_stays_bounded() {
        let mut map: SourceMap<u32> = SourceMap::new(8, 64);
        let mut keys = Vec::new();
        for n in 0..10_000u128 {
            // Each /64 in its own /48, the worst case for aggregation.
            let (k, v) = map.entry(slash64(n << 16));
            *v += 1;
            keys.push(k);
        }
        assert!(map.len() <= 9, "bounded: {}", map.len());
        let lens: Vec<u8> = keys.iter().take(8).map(|k| k.prefix_len()).collect();
        assert_eq!(lens[..4], [64, 64, 64, 64]);
        assert!(lens[4..].iter().all(|l| *l < 64), "{lens:?}");
        assert!(keys[keys.len() - 1].is_overflow());
        let s = map.stats();
        assert!(s.aggregated_total >= 1 && s.overflowed_total == 1, "{s:?}");
    }

    #[test]
    fn sources_already_in_a_full_table_keep_their_state() {
        let mut map: SourceMap<u32> = SourceMap::new(4, 64);
        let first = slash64(0);
        *map.entry(first).1 = 7;
        for n in 1..10_000u128 {
            *map.entry(slash64(n << 16)).1 += 1;
        }
        let k = map.key_of(first);
        assert_eq!(k.prefix_len(), 64);
        assert_eq!(map.get(&k), Some(&7), "never evicted by the flood");
    }

    #[test]
    fn a_lookup_finds_the_finest_existing_entry() {
        let mut map: SourceMap<u32> = SourceMap::new(4, 64);
        map.entry(slash64(1));
        map.entry(slash64(2));
        // Half full: the next new /64 is keyed at /56.
        let (k, _) = map.entry(slash64(3));
        assert_eq!(k.prefix_len(), 56);
        // An address in the first /64 still finds its /64 entry.
        assert_eq!(map.key_of(slash64(1)).prefix_len(), 64);
        // Another /64 inside that /56 shares it.
        assert_eq!(map.key_of(slash64(4)), k);
        map.remove(&k);
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn ipv4_is_per_address_until_three_quarters_full() {
        let mut map: SourceMap<u32> = SourceMap::new(4, 64);
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        assert_eq!(map.entry(ip("10.0.0.1")).0.prefix_len(), 32);
        assert_eq!(map.entry(ip("10.0.0.2")).0.prefix_len(), 32);
        assert_eq!(map.entry(ip("10.0.0.3")).0.prefix_len(), 32);
        assert_eq!(map.entry(ip("10.0.1.4")).0.prefix_len(), 24);
        assert!(map.entry(ip("10.0.2.5")).0.is_overflow());
        // A known address keeps its own entry.
        assert_eq!(map.key_of(ip("10.0.0.2")).prefix_len(), 32);
    }
}
