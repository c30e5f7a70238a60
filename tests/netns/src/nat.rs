//! NAT gateways as nftables rules, in the gateway's own namespace. Four
//! kinds, named by how they map (RFC 4787) and filter:
//!
//! | kind | mapping | filtering | port choice |
//! |---|---|---|---|
//! | [`NatKind::EndpointIndependent`] (`eim`) | endpoint-independent | address-and-port-dependent | its own port unless another internal socket holds it, else a random one; then that port for every destination (learned map `ports`) |
//! | [`NatKind::FullCone`] (`full-cone`) | endpoint-independent | endpoint-independent: new inbound to a mapped public port is DNAT-ed to its owner | as `eim` |
//! | [`NatKind::EndpointDependentPortPreserving`] (`edm-pp`) | endpoint-dependent | address-and-port-dependent | its own port unless another internal socket holds it, then a random port per flow (`masquerade random,fully-random`), else `masquerade` |
//! | [`NatKind::EndpointDependent`] (`symmetric`) | endpoint-dependent | address-and-port-dependent | a random port per flow (`masquerade random,fully-random`) |
//!
//! - **`masquerade` alone** keeps the source port when the 5-tuple is
//!   free; when it is not (two hosts behind the NAT, one source port, one
//!   destination) this kernel picks another port derived from the source,
//!   the same for every destination (measured: four destinations, one
//!   port). That is neither kind for sure, so every kind says what
//!   happens on a collision itself.
//! - **Who holds a public port.** Every flow leaving on the WAN records
//!   public (protocol, port) → internal (address, port) in the dynamic map
//!   `mappings` and the pair in the set `owners`. A flow whose source port
//!   is held by another internal socket is not given that port (`masquerade
//!   random,fully-random`), so a public port has one owner, as RFC 4787
//!   asks of an endpoint-independent mapping (plain `masquerade` would
//!   give it to a second host for the destinations the first does not
//!   use). Symmetric NATs keep no such record.
//! - **`eim`** also records internal (protocol, address, port) → public
//!   (address, port) in the dynamic map `ports`; a later flow from the
//!   same socket is SNAT-ed to that mapping before anything else is asked,
//!   so one socket shows one public port to every destination, also when
//!   its first mapping was not its own port.
//! - **`edm-pp`** keeps no `ports`: it keeps the source port as long as no
//!   other internal socket holds that public port; once one does, each of
//!   its flows gets a random port, one per destination. Without a
//!   collision it is indistinguishable from `eim`; the difference shows
//!   when two hosts behind it use one source port.
//! - **`symmetric`** gets a random port for every flow.
//!
//! **Filtering.** From the internet only packets of flows started from the
//! LAN get in (connection tracking: a packet must match a flow's reply
//! tuple, address and port), except at a full cone: every flow leaving on
//! the WAN records public (protocol, port) → internal (address, port) in
//! the dynamic map `mappings`, and a new packet from the internet to a
//! mapped public port is DNAT-ed to the host owning the mapping, whoever
//! sends it, with its own source. Anything else from the internet (an
//! unmapped port, any unsolicited packet at the other kinds) is dropped
//! silently, never answered with a reset: a reset would kill a
//! simultaneous open.
//!
//! **Hairpinning** (a LAN host reaching another LAN host at its public
//! mapping): a LAN packet to the gateway's WAN address is marked, DNAT-ed
//! through `mappings` and SNAT-ed to the sender's own public mapping (its
//! `ports` entry at the EIM kinds, else the WAN address with whatever port
//! is free), so the peer sees it from the sender's public side and answers
//! through the gateway.

use std::net::Ipv4Addr;

/// The nftables table the gateway's rules live in.
pub const TABLE: &str = "amt_nat";

/// How long an idle mapping is remembered (`mappings`, `owners`, `ports`), seconds.
pub const MAPPING_TIMEOUT_SECS: u32 = 300;

/// Mappings remembered at most, entries per map.
pub const MAPPING_MAP_SIZE: u32 = 65_536;

/// The packet mark of a hairpinned flow's first packet (prerouting to
/// postrouting: `iifname` is unknown at postrouting).
pub const HAIRPIN_MARK: u32 = 0x4861;

/// How a NAT gateway maps internal addresses to its public one and what it
/// lets in; see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    /// Endpoint-independent mapping (port-preserving), address-and-port-
    /// dependent filtering: the common home router (`eim`).
    EndpointIndependent,
    /// Endpoint-independent mapping and filtering: unsolicited inbound to
    /// a mapped public port reaches its owner (`full-cone`).
    FullCone,
    /// Endpoint-dependent mapping that keeps the source port while no
    /// other internal socket holds it (`edm-pp`).
    EndpointDependentPortPreserving,
    /// Endpoint-dependent random mapping ("symmetric"):
    /// `masquerade random,fully-random`.
    EndpointDependent,
}

impl NatKind {
    /// Every kind.
    pub const ALL: [NatKind; 4] = [
        Self::EndpointIndependent,
        Self::FullCone,
        Self::EndpointDependentPortPreserving,
        Self::EndpointDependent,
    ];

    /// A short name for host names and reports: `eim`, `full-cone`,
    /// `edm-pp`, `symmetric`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndpointIndependent => "eim",
            Self::FullCone => "full-cone",
            Self::EndpointDependentPortPreserving => "edm-pp",
            Self::EndpointDependent => "symmetric",
        }
    }

    /// Whether one internal socket shows one public port to every
    /// destination, whatever else is behind the NAT.
    pub fn endpoint_independent_mapping(self) -> bool {
        matches!(self, Self::EndpointIndependent | Self::FullCone)
    }

    /// Whether anyone on the internet reaches a mapped public port.
    pub fn endpoint_independent_filtering(self) -> bool {
        self == Self::FullCone
    }
}

impl std::str::FromStr for NatKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "eim" => Ok(Self::EndpointIndependent),
            "full-cone" => Ok(Self::FullCone),
            "edm-pp" => Ok(Self::EndpointDependentPortPreserving),
            "symmetric" | "edm" => Ok(Self::EndpointDependent),
            other => Err(format!(
                "unknown NAT kind {other:?} (eim, full-cone, edm-pp or symmetric)"
            )),
        }
    }
}

/// A dynamic set (`value` empty) or map of learned mappings.
fn learned(name: &str, key: &str, value: &str) -> [String; 6] {
    let (what, ty) = if value.is_empty() {
        ("set", key.to_string())
    } else {
        ("map", format!("{key} : {value}"))
    };
    [
        format!("    {what} {name} {{"),
        format!("        type {ty}"),
        "        flags dynamic,timeout".to_string(),
        format!("        timeout {MAPPING_TIMEOUT_SECS}s"),
        format!("        size {MAPPING_MAP_SIZE}"),
        "    }".to_string(),
    ]
}

/// The gateway's ruleset: `wan` and `lan` its interfaces, `wan_addr` its
/// public address; `hairpin` adds the hairpinning rules.
pub fn ruleset(kind: NatKind, wan: &str, lan: &str, wan_addr: Ipv4Addr, hairpin: bool) -> String {
    // Who holds each public port: every kind but symmetric gives a port
    // one owner.
    let owned = kind != NatKind::EndpointDependent;
    let cone = kind.endpoint_independent_filtering();
    // Public (protocol, port) → owner: hairpinning, the full cone's
    // inbound, and which ports are held.
    let mappings = hairpin || owned;
    // Owner → public (address, port): the endpoint-independent mapping.
    let ports = kind.endpoint_independent_mapping();
    let l4 = "meta l4proto { tcp, udp }";
    let mut r = vec![format!("table ip {TABLE} {{")];
    if mappings {
        r.extend(learned(
            "mappings",
            "inet_proto . inet_service",
            "ipv4_addr . inet_service",
        ));
    }
    if owned {
        // (protocol, public port, owner): who holds each public port.
        r.extend(learned(
            "owners",
            "inet_proto . inet_service . ipv4_addr . inet_service",
            "",
        ));
    }
    if ports {
        r.extend(learned(
            "ports",
            "inet_proto . ipv4_addr . inet_service",
            "ipv4_addr . inet_service",
        ));
    }
    let dnat = format!("ip daddr {wan_addr} {l4}");
    let via_mappings = "dnat ip to meta l4proto . th dport map @mappings";
    r.push("    chain prerouting {".to_string());
    r.push("        type nat hook prerouting priority dstnat; policy accept;".to_string());
    if hairpin {
        r.push(format!(
            "        iifname \"{lan}\" {dnat} meta mark set {HAIRPIN_MARK:#x} {via_mappings}"
        ));
    }
    if cone {
        // Only a flow's first packet passes the nat hooks: replies of
        // flows from the LAN never reach this rule.
        r.push(format!("        iifname \"{wan}\" {dnat} {via_mappings}"));
    }
    r.push("    }".to_string());
    r.push("    chain postrouting {".to_string());
    r.push("        type nat hook postrouting priority srcnat; policy accept;".to_string());
    let keep = "snat ip to meta l4proto . ip saddr . th sport map @ports";
    if hairpin {
        let hairpinned = format!("oifname \"{lan}\" meta mark {HAIRPIN_MARK:#x} ct status dnat");
        if ports {
            r.push(format!("        {hairpinned} {l4} {keep}"));
        }
        r.push(format!("        {hairpinned} snat ip to {wan_addr}"));
    }
    if ports {
        // A socket already mapped keeps its mapping; a miss falls through.
        r.push(format!("        oifname \"{wan}\" {l4} {keep}"));
    }
    if owned {
        // Its port is held by another internal socket: not that one.
        r.push(format!(
            "        oifname \"{wan}\" {l4} meta l4proto . th sport @mappings \
             meta l4proto . th sport . ip saddr . th sport != @owners masquerade random,fully-random"
        ));
    }
    let masquerade = if kind == NatKind::EndpointDependent {
        "masquerade random,fully-random"
    } else {
        "masquerade"
    };
    r.push(format!("        oifname \"{wan}\" {masquerade}"));
    r.push("    }".to_string());
    if mappings || ports {
        // After the NAT chose the public port (priority srcnat) conntrack
        // holds both sides of a flow started from the LAN: the reply
        // tuple's destination is the mapping, the original tuple's source
        // the internal socket.
        let from_lan = format!("oifname \"{wan}\" ct direction original ct status snat {l4}");
        let public = "meta l4proto . ct reply proto-dst";
        let owner = "ct original ip saddr . ct original proto-src";
        r.extend([
            "    chain learn {".to_string(),
            "        type filter hook postrouting priority srcnat + 10; policy accept;".to_string(),
        ]);
        if mappings {
            r.push(format!(
                "        {from_lan} update @mappings {{ {public} : {owner} }}"
            ));
        }
        if owned {
            r.push(format!(
                "        {from_lan} update @owners {{ {public} . {owner} }}"
            ));
        }
        if ports {
            r.push(format!(
                "        {from_lan} update @ports {{ meta l4proto . {owner} : ct reply ip daddr . ct reply proto-dst }}"
            ));
        }
        r.push("    }".to_string());
    }
    for (chain, hook) in [("input", "input"), ("forward", "forward")] {
        r.extend([
            format!("    chain {chain} {{"),
            format!("        type filter hook {hook} priority filter; policy accept;"),
            format!("        iifname \"{wan}\" ct state established,related accept"),
        ]);
        if chain == "forward" && cone {
            r.push(format!("        iifname \"{wan}\" ct status dnat accept"));
        }
        r.extend([
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

    const WAN: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);

    fn rules(kind: NatKind, hairpin: bool) -> String {
        ruleset(kind, "w", "l", WAN, hairpin)
    }

    const KEEP_MAPPING: &str = "oifname \"w\" meta l4proto { tcp, udp } snat ip to meta l4proto . ip saddr . th sport map @ports\n";
    const LEARN_MAPPING: &str = "update @ports { meta l4proto . ct original ip saddr . ct original proto-src : ct reply ip daddr . ct reply proto-dst }";
    const PORT_HELD: &str = "oifname \"w\" meta l4proto { tcp, udp } meta l4proto . th sport @mappings meta l4proto . th sport . ip saddr . th sport != @owners masquerade random,fully-random\n";

    #[test]
    fn each_kind_says_what_a_taken_port_gets() {
        for kind in NatKind::ALL {
            for hairpin in [false, true] {
                let r = rules(kind, hairpin);
                let eim = kind.endpoint_independent_mapping();
                // Every kind but symmetric gives a public port one owner.
                let owned = kind != NatKind::EndpointDependent;
                assert_eq!(r.contains(KEEP_MAPPING), eim, "{kind:?}: {r}");
                assert_eq!(r.contains(LEARN_MAPPING), eim, "{kind:?}: {r}");
                assert_eq!(r.contains(PORT_HELD), owned, "{kind:?}: {r}");
                assert_eq!(r.contains("update @owners"), owned, "{kind:?}: {r}");
                // What the kind decides comes before the last rule, which
                // maps what is left.
                let last = if kind == NatKind::EndpointDependent {
                    "oifname \"w\" masquerade random,fully-random\n    }"
                } else {
                    "oifname \"w\" masquerade\n    }"
                };
                let at = r.find(last).unwrap_or_else(|| panic!("{kind:?}: {r}"));
                for rule in [KEEP_MAPPING, PORT_HELD] {
                    assert!(r.find(rule).is_none_or(|k| k < at), "{r}");
                }
                assert_eq!(
                    r.matches("masquerade").count(),
                    1 + usize::from(owned),
                    "{r}"
                );
            }
        }
        // A full cone maps as an EIM NAT does.
        let keeps = |k| {
            rules(k, true)
                .lines()
                .filter(|l| l.contains("@ports"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keeps(NatKind::EndpointIndependent),
            keeps(NatKind::FullCone)
        );
    }

    #[test]
    fn only_a_full_cone_lets_unsolicited_inbound_in_and_only_to_mapped_ports() {
        let dnat = "iifname \"w\" ip daddr 10.0.0.9 meta l4proto { tcp, udp } dnat ip to meta l4proto . th dport map @mappings";
        let accept = "iifname \"w\" ct status dnat accept";
        for kind in NatKind::ALL {
            for hairpin in [false, true] {
                let r = rules(kind, hairpin);
                let cone = kind == NatKind::FullCone;
                assert_eq!(r.contains(dnat), cone, "{kind:?}: {r}");
                assert_eq!(r.contains(accept), cone, "{kind:?}: {r}");
                // The rest from the internet is dropped silently, in both
                // chains, after what is let in.
                assert_eq!(r.matches("iifname \"w\" drop\n").count(), 2, "{r}");
                assert!(!r.contains("reject"), "{r}");
                if cone {
                    assert!(r.find(accept) < r.rfind("iifname \"w\" drop"), "{r}");
                }
                // Mappings are learned only from flows started on the LAN.
                for line in r.lines().filter(|l| l.contains("update @")) {
                    assert!(
                        line.contains("oifname \"w\" ct direction original ct status snat"),
                        "{line}"
                    );
                }
            }
        }
    }

    #[test]
    fn hairpinning_is_a_map_learned_on_the_wan_and_used_from_the_lan() {
        for kind in NatKind::ALL {
            let r = rules(kind, true);
            assert!(
                r.contains("iifname \"l\" ip daddr 10.0.0.9 meta l4proto { tcp, udp } meta mark set 0x4861 dnat ip to meta l4proto . th dport map @mappings"),
                "{r}"
            );
            assert!(r.contains("update @mappings"), "{r}");
            // Only hairpinned flows (marked on the LAN side) are SNAT-ed
            // on the way back into the LAN: a full cone's inbound flows
            // keep their source. The sender shows its own mapping where
            // the kind keeps one.
            let back = "oifname \"l\" meta mark 0x4861 ct status dnat";
            assert!(r.contains(&format!("{back} snat ip to 10.0.0.9\n")), "{r}");
            assert_eq!(
                r.contains(&format!(
                    "{back} meta l4proto {{ tcp, udp }} snat ip to meta l4proto . ip saddr . th sport map @ports\n"
                )),
                kind.endpoint_independent_mapping(),
                "{r}"
            );
            let plain = rules(kind, false);
            assert!(!plain.contains("\"l\""), "{plain}");
            assert!(!plain.contains("mark"), "{plain}");
        }
        assert!(!rules(NatKind::EndpointDependent, false).contains("chain learn"));
    }

    #[test]
    fn kinds_parse_from_their_names() {
        for k in NatKind::ALL {
            assert_eq!(k.as_str().parse::<NatKind>(), Ok(k));
            // Host names are made of them.
            assert!(
                k.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{k:?}"
            );
        }
        assert_eq!("edm".parse::<NatKind>(), Ok(NatKind::EndpointDependent));
        assert!("cone".parse::<NatKind>().is_err());
    }
}
