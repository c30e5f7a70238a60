//! NAT gateways: what the internet sees of hosts behind them, what gets in,
//! and hairpinning between hosts behind one NAT.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use agentmesh_netns::{NatKind, Placement, testbed_or_skip};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_hosts_reach_each_other_and_have_no_route_elsewhere() {
    let Some(tb) = testbed_or_skip("public_hosts_reach_each_other").await else {
        return;
    };
    let a = tb.public_host("a").await.expect("a");
    let b = tb.public_host("b").await.expect("b");
    assert_eq!(a.placement(), &Placement::Public);
    assert_ne!(a.addr(), b.addr());
    let l = b
        .bind_tcp(SocketAddr::new(b.addr().into(), 0))
        .await
        .expect("bind");
    let to = l.local_addr().expect("addr");
    let _c = a.connect(to).await.expect("a reaches b");
    let (_s, from) = l.accept().await.expect("accept");
    assert_eq!(from.ip(), a.addr(), "no NAT between public hosts");
    // No route beyond the testbed's plan: nothing can leave its namespaces.
    // (`ip route get` asks the routing table; no packet is sent.)
    let out = a
        .command("ip")
        .args(["route", "get", "192.0.2.1"])
        .output()
        .await
        .expect("ip route get");
    assert!(!out.status.success(), "a has a route out: {out:?}");
    let routes = a
        .command("ip")
        .args(["-4", "route"])
        .output()
        .await
        .expect("routes");
    let routes = String::from_utf8_lossy(&routes.stdout).to_string();
    assert_eq!(
        routes.lines().count(),
        1,
        "only the /16 of the internet: {routes}"
    );
    assert!(routes.starts_with("10.0.0.0/16 "), "{routes}");
}

/// A host behind a NAT of `kind` sends from one socket to four public
/// hosts; returns the sources they saw. Each answers through the mapping,
/// and a stranger sends to it: at a full cone that reaches the host, from
/// the stranger's own address; at the other kinds it is dropped.
async fn sources_seen(kind: NatKind) -> Option<Vec<SocketAddr>> {
    let tb = testbed_or_skip(&format!("sources_seen_{}", kind.as_str())).await?;
    let nat = tb.nat("gw", kind).await.expect("nat");
    let inside = tb.host_behind(&nat, "inside").await.expect("host");
    assert_eq!(inside.public_addr(), nat.public_addr());
    assert!(matches!(inside.placement(), Placement::BehindNat { gateway, .. } if gateway == "gw"));
    let s = udp_on(&inside).await;
    let mut seen = Vec::new();
    for i in 0..4 {
        let p = tb.public_host(&format!("p{i}")).await.expect("public");
        let ps = udp_on(&p).await;
        let to = ps.local_addr().expect("addr");
        let src = deliver(&s, to, &ps, b"hello").await;
        assert_eq!(
            src.ip(),
            nat.public_addr(),
            "the internet sees the NAT's address"
        );
        // The answer to the mapping gets back in.
        ps.send_to(b"back", src).await.expect("answer");
        let from = recv_payload(&s, b"back", DEADLINE)
            .await
            .expect("the answer arrives");
        assert_eq!(from, to);
        // Another public host sending to the same mapping.
        let stranger = tb.public_host(&format!("s{i}")).await.expect("stranger");
        let ss = udp_on(&stranger).await;
        if kind.endpoint_independent_filtering() {
            let from = deliver(&ss, src, &s, b"unsolicited").await;
            assert_eq!(
                from,
                ss.local_addr().expect("addr"),
                "a full cone forwards it with the stranger's own source"
            );
        } else {
            ss.send_to(b"unsolicited", src).await.expect("send");
            assert_silent(&s, b"unsolicited", "an unsolicited datagram got in").await;
        }
        seen.push(src);
    }
    Some(seen)
}

fn ports(seen: &[SocketAddr]) -> BTreeSet<u16> {
    seen.iter().map(|s| s.port()).collect()
}

/// A host behind a NAT of `kind` shows one public port to every
/// destination ([`sources_seen`]).
async fn shows_one_public_port(kind: NatKind) {
    let Some(seen) = sources_seen(kind).await else {
        return;
    };
    assert_eq!(
        ports(&seen).len(),
        1,
        "{kind:?}: one mapping for every destination: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eim_nat_shows_one_public_port_to_every_destination() {
    shows_one_public_port(NatKind::EndpointIndependent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cone_nat_shows_one_public_port_to_every_destination_and_lets_anyone_reach_it() {
    shows_one_public_port(NatKind::FullCone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_preserving_edm_nat_without_a_collision_shows_one_public_port() {
    // Nothing else behind it uses the port: indistinguishable from EIM.
    shows_one_public_port(NatKind::EndpointDependentPortPreserving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symmetric_nat_maps_each_destination_to_its_own_port() {
    let Some(seen) = sources_seen(NatKind::EndpointDependent).await else {
        return;
    };
    // Random ports: four equal ones would have odds of 1 in 64,511^3.
    assert!(
        ports(&seen).len() > 1,
        "a mapping per destination: {seen:?}"
    );
}

/// The source port both hosts of [`collision`] bind.
const COLLIDING_PORT: u16 = 40_000;

/// Two hosts behind one NAT of `kind` bind the same UDP port; `first`
/// sends to four public hosts, then `second` sends to those four and a
/// fifth that `first` never used. Returns the sources the public hosts saw
/// of each.
async fn collision(kind: NatKind) -> Option<(Vec<SocketAddr>, Vec<SocketAddr>)> {
    let tb = testbed_or_skip(&format!("collision_{}", kind.as_str())).await?;
    let nat = tb.nat("gw", kind).await.expect("nat");
    let mut sockets = Vec::new();
    for name in ["first", "second"] {
        let h = tb.host_behind(&nat, name).await.expect("host");
        let at = SocketAddr::new(h.addr().into(), COLLIDING_PORT);
        sockets.push(h.bind_udp(at).await.expect("bind"));
    }
    let mut publics = Vec::new();
    for i in 0..5 {
        let p = tb.public_host(&format!("p{i}")).await.expect("public");
        publics.push(udp_on(&p).await);
    }
    let mut seen = [Vec::new(), Vec::new()];
    for (n, (s, seen)) in sockets.iter().zip(seen.iter_mut()).enumerate() {
        for p in &publics[..4 + n] {
            let src = deliver(s, p.local_addr().expect("addr"), p, b"hello").await;
            assert_eq!(src.ip(), nat.public_addr());
            // The answer reaches the right host.
            p.send_to(b"back", src).await.expect("answer");
            recv_payload(s, b"back", DEADLINE)
                .await
                .expect("the answer arrives");
            seen.push(src);
        }
    }
    let [first, second] = seen;
    assert!(
        first.iter().all(|s| s.port() == COLLIDING_PORT),
        "the first host keeps its port: {first:?}"
    );
    Some((first, second))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eim_nat_keeps_one_public_port_per_socket_when_its_port_was_taken() {
    for kind in [NatKind::EndpointIndependent, NatKind::FullCone] {
        let Some((_, second)) = collision(kind).await else {
            return;
        };
        let p = ports(&second);
        assert_eq!(
            p.len(),
            1,
            "{kind:?}: one mapping for every destination: {second:?}"
        );
        assert!(!p.contains(&COLLIDING_PORT), "{kind:?}: {second:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_preserving_edm_nat_maps_each_destination_to_its_own_port_when_its_port_was_taken() {
    let Some((_, second)) = collision(NatKind::EndpointDependentPortPreserving).await else {
        return;
    };
    // The port is held by the first host, also towards the fifth host it
    // never used: a random port per destination (five equal ones: odds of
    // 1 in 64,511^4).
    assert!(
        ports(&second).len() > 1,
        "a mapping per destination: {second:?}"
    );
    assert!(!ports(&second).contains(&COLLIDING_PORT), "{second:?}");
}

/// TCP at a NAT of `kind`: a host behind it listens on a port and connects
/// out from that same port (as a member does); a stranger on the internet
/// then connects to the public mapping, and to a public port nothing is
/// mapped to. Returns the stranger's connect to the mapping: `Ok(source
/// the host saw)`, or `Err` when it timed out. The unmapped port always
/// times out (dropped silently, never refused).
async fn tcp_inbound(kind: NatKind) -> Option<Result<SocketAddr, String>> {
    const PORT: u16 = 4500;
    let tb = testbed_or_skip(&format!("tcp_inbound_{}", kind.as_str())).await?;
    let nat = tb.nat("gw", kind).await.expect("nat");
    let inside = tb.host_behind(&nat, "inside").await.expect("host");
    let p = tb.public_host("p").await.expect("public");
    let stranger = tb.public_host("stranger").await.expect("stranger");
    let pl = p
        .bind_tcp(SocketAddr::new(p.addr().into(), 0))
        .await
        .expect("bind");
    let to = pl.local_addr().expect("addr");
    let at = SocketAddr::new(inside.addr().into(), PORT);
    let (listener, _out) = inside
        .spawn(async move {
            let reusable = || {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.set_reuseaddr(true)?;
                s.set_reuseport(true)?;
                s.bind(at)?;
                Ok::<_, std::io::Error>(s)
            };
            let l = reusable()?.listen(16)?;
            let out = reusable()?.connect(to).await?;
            Ok::<_, std::io::Error>((l, out))
        })
        .await
        .expect("task")
        .expect("listen and connect out");
    let (_accepted, mapped) = pl.accept().await.expect("accept");
    assert_eq!(mapped, SocketAddr::new(nat.public_addr().into(), PORT));
    let unmapped = SocketAddr::new(nat.public_addr().into(), PORT + 1);
    match tokio::time::timeout(SILENCE * 3, stranger.connect(unmapped)).await {
        Err(_) => {}
        Ok(r) => panic!("{kind:?}: a SYN to an unmapped port was answered: {r:?}"),
    }
    let outcome = match tokio::time::timeout(SILENCE * 3, stranger.connect(mapped)).await {
        Err(_) => Err("timed out".to_string()),
        Ok(Ok(_c)) => {
            let (_s, from) = tokio::time::timeout(DEADLINE, listener.accept())
                .await
                .expect("the host accepts in time")
                .expect("accept");
            assert_eq!(
                from.ip(),
                stranger.addr(),
                "{kind:?}: the stranger's own source"
            );
            Ok(from)
        }
        Ok(Err(e)) => panic!("{kind:?}: a SYN to the mapping was refused: {e}"),
    };
    Some(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cone_nat_forwards_a_connection_to_a_mapped_port_and_drops_the_rest() {
    let Some(r) = tcp_inbound(NatKind::FullCone).await else {
        return;
    };
    r.expect("the stranger's connection reaches the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eim_nat_drops_a_connection_to_a_mapped_port_from_a_stranger() {
    for kind in [
        NatKind::EndpointIndependent,
        NatKind::EndpointDependentPortPreserving,
    ] {
        let Some(r) = tcp_inbound(kind).await else {
            return;
        };
        assert!(r.is_err(), "{kind:?}: a stranger got in: {r:?}");
    }
}

/// Hosts `a` and `b` behind the NAT (`one_host`: two sockets on one host)
/// learn their public mappings from a public host; `b` sends to `a`'s
/// mapping and `a` answers. Where the NAT keeps one mapping per socket `a`
/// sees `b` at `b`'s mapping.
async fn hairpin(kind: NatKind, one_host: bool) {
    let name = format!(
        "hairpin_{}{}",
        kind.as_str(),
        if one_host { "_one_host" } else { "" }
    );
    let Some(tb) = testbed_or_skip(&name).await else {
        return;
    };
    let nat = tb.nat("gw", kind).await.expect("nat");
    let a = tb.host_behind(&nat, "a").await.expect("a");
    let b = if one_host {
        a.clone()
    } else {
        tb.host_behind(&nat, "b").await.expect("b")
    };
    let p = tb.public_host("p").await.expect("p");
    let (sa, sb, sp) = (udp_on(&a).await, udp_on(&b).await, udp_on(&p).await);
    let to_p = sp.local_addr().expect("addr");
    let mapped = deliver(&sa, to_p, &sp, b"who am i").await;
    assert_eq!(mapped.ip(), nat.public_addr());
    let b_mapped = deliver(&sb, to_p, &sp, b"and who am i").await;
    let from_b = deliver(&sb, mapped, &sa, b"via the public side").await;
    assert_eq!(
        from_b.ip(),
        nat.public_addr(),
        "a sees b from the NAT's public side"
    );
    if kind.endpoint_independent_mapping() {
        assert_eq!(from_b, b_mapped, "a sees b at b's own mapping");
    }
    sa.send_to(b"and back", from_b).await.expect("answer");
    let from = recv_payload(&sb, b"and back", DEADLINE)
        .await
        .expect("the answer arrives");
    assert_eq!(from, mapped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_behind_one_eim_nat_reach_each_other_at_their_public_mapping() {
    hairpin(NatKind::EndpointIndependent, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_behind_one_symmetric_nat_reach_each_other_at_their_public_mapping() {
    hairpin(NatKind::EndpointDependent, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_behind_one_full_cone_or_port_preserving_nat_reach_each_other_at_their_public_mapping()
 {
    hairpin(NatKind::FullCone, false).await;
    hairpin(NatKind::EndpointDependentPortPreserving, false).await;
}

/// Two programs on one host behind a hairpinning NAT (the ladder runs a
/// thousand members in one): each reaches the other at its public
/// mapping, and is seen at its own. The packet leaves the gateway by the
/// bridge port it came in on, which the bridge refuses unless that port
/// hairpins: before the testbed set it, every such punch timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sockets_on_one_host_reach_each_other_at_their_public_mappings() {
    hairpin(NatKind::EndpointIndependent, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_hairpinning_the_public_mapping_is_not_reachable_from_the_lan() {
    let Some(tb) = testbed_or_skip("without_hairpinning").await else {
        return;
    };
    let nat = tb
        .nat_with("gw", NatKind::EndpointIndependent, false)
        .await
        .expect("nat");
    let a = tb.host_behind(&nat, "a").await.expect("a");
    let b = tb.host_behind(&nat, "b").await.expect("b");
    let p = tb.public_host("p").await.expect("p");
    let (sa, sb, sp) = (udp_on(&a).await, udp_on(&b).await, udp_on(&p).await);
    let mapped = deliver(&sa, sp.local_addr().expect("addr"), &sp, b"who am i").await;
    sb.send_to(b"via the public side", mapped)
        .await
        .expect("send");
    assert_silent(
        &sa,
        b"via the public side",
        "hairpinned without hairpinning",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_moves_on_its_lan_gets_another_public_port_from_the_same_socket() {
    let Some(tb) = testbed_or_skip("host_moves").await else {
        return;
    };
    let nat = tb
        .nat("gw", NatKind::EndpointIndependent)
        .await
        .expect("nat");
    let inside = tb.host_behind(&nat, "inside").await.expect("host");
    let p = tb.public_host("p").await.expect("public");
    let ps = udp_on(&p).await;
    let to = ps.local_addr().expect("addr");
    // One socket bound to every address of the host, as a member's.
    let s = inside
        .bind_udp("0.0.0.0:0".parse().expect("addr"))
        .await
        .expect("bind");
    let first = deliver(&s, to, &ps, b"before").await;
    let old = inside.addr();
    let new = nat.move_host(&inside).await.expect("move");
    assert_ne!(old, new);
    assert_eq!(inside.addr(), new);
    let second = deliver(&s, to, &ps, b"after").await;
    assert_eq!(second.ip(), nat.public_addr());
    assert_ne!(
        second.port(),
        first.port(),
        "the old mapping still holds its port: the new flow gets another"
    );
    // Moving a host to a NAT it is not behind is refused.
    let other = tb
        .nat("gw2", NatKind::EndpointIndependent)
        .await
        .expect("nat");
    assert!(other.move_host(&inside).await.is_err());
}
