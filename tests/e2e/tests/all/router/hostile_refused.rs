//! A stranger reopening refused streams against the real router binary:
//! connections from 127.0.0.68 that never authenticate and open catalog
//! streams (refused to a peer not admitted) in a loop, as fast as loopback
//! allows, while real members from 127.0.0.9 enroll, attach and call.
//!
//! Asserted: every connection of the attack is closed by the router after
//! its budget of refused streams (the one past it, which closes the
//! connection, may reach the harness as a failed open; a few more may be in
//! flight while the close lands), never by the harness's own bound; each close is counted
//! (`connections_closed_total{reason="refused_streams"}`) and is a failed
//! login of the source; the members are ready and call each other, and
//! are not closed. Before the fix the first connection took all
//! [`STREAMS_PER_CONNECTION`] refused streams and stayed open.

use super::hostile_kit::{
    MEMBER_BOUND, echo_within_bound, ready_within_bound, start_member,
    start_router_with_refused_budget,
};
use super::support;

use std::net::{IpAddr, Ipv4Addr};

use agentmesh_hostile::router_refused::{self, Attack};
use support::cp::start_cp;
use support::{eventually, metric};

/// Where the attack comes from.
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 68);
/// The router's budget of refused streams per stranger connection.
const BUDGET: u64 = 16;
/// Connections of the attack, one after another: fewer than the failed
/// logins that block a source (30 a minute), so every one connects.
const CONNECTIONS: usize = 4;
/// Refused streams each connection would open if nothing stopped it: far
/// past the budget.
const STREAMS_PER_CONNECTION: usize = 2_000;
/// Streams that may still be negotiated on a connection after the one
/// that closes it, while the close reaches the swarm: a bound, not a
/// timing measurement (the harness opens one stream at a time).
const IN_FLIGHT_SLACK: u64 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_reopening_refused_streams_is_closed_and_members_still_call() {
    let cp = start_cp().await;
    let (r, _rdir) = start_router_with_refused_budget(&cp, BUDGET).await;

    let attack = tokio::spawn(router_refused::run(Attack {
        router: r.addr(),
        source_ip: IpAddr::V4(ATTACKER),
        connections: CONNECTIONS,
        streams_per_connection: STREAMS_PER_CONNECTION,
        duration: 2 * MEMBER_BOUND,
    }));

    let backend = agentmesh_testkit::echo_backend().await;
    let (pdir, cdir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let provider = start_member(&cp, pdir.path(), vec![("echo".into(), backend)]).await;
    let caller = start_member(&cp, cdir.path(), vec![]).await;
    ready_within_bound(&provider, "the provider").await;
    ready_within_bound(&caller, "the caller").await;
    echo_within_bound(&caller).await;

    let report = attack.await.expect("attack task").expect("attack");
    tracing::info!(%report, "refused-streams attack");
    assert_eq!(
        report.connections, CONNECTIONS as u64,
        "every connection of the attack connected: {report}"
    );
    assert_eq!(
        report.connections_closed, report.connections,
        "the router closed every one: {report}"
    );
    assert!(
        report.most_on_one_connection >= BUDGET
            && report.most_on_one_connection <= BUDGET + 1 + IN_FLIGHT_SLACK,
        "closed just past the budget of {BUDGET}: {report}"
    );
    assert_eq!(
        report.streams_answered, 0,
        "a stranger gets no catalog answer"
    );

    let closed = r#"agentmesh_router_connections_closed_total{reason="refused_streams"}"#;
    let logins = r#"agentmesh_router_failed_logins_total{reason="refused_streams"}"#;
    let m = eventually("the closes counted", || async {
        let m = r.metrics_text().await;
        (metric(&m, closed) >= CONNECTIONS as f64).then_some(m)
    })
    .await;
    assert_eq!(metric(&m, closed), CONNECTIONS as f64, "{m}");
    assert_eq!(metric(&m, logins), CONNECTIONS as f64, "{m}");
    let refused = r#"agentmesh_router_slots_refused_total{budget="catalog",reason="not_admitted"}"#;
    assert!(
        metric(&m, refused) >= (CONNECTIONS as u64 * (BUDGET + 1)) as f64,
        "the streams were refused as a stranger's: {m}"
    );
    // The members were not closed: both still attached and calling. The
    // gauge is refreshed by the router's periodic tick, so it is read until
    // it shows them (or the deadline fails the test).
    let members = r#"agentmesh_router_connections{state="admitted",direction="inbound"}"#;
    eventually("both members still connected", || async {
        let m = r.metrics_text().await;
        (metric(&m, members) >= 2.0).then_some(())
    })
    .await;
    echo_within_bound(&caller).await;

    caller.shutdown().await;
    provider.shutdown().await;
    cp.handle.shutdown().await;
}
