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
/// hosts; returns the sources they saw.
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
        let (got, from) = recv(&s, DEADLINE).await.expect("the answer arrives");
        assert_eq!((got.as_slice(), from), (&b"back"[..], to));
        // Another public host sending to the same mapping is filtered.
        let stranger = tb.public_host(&format!("s{i}")).await.expect("stranger");
        let ss = udp_on(&stranger).await;
        ss.send_to(b"unsolicited", src).await.expect("send");
        assert_silent(&s, b"unsolicited", "an unsolicited datagram got in").await;
        seen.push(src);
    }
    Some(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eim_nat_shows_one_public_port_to_every_destination() {
    let Some(seen) = sources_seen(NatKind::EndpointIndependent).await else {
        return;
    };
    let ports: BTreeSet<u16> = seen.iter().map(|s| s.port()).collect();
    assert_eq!(
        ports.len(),
        1,
        "one mapping for every destination: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symmetric_nat_maps_each_destination_to_its_own_port() {
    let Some(seen) = sources_seen(NatKind::EndpointDependent).await else {
        return;
    };
    // Random ports: four equal ones would have odds of 1 in 64,511^3.
    let ports: BTreeSet<u16> = seen.iter().map(|s| s.port()).collect();
    assert!(ports.len() > 1, "a mapping per destination: {seen:?}");
}

/// Host `a` behind the NAT learns its public mapping from a public host;
/// `b` behind the same NAT sends to that mapping and `a` answers.
async fn hairpin(kind: NatKind) {
    let Some(tb) = testbed_or_skip(&format!("hairpin_{}", kind.as_str())).await else {
        return;
    };
    let nat = tb.nat("gw", kind).await.expect("nat");
    let a = tb.host_behind(&nat, "a").await.expect("a");
    let b = tb.host_behind(&nat, "b").await.expect("b");
    let p = tb.public_host("p").await.expect("p");
    let (sa, sb, sp) = (udp_on(&a).await, udp_on(&b).await, udp_on(&p).await);
    let mapped = deliver(&sa, sp.local_addr().expect("addr"), &sp, b"who am i").await;
    assert_eq!(mapped.ip(), nat.public_addr());
    let from_b = deliver(&sb, mapped, &sa, b"via the public side").await;
    assert_eq!(
        from_b.ip(),
        nat.public_addr(),
        "a sees b from the NAT's public side"
    );
    sa.send_to(b"and back", from_b).await.expect("answer");
    let (got, from) = recv(&sb, DEADLINE).await.expect("the answer arrives");
    assert_eq!((got.as_slice(), from), (&b"and back"[..], mapped));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_behind_one_eim_nat_reach_each_other_at_their_public_mapping() {
    hairpin(NatKind::EndpointIndependent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_behind_one_symmetric_nat_reach_each_other_at_their_public_mapping() {
    hairpin(NatKind::EndpointDependent).await;
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
