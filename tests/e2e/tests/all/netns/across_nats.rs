//! Calls between members on public hosts and behind NATs of both kinds, in
//! every combination: each member calls every other, through its router
//! and (members on the other router) a transit connection to the
//! provider's router; all relayed.

use agentmesh_netns::{NatKind, Placement};
use rand::RngCore as _;

use super::support::*;

/// Member kinds: where its host is.
const KINDS: [(&str, Option<NatKind>); 3] = [
    ("pub", None),
    ("eim", Some(NatKind::EndpointIndependent)),
    ("sym", Some(NatKind::EndpointDependent)),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_call_each_other_across_public_hosts_and_both_kinds_of_nat() {
    let Some(mut net) = Net::start("across_nats", &[]).await else {
        return;
    };
    net.add_router("r1").await;
    net.add_router("r2").await;
    // Two members of each kind, each behind a NAT of its own: `-0` on r1,
    // `-1` on r2.
    let names: Vec<String> = KINDS
        .iter()
        .flat_map(|(k, _)| [format!("{k}-0"), format!("{k}-1")])
        .collect();
    let mut members = Vec::new();
    for (kind, nat) in KINDS {
        for i in 0..2 {
            let name = format!("{kind}-{i}");
            let (host, gw) = net.member_host(&name, nat).await;
            match &gw {
                None => assert_eq!(host.placement(), &Placement::Public),
                Some(gw) => {
                    assert_eq!(host.public_addr(), gw.public_addr());
                    assert_ne!(host.addr(), host.public_addr());
                }
            }
            let spec = MemberSpec {
                routers: 1,
                router: Some(format!("r{}", i + 1)),
                expose: Some(format!("echo-{name}")),
                forwards: names
                    .iter()
                    .filter(|n| **n != name)
                    .map(|n| format!("echo-{n}"))
                    .collect(),
                args: Vec::new(),
            };
            members.push(net.member(&name, host, &spec).await);
        }
    }
    all_ready(&mut members).await;

    let mut payload = vec![0u8; 64 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    let mut calls = 0;
    for caller in &members {
        for provider in names.iter().filter(|n| **n != caller.name) {
            caller
                .call_until_echoed(&format!("echo-{provider}"), &payload)
                .await;
            calls += 1;
        }
    }
    assert_eq!(calls, 30, "every ordered pair of six members");
    for m in &members {
        let text = m.metrics().await;
        let ok = agentmesh_testkit::metric(
            &text,
            r#"agentmesh_node_calls_total{direction="outbound",result="ok"}"#,
        );
        assert!(ok >= 5.0, "{}: {ok} calls out", m.name);
        let inbound = agentmesh_testkit::metric(
            &text,
            r#"agentmesh_node_calls_total{direction="inbound",result="accepted"}"#,
        );
        assert!(inbound >= 5.0, "{}: {inbound} calls in", m.name);
    }
    // Relayed: each of the 15 pairs of members had a circuit through a router.
    let circuits = net.circuits_accepted().await;
    assert!(circuits >= 15.0, "{circuits} circuits");
}
