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
