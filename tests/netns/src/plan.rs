//! The testbed's address plan: 10.0.0.0/16 is the internet (public hosts
//! and NAT gateways' WAN sides), 10.K.0.0/16 the LAN of NAT number K
//! (gateway 10.K.0.1). These addresses exist only inside the testbed's
//! namespaces, which have no route to anywhere else: the machine's own
//! network never sees them, and two testbeds (each its own set of
//! namespaces) can use the same plan at once.

use std::net::Ipv4Addr;

/// Prefix length of every subnet of the plan, bits.
pub const PREFIX_LEN: u8 = 16;
/// First host number of a subnet (`.1` is a LAN's gateway; unused on the internet).
const FIRST_HOST: u32 = 2;
/// Last host number of a /16 (65,535 is its broadcast address).
const LAST_HOST: u32 = 65_534;
/// NAT LANs at most (second octets 1 to 254).
pub const MAX_NATS: u32 = 254;

fn in_subnet(second: u8, n: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, second, (n >> 8) as u8, (n & 0xff) as u8)
}

/// The `i`-th public address (from 0): 10.0.0.2, 10.0.0.3, …; `None` past the /16.
pub fn public_addr(i: u32) -> Option<Ipv4Addr> {
    let n = i.checked_add(FIRST_HOST)?;
    (n <= LAST_HOST).then(|| in_subnet(0, n))
}

/// The second octet of NAT number `k` (from 0)'s LAN; `None` past [`MAX_NATS`].
pub fn lan_octet(k: u32) -> Option<u8> {
    (k < MAX_NATS).then(|| (k + 1) as u8)
}

/// The gateway address of the LAN with second octet `octet`: 10.octet.0.1.
pub fn lan_gateway(octet: u8) -> Ipv4Addr {
    in_subnet(octet, 1)
}

/// The `i`-th host address (from 0) of the LAN with second octet `octet`.
pub fn lan_addr(octet: u8, i: u32) -> Option<Ipv4Addr> {
    let n = i.checked_add(FIRST_HOST)?;
    (n <= LAST_HOST).then(|| in_subnet(octet, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_private_and_bounded() {
        assert_eq!(public_addr(0), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(public_addr(254), Some(Ipv4Addr::new(10, 0, 1, 0)));
        assert_eq!(public_addr(65_532), Some(Ipv4Addr::new(10, 0, 255, 254)));
        assert_eq!(public_addr(65_533), None);
        assert_eq!(lan_octet(0), Some(1));
        assert_eq!(lan_octet(253), Some(254));
        assert_eq!(lan_octet(254), None);
        assert_eq!(lan_gateway(3), Ipv4Addr::new(10, 3, 0, 1));
        assert_eq!(lan_addr(3, 0), Some(Ipv4Addr::new(10, 3, 0, 2)));
        for a in [public_addr(7), lan_addr(9, 7)].into_iter().flatten() {
            assert!(a.is_private(), "{a}");
        }
    }
}
