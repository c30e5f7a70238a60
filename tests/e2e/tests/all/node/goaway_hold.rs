//! Make-before-break when the alternatives refuse: a real control plane,
//! real routers started with `spawn` (one of them refusing every new
//! member) and a real node on loopback. Waits are on conditions with a
//! generous deadline; the assertions are on what the node did and counted.

use super::support;

use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use support::*;

/// The drained router's grace: how long it serves members that cannot move.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A member on K=2 routers (a, x) whose router a drains while the only
/// other router (b, at its high watermark) answers its admission with
/// go-away: the member cannot get back to K elsewhere, so it must keep a
/// until a closes it at the end of its grace — on two reserved routers and
/// ready all along — and only then be on x alone (counted `router_closed`,
/// never `replaced`). Before, it let go of a as soon as b refused it and
/// sat on one router while a was still serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_keeps_its_draining_router_while_the_only_alternative_refuses_it() {
    let cp = start_cp().await;
    let listen = "/ip4/127.0.0.1/tcp/0";
    let lease = Duration::from_secs(1);
    let a = start_router_tweaked(&cp, "a", lease, listen, |c| c.drain.grace = DRAIN_GRACE).await;
    let x = start_router(&cp, "x").await;
    let member = cp.token(Role::Member).await;
    let (n, _dir) = spawn_node(&cp, &member, "spawn", |mut base| {
        base.routers.count = 2;
        base
    })
    .await;
    let (a_id, x_id) = (a.handle.peer_id(), x.handle.peer_id());
    let mut both = vec![a_id, x_id];
    both.sort();
    let mut st = n.status();
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.ready && s.reserved == both))
        .await
        .unwrap_or_else(|_| panic!("not on a + x: {:?}", n.status().borrow()))
        .expect("status");

    // The only alternative, started now: every new member gets go-away.
    let b = start_router_tweaked(&cp, "b", lease, listen, |c| c.watermarks.high = Some(0)).await;
    let mut st = n.status();
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.candidates == 3))
        .await
        .unwrap_or_else(|_| panic!("b never in the directory: {:?}", n.status().borrow()))
        .expect("status");

    // Every change from here until a is gone: while a is still reserved the
    // node must be on both routers; it must stay ready throughout.
    let mut watch = n.status();
    let watcher = tokio::spawn(async move {
        let (mut short_while_a, mut unready, mut saw_leaving) = (Vec::new(), Vec::new(), false);
        loop {
            {
                let s = watch.borrow_and_update();
                if s.reserved.contains(&a_id) && s.reserved.len() < 2 {
                    short_while_a.push(s.clone());
                }
                if !s.ready {
                    unready.push(s.clone());
                }
                saw_leaving |= s.leaving.contains(&a_id);
                if !s.admitted.contains(&a_id) && !s.reserved.contains(&a_id) {
                    return (short_while_a, unready, saw_leaving, s.clone());
                }
            }
            if watch.changed().await.is_err() {
                panic!("node ended");
            }
        }
    });
    a.handle.drain();
    let mut drained = a.handle.drained();
    tokio::time::timeout(DEADLINE, drained.wait_for(|d| *d))
        .await
        .expect("drain finished in time")
        .expect("drained watch");
    let (short_while_a, unready, saw_leaving, after) = tokio::time::timeout(DEADLINE, watcher)
        .await
        .unwrap_or_else(|_| panic!("still on a after it closed: {:?}", n.status().borrow()))
        .expect("watcher");

    let (_, m) = http_get(n.metrics_addr().expect("metrics"), "/metrics").await;
    let released = |reason: &str| {
        metric(
            &m,
            &format!(r#"agentmesh_node_goaway_releases_total{{reason="{reason}"}}"#),
        )
    };
    assert!(
        metric(&m, r#"agentmesh_node_auth_total{result="go_away"}"#) >= 1.0,
        "b was never tried: {m}"
    );
    assert!(saw_leaving, "a never showed as leaving");
    assert!(
        short_while_a.is_empty(),
        "fell below K while a was still serving: {short_while_a:#?}"
    );
    assert!(unready.is_empty(), "became unready: {unready:#?}");
    assert_eq!(released("replaced"), 0.0, "{m}");
    assert_eq!(
        released("router_closed"),
        1.0,
        "a was let go before it closed us: {m}"
    );
    assert_eq!(after.reserved, vec![x_id], "{after:?}");
    assert!(after.ready, "{after:?}");

    n.shutdown().await;
    for r in [a, x, b] {
        r.handle.shutdown().await;
    }
}
