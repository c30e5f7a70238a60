//! Routers and members given the control plane's replicas as endpoints
//! (`--control-plane-endpoint`, the config sections' `endpoints`): the
//! logical `--control-plane` URL (the control plane's `--public-url`, which
//! proofs are bound to) answers nowhere here, and the first endpoint
//! refuses every connection; a router still enrolls, leases and becomes
//! ready, and a member enrolls, attaches to it and calls, through the
//! endpoint that answers. Without the endpoints neither could reach the
//! control plane at all.

use super::support::*;

use agentmesh_proto::pb::credential::Role;

/// A URL on a loopback port nothing listens on: connections are refused.
fn refusing_url() -> String {
    format!("http://127.0.0.1:{}", agentmesh_testkit::free_tcp_port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_and_a_member_reach_the_control_plane_past_a_refusing_endpoint() {
    let logical = refusing_url();
    let cp = start_cp_with(|c| c.public_url = Some(logical.clone())).await;
    assert_eq!(cp.url, logical, "routers and members name the logical URL");
    let endpoints = vec![refusing_url(), cp.endpoint()];
    let router = Router::start(&cp, &[("name", "r1")], |c| {
        c.control_plane.endpoints = endpoints.clone();
    })
    .await;
    let token = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &token, "spawn provider", |mut c| {
        c.control_plane.endpoints = endpoints.clone();
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    let (caller, _cdir) = spawn_node(&cp, &token, "spawn caller", |mut c| {
        c.control_plane.endpoints = endpoints.clone();
        c
    })
    .await;
    ready(&provider, "provider").await;
    ready(&caller, "caller").await;
    assert_eq!(caller.status().borrow().reserved, vec![router.id()]);
    let mut s = call_until_found(&caller, "echo").await;
    round_trip(&mut s, 1 << 10).await;
}
