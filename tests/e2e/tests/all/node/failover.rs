//! Holding K routers when one of them keeps refusing relay reservations: a
//! real control plane, real routers started with `spawn` (one with its relay
//! full) and a real node on loopback. Waits are on conditions with a
//! generous deadline.

use super::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use support::*;

/// A router whose relay is full (it admits members but refuses every
/// reservation) must not hold one of a node's K slots forever: once another
/// router is free, the node moves there and is back on K reserved routers.
/// While no other router exists, the node keeps the slot and retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_refusing_reservations_is_replaced_once_another_is_free() {
    let cp = start_cp().await;
    let listen = "/ip4/127.0.0.1/tcp/0";
    let full = start_router_tweaked(&cp, "full", Duration::from_secs(1), listen, |c| {
        c.relay.max_reservations = Some(0);
    })
    .await;
    let ok = start_router(&cp, "ok").await;
    let member = cp.token(Role::Member).await;
    let (n, _dir) = spawn_node(&cp, &member, "spawn", |mut base| {
        base.routers.count = 2;
        base
    })
    .await;
    ready(&n, "n").await;
    let (full_id, ok_id) = (full.handle.peer_id(), ok.handle.peer_id());
    // Only two routers exist: the node holds both, reserved on one.
    let mut st = n.status();
    tokio::time::timeout(
        DEADLINE,
        st.wait_for(|s| s.reserved == vec![ok_id] && s.admitted.contains(&full_id)),
    )
    .await
    .unwrap_or_else(|_| panic!("not on ok + full: {:?}", n.status().borrow()))
    .expect("status");

    let spare = start_router(&cp, "spare").await;
    let spare_id = spare.handle.peer_id();
    let mut st = n.status();
    tokio::time::timeout(
        DEADLINE,
        st.wait_for(|s| {
            s.ready
                && s.reserved.len() == 2
                && s.reserved.contains(&ok_id)
                && s.reserved.contains(&spare_id)
                && !s.admitted.contains(&full_id)
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "never replaced the router refusing reservations: {:?}",
            n.status().borrow()
        )
    })
    .expect("status");
    let (_, m) = http_get(n.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(&m, r#"agentmesh_node_reservations_total{result="error"}"#) >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_node_routers_replaced_total{reason="reservation_refused"}"#
        ),
        1.0,
        "{m}"
    );
    n.shutdown().await;
    for r in [full, ok, spare] {
        r.handle.shutdown().await;
    }
}
