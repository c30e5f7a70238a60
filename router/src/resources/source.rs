//! Where a connection comes from, for the per-source limits.
//!
//! The key per-source limits count under is [`agentmesh_fair::SourceKey`]
//! (an IPv4 address or an IPv6 prefix, `--ipv6-source-prefix-len` bits),
//! the same key every program's fair shares use; this module only finds
//! the address in a multiaddr.

use std::net::IpAddr;

use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;

pub(crate) use agentmesh_fair::SourceKey;

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

    #[test]
    fn the_ip_of_an_address_is_its_first_ip_component() {
        let a: Multiaddr = "/ip6/2001:db8::1/tcp/4001".parse().expect("addr");
        assert_eq!(ip_of(&a), Some("2001:db8::1".parse().expect("ip")));
        let a: Multiaddr = "/ip4/10.1.2.3/udp/1/quic-v1".parse().expect("addr");
        assert_eq!(ip_of(&a), Some("10.1.2.3".parse().expect("ip")));
        let a: Multiaddr = "/dns4/example.com/tcp/1".parse().expect("addr");
        assert_eq!(ip_of(&a), None);
    }

    #[test]
    fn sources_are_the_fair_crates_keys() {
        // The router keys per-source state with the shared key: IPv6 per
        // prefix, IPv4-mapped as IPv4.
        let k = |s: &str, len| SourceKey::new(s.parse().expect("ip"), len);
        assert_eq!(k("2001:db8:1:2::1", 64), k("2001:db8:1:2:ffff::9", 64));
        assert_eq!(k("::ffff:10.0.0.1", 64), k("10.0.0.1", 64));
        assert_eq!(k("2001:db8:1:2::1", 64).to_string(), "2001:db8:1:2::/64");
    }
}
