//! The key per-source limits count under (unauthenticated connections,
//! handshakes in progress and failed logins per source).
//!
//! An IPv6 host usually holds a whole /64 (SLAAC, privacy addresses, or
//! simply a routed prefix), so counting per /128 let one host spread its
//! connections over as many addresses as it likes and never meet a
//! per-source limit. IPv6 sources are therefore aggregated to their first
//! `--ipv6-source-prefix-len` bits (default 64; 128 counts per address). An
//! IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack listener
//! reports for IPv4 peers) counts as its IPv4 address: masked as IPv6 it
//! would put every IPv4 peer into one source.
//!
//! [`SourceKey::new`] is the only way to make a key, so every map keyed by
//! source goes through the same aggregation.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;

/// Longest IPv6 prefix, bits (one address per source).
pub(crate) const IPV6_MAX_PREFIX_LEN: u8 = 128;

/// A source as per-source limits see it: an IPv4 address, or an IPv6
/// prefix. Made only by [`SourceKey::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SourceKey {
    /// The address, IPv6 with the bits past `prefix_len` cleared.
    ip: IpAddr,
    /// Bits of `ip` that count (32 for IPv4).
    prefix_len: u8,
}

impl SourceKey {
    /// The key of `ip` when IPv6 sources aggregate to `ipv6_prefix_len` bits
    /// (capped at 128; 0 would make all of IPv6 one source, which the flag
    /// refuses). IPv4-mapped IPv6 addresses count as their IPv4 address.
    pub(crate) fn new(ip: IpAddr, ipv6_prefix_len: u8) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self {
                ip: IpAddr::V4(v4),
                prefix_len: 32,
            },
            IpAddr::V6(v6) => {
                let len = ipv6_prefix_len.min(IPV6_MAX_PREFIX_LEN);
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
}

impl fmt::Display for SourceKey {
    /// The address (IPv4, or IPv6 per address), else `prefix/len`: what
    /// refusal logs name as the source.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V6(_) if self.prefix_len < IPV6_MAX_PREFIX_LEN => {
                write!(f, "{}/{}", self.ip, self.prefix_len)
            }
            ip => write!(f, "{ip}"),
        }
    }
}

/// The first IP address in `addr` (the source of a direct connection).
pub(crate) fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })
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
        // 128 is per address again.
        assert_ne!(key("2001:db8::1", 128), key("2001:db8::2", 128));
        assert_eq!(key("2001:db8::1", 128).to_string(), "2001:db8::1");
        // Odd lengths mask inside a group; past 128 is capped.
        assert_eq!(key("2001:db8::ff", 121), key("2001:db8::80", 121));
        assert_ne!(key("2001:db8::ff", 121), key("2001:db8::7f", 121));
        assert_eq!(key("2001:db8::1", 200), key("2001:db8::1", 128));
        assert_eq!(key("2001:db8::1", 1).to_string(), "::/1");
        assert_eq!(key("8001:db8::1", 1).to_string(), "8000::/1");
    }

    #[test]
    fn ipv4_and_ipv4_mapped_sources_count_per_ipv4_address() {
        assert_eq!(key("::ffff:10.0.0.1", 64), key("10.0.0.1", 64));
        assert_ne!(key("::ffff:10.0.0.1", 64), key("::ffff:10.0.0.2", 64));
        assert_ne!(key("10.0.0.1", 1), key("10.0.0.2", 1));
        assert_eq!(key("::ffff:10.0.0.1", 64).to_string(), "10.0.0.1");
    }

    #[test]
    fn the_ip_of_an_address_is_its_first_ip_component() {
        let a: Multiaddr = "/ip6/2001:db8::1/tcp/4001".parse().expect("addr");
        assert_eq!(ip_of(&a), Some("2001:db8::1".parse().expect("ip")));
        let a: Multiaddr = "/ip4/10.1.2.3/udp/1/quic-v1".parse().expect("addr");
        assert_eq!(ip_of(&a), Some("10.1.2.3".parse().expect("ip")));
        let a: Multiaddr = "/dns4/example.com/tcp/1".parse().expect("addr");
        assert_eq!(ip_of(&a), None);
    }
}
