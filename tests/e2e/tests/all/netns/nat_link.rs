//! A member whose NAT gateway loses its uplink loses readiness, and regains
//! it when the link returns.

use agentmesh_netns::NatKind;
use tokio::time::Instant;

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_nat_loses_its_link_loses_readiness_and_regains_it() {
    let Some(mut net) = Net::start("nat_link", &[]).await else {
        return;
    };
    net.add_router("r1").await;
    let (host, nat) = net
        .member_host("m", Some(NatKind::EndpointIndependent))
        .await;
    let nat = nat.expect("nat");
    let mut m = net
        .member(
            "m",
            host,
            &MemberSpec {
                routers: 1,
                ..Default::default()
            },
        )
        .await;
    m.wait_ready().await;
    let t0 = Instant::now();
    nat.set_wan(false).await.expect("down");
    eventually("the member not ready with its NAT's link down", || async {
        (!m.is_ready().await).then_some(())
    })
    .await;
    eprintln!("not ready after {:?}", t0.elapsed());
    nat.set_wan(true).await.expect("up");
    let t1 = Instant::now();
    eventually("the member ready again", || async {
        m.is_ready().await.then_some(())
    })
    .await;
    eprintln!("ready again after {:?}", t1.elapsed());
}

/// The router's side of the same outage: the member behind the dead link
/// sends no FIN, so only the router's own pings find it. The router closes
/// that connection (counted as `ping_failed`) and drops the member's
/// admission, instead of holding its slot and records until TCP gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_closes_the_connection_of_a_member_whose_link_died() {
    let Some(mut net) = Net::start("dead_link", &[]).await else {
        return;
    };
    let r = net
        .add_router_with(
            "r1",
            &["--ping-interval-secs", "2", "--ping-timeout-secs", "3"],
        )
        .await;
    let (host, nat) = net
        .member_host("m", Some(NatKind::EndpointIndependent))
        .await;
    let nat = nat.expect("nat");
    let mut m = net
        .member(
            "m",
            host,
            &MemberSpec {
                routers: 1,
                ..Default::default()
            },
        )
        .await;
    m.wait_ready().await;
    let attached = "agentmesh_router_attached_members";
    let dead = r#"agentmesh_router_connections_closed_total{reason="ping_failed"}"#;
    // The gauge follows readiness by up to one of the router's ticks.
    eventually("the router counts the member attached", || async {
        (net.router_metric(r, attached).await == 1.0).then_some(())
    })
    .await;
    assert_eq!(net.router_metric(r, dead).await, 0.0, "no dead link yet");

    nat.set_wan(false).await.expect("down");
    eventually("the router closes the dead member's connection", || async {
        (net.router_metric(r, dead).await >= 1.0).then_some(())
    })
    .await;
    eventually("the router drops the dead member's admission", || async {
        (net.router_metric(r, attached).await == 0.0).then_some(())
    })
    .await;

    // The link back: the member re-attaches to the same router.
    nat.set_wan(true).await.expect("up");
    eventually("the member ready again", || async {
        m.is_ready().await.then_some(())
    })
    .await;
    eventually("the member attached again", || async {
        (net.router_metric(r, attached).await == 1.0).then_some(())
    })
    .await;
}
