//! A failover storm: 100 members in one process (one source IP), K=2 on
//! three real routers; the router holding a share of them is killed, and
//! both survivors admit at most 8 not-yet-admitted connections per IP
//! (`--unauthenticated-connections-per-ip 8`), refusing the rest before the
//! handshake. Members whose connection is refused back off (jittered,
//! exponential, time-budgeted) and retry rather than shunning the router
//! for 10 s: every member ends on K=2 reserved routers again. Waits are
//! count-based with a generous deadline; nothing is timed.

use super::support;

use std::collections::HashSet;
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{TestRouter, start_cp_with};
use libp2p::PeerId;
use support::{on_k, storm_member};
use tokio::time::Instant;

const MEMBERS: usize = 100;
const PER_IP: u32 = 8;
/// Generous: 100 nodes on a loaded 2-core machine, twice (join, failover).
const STORM_DEADLINE: Duration = Duration::from_secs(240);

/// Members not (yet) reserved on two routers outside `gone`.
fn not_on_k(nodes: &[(NodeHandle, tempfile::TempDir)], gone: &HashSet<PeerId>) -> usize {
    nodes.iter().filter(|(n, _)| !on_k(n, gone)).count()
}

async fn wait_all_on_k(
    nodes: &[(NodeHandle, tempfile::TempDir)],
    gone: &HashSet<PeerId>,
    what: &str,
) {
    let end = Instant::now() + STORM_DEADLINE;
    loop {
        let left = not_on_k(nodes, gone);
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: {left} of {} members not back on K=2",
            nodes.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_members_from_one_ip_reattach_after_a_router_is_killed() {
    let cp = start_cp_with(|c| {
        c.enroll_rate_per_sec = 1000;
        c.enroll_burst = 1000;
    })
    .await;
    let limited = |c: &mut agentmesh_router::Config| {
        c.resources.unauthenticated_connections_per_ip = PER_IP;
    };
    let victim = TestRouter::start(&cp, &[("name", "victim")], |_| {}).await;
    let s1 = TestRouter::start(&cp, &[("name", "s1")], limited).await;
    let s2 = TestRouter::start(&cp, &[("name", "s2")], limited).await;
    let mut nodes = Vec::with_capacity(MEMBERS);
    for _ in 0..MEMBERS / 50 {
        let token = cp.token(Role::Member).await;
        let batch =
            futures::future::join_all((0..50).map(|_| storm_member(&cp, token.clone()))).await;
        nodes.extend(batch);
    }
    wait_all_on_k(&nodes, &HashSet::new(), "joining").await;
    let victim_id = victim.id();
    let on_victim = nodes
        .iter()
        .filter(|(n, _)| n.status().borrow().reserved.contains(&victim_id))
        .count();
    assert!(
        on_victim > 0,
        "no member on the victim: nothing to fail over"
    );
    // The per-source limit bites by refusing a newcomer or by shedding
    // an older handshake of its source for it.
    let bitten = |r: &TestRouter| r.refused("connection", "source", "none") + r.handshakes_shed();
    let refused_at_join: f64 = [&s1, &s2].iter().map(|r| bitten(r)).sum();

    // Kill: the router stops without go-away; its members must re-attach
    // to the survivors, all at once, from one IP.
    let killed = Instant::now();
    victim.handle.shutdown().await;
    let gone: HashSet<PeerId> = [victim_id].into();
    wait_all_on_k(&nodes, &gone, "after the kill").await;
    // Printed for the record, never asserted.
    let back = killed.elapsed();

    let refused: f64 = [&s1, &s2].iter().map(|r| bitten(r)).sum();
    eprintln!(
        "members on the victim: {on_victim}; survivors refused or shed (connection/source) {refused_at_join} at join, {} after the kill; all back on K after {back:?}",
        refused - refused_at_join
    );
    // The per-IP limit did bite (100 members from one IP against a limit
    // of 8), so the members above came back through refusals.
    assert!(
        refused > 0.0,
        "the per-IP limit never refused a connection nor shed a handshake"
    );
    futures::future::join_all(nodes.into_iter().map(|(n, _d)| async move {
        n.shutdown().await;
    }))
    .await;
    s1.handle.shutdown().await;
    s2.handle.shutdown().await;
}
