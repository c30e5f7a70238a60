//! Routers announced by DNS name (`/dns4/<service>/tcp/4001`, as the
//! Kubernetes production overlay does) are reached through the mesh: a
//! router resolves the names it dials. Real routers on loopback, the name is
//! `localhost`.
//!
//! Each test makes the DNS address the only way in: the router announced by
//! name (R1) cannot reach the other router (R2 announces a port nobody
//! listens on), so R1 admitting R2 proves that R2 dialled R1 by name.

use crate::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{Purpose, auth_response};
use agentmesh_router::{Config, RouterHandle};
use libp2p::Multiaddr;
use support::cp::{Cp, start_cp};
use support::{TestPeer, eventually, metric};

/// A port that was free a moment ago (bound, read, released). Used where
/// the address must be known before the router starts (its external
/// address) and for an address nobody listens on.
fn free_port(udp: bool) -> u16 {
    if udp {
        agentmesh_testkit::free_udp_port()
    } else {
        agentmesh_testkit::free_tcp_port()
    }
}

async fn start_router(
    cp: &Cp,
    dir: &tempfile::TempDir,
    listen: Vec<Multiaddr>,
    external: Vec<Multiaddr>,
) -> RouterHandle {
    let config = Config {
        key_path: dir.path().join("router.key"),
        listen,
        external_addr: external,
        control_plane: agentmesh_router::config::ControlPlaneConfig {
            url: cp.url.clone(),
            token: cp.token(Role::Router).await,
            lease_interval: Duration::from_secs(1),
            clock_skew: Duration::ZERO,
            retry_budget: Duration::from_secs(10),
            ..Default::default()
        },
        ..Default::default()
    };
    support::spawn_ready(config).await
}

fn addr(s: &str) -> Multiaddr {
    s.parse().expect("multiaddr")
}

/// R1 announces only `r1_external` (a `/dns4/localhost/...` address);
/// R2 announces an address nobody listens on. Waits until each admitted
/// the other as a router and returns both.
async fn mesh_through_name(
    cp: &Cp,
    r1_listen: Vec<Multiaddr>,
    r1_external: Multiaddr,
) -> (RouterHandle, RouterHandle, [tempfile::TempDir; 2]) {
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let r1 = start_router(cp, &dirs[0], r1_listen, vec![r1_external]).await;
    let dead = format!("/ip4/127.0.0.1/tcp/{}", free_port(false));
    let r2 = start_router(
        cp,
        &dirs[1],
        vec![addr("/ip4/127.0.0.1/tcp/0")],
        vec![addr(&dead)],
    )
    .await;
    let admitted = "agentmesh_router_admitted_routers";
    eventually(
        "the routers admit each other through the DNS name",
        || async {
            (metric(&r1.metrics_text(), admitted) == 1.0
                && metric(&r2.metrics_text(), admitted) == 1.0)
                .then_some(())
        },
    )
    .await;
    // R1 could not have dialled R2: the connection is R2's, by name.
    let r2_outbound = "agentmesh_router_connections{state=\"admitted\",direction=\"outbound\"}";
    assert!(
        metric(&r2.metrics_text(), r2_outbound) >= 1.0,
        "R2 dialled R1"
    );
    (r1, r2, dirs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_announced_as_dns4_over_tcp_is_reached_through_the_mesh_and_by_members() {
    let cp = start_cp().await;
    let port = free_port(false);
    let by_name = addr(&format!("/dns4/localhost/tcp/{port}"));
    let (r1, r2, _dirs) = mesh_through_name(
        &cp,
        vec![addr(&format!("/ip4/127.0.0.1/tcp/{port}"))],
        by_name.clone(),
    )
    .await;
    assert_eq!(r1.external_addrs(), vec![by_name.clone()]);

    // A member dials the announced name too and is admitted.
    let mut member = TestPeer::new();
    member.connect(r1.peer_id(), by_name).await;
    let cred = cp.member_credential(&member.key).await;
    let resp = member.auth(r1.peer_id(), Some(cred), Purpose::Attach).await;
    assert!(
        matches!(resp.result, Some(auth_response::Result::Admitted(_))),
        "{resp:?}"
    );
    r1.shutdown().await;
    r2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_announced_as_dns4_over_quic_is_reached_through_the_mesh() {
    let cp = start_cp().await;
    let port = free_port(true);
    let (r1, r2, _dirs) = mesh_through_name(
        &cp,
        vec![
            addr("/ip4/127.0.0.1/tcp/0"),
            addr(&format!("/ip4/127.0.0.1/udp/{port}/quic-v1")),
        ],
        addr(&format!("/dns4/localhost/udp/{port}/quic-v1")),
    )
    .await;
    r1.shutdown().await;
    r2.shutdown().await;
}
