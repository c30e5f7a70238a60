//! A mesh started fresh, as `agentmesh-one` starts one: a control plane and
//! two routers leasing at the default interval, then at once a provider
//! attached to one router only and a caller attached to the other only
//! (K = 1, router selectors). The first call after both members are ready
//! finds the provider: the routers mesh as soon as one of them learns of the
//! other, not one lease interval later.

use super::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use support::*;

/// The routers' lease (and directory) interval: the default, as in
/// `agentmesh-one`.
const LEASE_INTERVAL: Duration =
    Duration::from_secs(agentmesh_router::config::DEFAULT_LEASE_INTERVAL_SECS);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_from_the_other_fresh_router_finds_the_provider() {
    let cp = start_cp().await;
    let r1 = start_router_with(&cp, "r1", LEASE_INTERVAL).await;
    let r2 = start_router_with(&cp, "r2", LEASE_INTERVAL).await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;

    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut base| {
        base.routers.selector = selector("r1");
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    let (caller, _cdir) = spawn_node(&cp, &member, "spawn caller", |mut base| {
        base.routers.selector = selector("r2");
        base
    })
    .await;
    ready(&provider, "provider").await;
    ready(&caller, "caller").await;
    assert_eq!(provider.status().borrow().reserved, vec![r1.id()]);
    assert_eq!(caller.status().borrow().reserved, vec![r2.id()]);

    let mut s = caller
        .call("echo")
        .await
        .expect("the first call after both are ready finds the provider");
    assert_eq!(s.route().provider, provider.peer_id());
    round_trip(&mut s, 1 << 10).await;
}
