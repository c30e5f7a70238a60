//! NAT gateways as nftables rules, in the gateway's own namespace.
//!
//! - [`NatKind::EndpointIndependent`]: plain `masquerade`. Linux keeps the
//!   source port when it is free, so one internal socket shows the same
//!   public port to every destination (endpoint-independent mapping, RFC
//!   4787), as home routers do.
//! - [`NatKind::EndpointDependent`]: `masquerade random,fully-random`: every
//!   flow gets a random public port (endpoint-dependent, "symmetric" NAT),
//!   as carrier-grade and some enterprise NATs do.
//!
//! Both filter alike: from the internet only packets of flows started from
//! the LAN get in (connection tracking), new ones are dropped silently.
//!
//! Hairpinning (a LAN host reaching another LAN host at its public mapping):
//! every flow leaving on the WAN records its mapping (protocol, public port
//! read from conntrack after the NAT chose it) → (internal address, port)
//! in a dynamic map; a LAN packet to the gateway's WAN address is
//! DNAT-ed through that map and SNAT-ed to the WAN address, so the peer
//! sees it from the sender's public side and answers through the gateway.

use std::net::Ipv4Addr;

/// The nftables table the gateway's rules live in.
pub const TABLE: &str = "amt_nat";

/// How long an idle mapping is remembered for hairpinning, seconds.
pub const HAIRPIN_MAPPING_TIMEOUT_SECS: u32 = 300;

/// Mappings remembered for hairpinning at most, entries.
pub const HAIRPIN_MAP_SIZE: u32 = 65_536;

/// How a NAT gateway maps internal addresses to its public one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    /// Endpoint-independent mapping: `masquerade` (port-preserving).
    EndpointIndependent,
    /// Endpoint-dependent mapping ("symmetric"): `masquerade random,fully-random`.
    EndpointDependent,
}

impl NatKind {
    /// A short name for host names and reports: `eim`, `symmetric`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndpointIndependent => "eim",
            Self::EndpointDependent => "symmetric",
        }
    }

    fn masquerade(self) -> &'static str {
        match self {
            Self::EndpointIndependent => "masquerade",
            Self::EndpointDependent => "masquerade random,fully-random",
        }
    }
}

impl std::str::FromStr for NatKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eim" => Ok(Self::EndpointIndependent),
            "symmetric" | "edm" => Ok(Self::EndpointDependent),
            other => Err(format!("unknown NAT kind {other:?} (eim or symmetric)")),
        }
    }
}

/// The gateway's ruleset: `wan` and `lan` its interfaces, `wan_addr` its
/// public address; `hairpin` adds the hairpinning map and rules.
pub fn ruleset(kind: NatKind, wan: &str, lan: &str, wan_addr: Ipv4Addr, hairpin: bool) -> String {
    let mut r = vec![format!("table ip {TABLE} {{")];
    if hairpin {
        r.extend([
            "    map hairpin {".to_string(),
            "        type inet_proto . inet_service : ipv4_addr . inet_service".to_string(),
            "        flags dynamic,timeout".to_string(),
            format!("        timeout {HAIRPIN_MAPPING_TIMEOUT_SECS}s"),
            format!("        size {HAIRPIN_MAP_SIZE}"),
            "    }".to_string(),
        ]);
    }
    r.push("    chain prerouting {".to_string());
    r.push("        type nat hook prerouting priority dstnat; policy accept;".to_string());
    if hairpin {
        r.push(format!(
            "        iifname \"{lan}\" ip daddr {wan_addr} meta l4proto {{ tcp, udp }} \
             dnat ip to meta l4proto . th dport map @hairpin"
        ));
    }
    r.push("    }".to_string());
    r.push("    chain postrouting {".to_string());
    r.push("        type nat hook postrouting priority srcnat; policy accept;".to_string());
    if hairpin {
        r.push(format!(
            "        oifname \"{lan}\" ct status dnat snat ip to {wan_addr}"
        ));
    }
    r.push(format!("        oifname \"{wan}\" {}", kind.masquerade()));
    r.push("    }".to_string());
    if hairpin {
        // After the NAT chose the public port (priority srcnat) the packet
        // already carries the public source; conntrack holds both sides:
        // the reply tuple's destination is the mapping, the original
        // tuple's source the internal socket.
        r.extend([
            "    chain learn {".to_string(),
            "        type filter hook postrouting priority srcnat + 10; policy accept;".to_string(),
            format!(
                "        oifname \"{wan}\" meta l4proto {{ tcp, udp }} \
                 update @hairpin {{ meta l4proto . ct reply proto-dst : ct original ip saddr . ct original proto-src }}"
            ),
            "    }".to_string(),
        ]);
    }
    for (chain, hook) in [("input", "input"), ("forward", "forward")] {
        r.extend([
            format!("    chain {chain} {{"),
            format!("        type filter hook {hook} priority filter; policy accept;"),
            format!("        iifname \"{wan}\" ct state established,related accept"),
            format!("        iifname \"{wan}\" drop"),
            "    }".to_string(),
        ]);
    }
    r.push("}".to_string());
    let mut text = r.join("\n");
    text.push('\n');
    text
}

/// The chain [`cut_rules`] fills: forward hook, ahead of the NAT's own
/// filter (which accepts established flows first).
const CUT_CHAIN: &str = "cut";

/// Rules dropping everything forwarded to or from `peer`, silently.
pub fn cut_rules(peer: Ipv4Addr) -> String {
    format!(
        "add chain ip {TABLE} {CUT_CHAIN} {{ type filter hook forward priority filter - 10; policy accept; }}\n\
         add rule ip {TABLE} {CUT_CHAIN} ip daddr {peer} drop\n\
         add rule ip {TABLE} {CUT_CHAIN} ip saddr {peer} drop\n"
    )
}

/// Rules undoing every [`cut_rules`].
pub fn heal_rules() -> String {
    format!(
        "add chain ip {TABLE} {CUT_CHAIN} {{ type filter hook forward priority filter - 10; policy accept; }}\n\
         flush chain ip {TABLE} {CUT_CHAIN}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_differ_only_in_their_port_choice() {
        let a = ruleset(
            NatKind::EndpointIndependent,
            "w",
            "l",
            Ipv4Addr::new(10, 0, 0, 9),
            true,
        );
        let b = ruleset(
            NatKind::EndpointDependent,
            "w",
            "l",
            Ipv4Addr::new(10, 0, 0, 9),
            true,
        );
        assert!(a.contains("oifname \"w\" masquerade\n"), "{a}");
        assert!(
            b.contains("oifname \"w\" masquerade random,fully-random\n"),
            "{b}"
        );
        assert_eq!(
            a.replace("masquerade\n", "masquerade random,fully-random\n"),
            b
        );
    }

    #[test]
    fn hairpinning_is_a_map_learned_on_the_wan_and_used_from_the_lan() {
        let r = ruleset(
            NatKind::EndpointIndependent,
            "w",
            "l",
            Ipv4Addr::new(10, 0, 0, 9),
            true,
        );
        assert!(r.contains("iifname \"l\" ip daddr 10.0.0.9"), "{r}");
        assert!(r.contains("update @hairpin"), "{r}");
        assert!(
            r.contains("oifname \"l\" ct status dnat snat ip to 10.0.0.9"),
            "{r}"
        );
        let plain = ruleset(
            NatKind::EndpointIndependent,
            "w",
            "l",
            Ipv4Addr::new(10, 0, 0, 9),
            false,
        );
        assert!(!plain.contains("hairpin"), "{plain}");
        // Unsolicited inbound is dropped either way.
        assert!(plain.contains("iifname \"w\" drop"), "{plain}");
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for k in [NatKind::EndpointIndependent, NatKind::EndpointDependent] {
            assert_eq!(k.as_str().parse::<NatKind>(), Ok(k));
        }
        assert!("full-cone".parse::<NatKind>().is_err());
    }
}
