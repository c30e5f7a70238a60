//! The key per-source limits count under.
//!
//! An IPv6 host usually holds a whole /64 (SLAAC, privacy addresses, or
//! simply a routed prefix), so counting per /128 would let one host spread
//! its requests over as many addresses as it likes and never meet a share.
//! IPv6 sources are therefore aggregated to a prefix (64 bits by default). An
//! IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack listener
//! reports for IPv4 peers) counts as its IPv4 address: masked as IPv6 it
//! would put every IPv4 peer into one source.
//!
//! [`SourceKey::new`] (and [`SourceKey::with_lengths`]) are the only ways to
//! make a key, so every map keyed by source goes through the same
//! aggregation.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest IPv6 prefix, bits (one address per source).
pub const IPV6_MAX_PREFIX_LEN: u8 = 128;
/// Longest IPv4 prefix, bits (one address per source).
pub const IPV4_MAX_PREFIX_LEN: u8 = 32;

/// A source as per-source limits see it: an IPv4 address or prefix, an IPv6
/// prefix, or the one overflow source that stands for every source a full
/// [`crate::SourceMap`] could not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    /// The address with the bits past `prefix_len` cleared.
    ip: IpAddr,
    /// Bits of `ip` that count; 0 is the overflow source.
    prefix_len: u8,
}

impl SourceKey {
    /// The key of `ip` when IPv6 sources aggregate to `ipv6_prefix_len`
    /// bits (capped at 128, at least 1) and IPv4 sources count per address.
    /// IPv4-mapped IPv6 addresses count as their IPv4 address.
    pub fn new(ip: IpAddr, ipv6_prefix_len: u8) -> Self {
        Self::with_lengths(ip, IPV4_MAX_PREFIX_LEN, ipv6_prefix_len)
    }

    /// The key of `ip` with IPv4 sources aggregated to `ipv4_prefix_len`
    /// bits (1..=32) and IPv6 sources to `ipv6_prefix_len` (1..=128).
    pub fn with_lengths(ip: IpAddr, ipv4_prefix_len: u8, ipv6_prefix_len: u8) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let len = ipv4_prefix_len.clamp(1, IPV4_MAX_PREFIX_LEN);
                let mask = u32::MAX
                    .checked_shl(u32::from(IPV4_MAX_PREFIX_LEN - len))
                    .unwrap_or(0);
                Self {
                    ip: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask)),
                    prefix_len: len,
                }
            }
            IpAddr::V6(v6) => {
                let len = ipv6_prefix_len.clamp(1, IPV6_MAX_PREFIX_LEN);
                let mask = u128::MAX
                    .checked_shl(u32::from(IPV6_MAX_PREFIX_LEN - len))
                    .unwrap_or(0);
                Self {
                    ip: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)),
                    prefix_len: len,
                }
            }
        }
    }

    /// The source that stands for every source a full table could not hold.
    pub const fn overflow() -> Self {
        Self {
            ip: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            prefix_len: 0,
        }
    }

    /// Whether this is [`SourceKey::overflow`].
    pub fn is_overflow(&self) -> bool {
        self.prefix_len == 0
    }

    /// Bits of the address that count (0 for the overflow source).
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` falls inside this source.
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.is_overflow() {
            return true;
        }
        let canonical = ip.to_canonical();
        match (self.ip, canonical) {
            (IpAddr::V4(_), IpAddr::V4(_)) => {
                Self::with_lengths(canonical, self.prefix_len, IPV6_MAX_PREFIX_LEN) == *self
            }
            (IpAddr::V6(_), IpAddr::V6(_)) => {
                Self::with_lengths(canonical, IPV4_MAX_PREFIX_LEN, self.prefix_len) == *self
            }
            _ => false,
        }
    }
}

impl fmt::Display for SourceKey {
    /// The address when it stands alone, else `prefix/len`, or `other` for
    /// the overflow source: what refusal logs name as the source.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            _ if self.is_overflow() => f.write_str("other"),
            IpAddr::V6(_) if self.prefix_len < IPV6_MAX_PREFIX_LEN => {
                write!(f, "{}/{}", self.ip, self.prefix_len)
            }
            IpAddr::V4(_) if self.prefix_len < IPV4_MAX_PREFIX_LEN => {
                write!(f, "{}/{}", self.ip, self.prefix_len)
            }
            ip => write!(f, "{ip}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str, len: u8) -> SourceKey {
        SourceKey::new(ip.parse().expect("ip"), len)
    }

    #[test]
    fn ipv6_sources_aggregate_to_the_prefix() {
        assert_eq!(key("2001:db8:1:2::1", 64), key("2001:db8:1:2:ffff::9", 64));
        assert_ne!(key("2001:db8:1:2::1", 64), key("2001:db8:1:3::1", 64));
        assert_eq!(key("2001:db8:1:2::1", 48), key("2001:db8:1:3::1", 48));
        assert_eq!(
            key("2001:db8:1:2:3:4:5:6", 64).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_ne!(key("2001:db8::1", 128), key("2001:db8::2", 128));
        assert_eq!(key("2001:db8::1", 128).to_string(), "2001:db8::1");
        assert_eq!(key("2001:db8::ff", 121), key("2001:db8::80", 121));
        assert_ne!(key("2001:db8::ff", 121), key("2001:db8::7f", 121));
        assert_eq!(key("2001:db8::1", 200), key("2001:db8::1", 128));
        assert_eq!(key("2001:db8::1", 1).to_string(), "::/1");
        assert_eq!(key("8001:db8::1", 1).to_string(), "8000::/1");
        // 0 would make all of IPv6 one source (the overflow key): clamped.
        assert!(!key("2001:db8::1", 0).is_overflow());
    }

    #[test]
    fn ipv4_and_ipv4_mapped_sources_count_per_ipv4_address() {
        assert_eq!(key("::ffff:10.0.0.1", 64), key("10.0.0.1", 64));
        assert_ne!(key("::ffff:10.0.0.1", 64), key("::ffff:10.0.0.2", 64));
        assert_ne!(key("10.0.0.1", 1), key("10.0.0.2", 1));
        assert_eq!(key("::ffff:10.0.0.1", 64).to_string(), "10.0.0.1");
    }

    #[test]
    fn ipv4_prefixes_and_containment() {
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let k = SourceKey::with_lengths(ip("10.1.2.3"), 24, 64);
        assert_eq!(k.to_string(), "10.1.2.0/24");
        assert!(k.contains(ip("10.1.2.200")));
        assert!(k.contains(ip("::ffff:10.1.2.9")));
        assert!(!k.contains(ip("10.1.3.1")));
        assert!(!k.contains(ip("2001:db8::1")));
        let k6 = key("2001:db8:1:2::1", 56);
        assert!(k6.contains(ip("2001:db8:1:ff::1")));
        assert!(!k6.contains(ip("2001:db8:2::1")));
        assert!(SourceKey::overflow().contains(ip("10.0.0.1")));
        assert_eq!(SourceKey::overflow().to_string(), "other");
    }
}
