//! Which addresses a punch may dial. The addresses come from the peer
//! (dcutr's exchange), and a lying peer must not make us dial our own
//! host or link: a punch dials only plain TCP or QUIC (`/udp/…/quic-v1`)
//! to a unicast IP that is not loopback, unspecified or link-local.
//!
//! **Loopback, for tests and benches only.** Members on one host (the
//! bench on loopback, tests without namespaces) see each other only at
//! loopback addresses, so with the rule above they never go direct.
//! `--direct-allow-loopback-targets` lets a punch dial loopback (and
//! nothing else it refuses today); off by default, and refused without
//! `--direct=true`. A member with it on can be made to dial any port of
//! its own host by a peer that holds a relayed connection to it: never
//! set it on a host that serves anything else.

use agentmesh_streams::dial::{IpTarget, ip_target};
use libp2p::Multiaddr;

/// Whether a punch may dial `addr` (see the module doc); `loopback`
/// (`--direct-allow-loopback-targets`) lets loopback addresses through.
pub(super) fn punch_target_allowed(addr: &Multiaddr, loopback: bool) -> bool {
    let (Some(IpTarget::Tcp(sa)) | Some(IpTarget::Quic(sa))) = ip_target(addr) else {
        return false;
    };
    let ip = sa.ip();
    if ip.is_loopback() {
        return loopback;
    }
    match ip {
        std::net::IpAddr::V4(ip) => {
            !(ip.is_unspecified() || ip.is_link_local() || ip.is_multicast() || ip.is_broadcast())
        }
        std::net::IpAddr::V6(ip) => {
            !(ip.is_unspecified() || ip.is_multicast() || (ip.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(a: &str, loopback: bool) -> bool {
        punch_target_allowed(&a.parse().expect("addr"), loopback)
    }

    /// What a lying peer may send besides loopback: refused either way.
    const NEVER: [&str; 9] = [
        "/ip4/169.254.169.254/tcp/80",
        "/ip4/0.0.0.0/tcp/4500",
        "/ip4/224.0.0.1/tcp/4500",
        "/ip4/255.255.255.255/tcp/4500",
        "/ip6/fe80::1/tcp/4500",
        "/dns4/internal.example/tcp/443",
        "/ip4/10.0.0.5/udp/4500",
        "/ip4/169.254.169.254/udp/80/quic-v1",
        "/ip6/fe80::1/udp/4500/quic-v1",
    ];

    #[test]
    fn loopback_is_refused_by_default_and_allowed_only_with_the_flag() {
        for a in [
            "/ip4/127.0.0.1/tcp/22",
            "/ip4/127.9.9.9/tcp/1",
            "/ip6/::1/tcp/4500",
            "/ip4/127.0.0.1/udp/4500/quic-v1",
        ] {
            assert!(!allowed(a, false), "{a} refused by default");
            assert!(allowed(a, true), "{a} allowed with the flag");
        }
    }

    #[test]
    fn the_flag_lets_nothing_else_through_and_public_addresses_pass_either_way() {
        for loopback in [false, true] {
            for a in NEVER {
                assert!(!allowed(a, loopback), "{a} (loopback {loopback})");
            }
            for a in [
                "/ip4/10.0.0.5/tcp/4500",
                "/ip4/203.0.113.7/tcp/1",
                "/ip6/2001:db8::1/tcp/9",
                "/ip4/10.0.0.5/udp/4500/quic-v1",
            ] {
                assert!(allowed(a, loopback), "{a} (loopback {loopback})");
            }
        }
    }

    /// Through the behaviour: with the flag a punch's dial to loopback
    /// goes ahead, without it the dial is refused and counted.
    #[test]
    fn the_behaviour_refuses_a_loopback_punch_unless_told() {
        use crate::direct::{Behaviour, ReuseLog};
        use crate::metrics::{DirectMetrics, ResultLabel};
        use libp2p::swarm::{ConnectionId, NetworkBehaviour as _};
        use libp2p::{PeerId, core::Endpoint};
        let peer = PeerId::random();
        let to: Multiaddr = format!("/ip4/127.0.0.1/tcp/4500/p2p/{peer}")
            .parse()
            .expect("addr");
        for allow in [false, true] {
            let m = DirectMetrics::default();
            let mut b = Behaviour::new(PeerId::random(), true, m.clone(), ReuseLog::default())
                .with_loopback_targets(allow);
            let punch = ConnectionId::new_unchecked(1);
            b.note_punch(punch);
            let r = b.handle_pending_outbound_connection(
                punch,
                Some(peer),
                std::slice::from_ref(&to),
                Endpoint::Dialer,
            );
            assert_eq!(r.is_ok(), allow, "allow {allow}");
            let bad = m
                .upgrade_attempts
                .get_or_create(&ResultLabel {
                    result: "bad_target",
                })
                .get();
            assert_eq!(bad, u64::from(!allow));
        }
    }
}
