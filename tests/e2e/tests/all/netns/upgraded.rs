//! Routers count the circuits hole punching took off them
//! (`agentmesh_router_circuits_upgraded_total`): two members behind
//! endpoint-independent NATs, both with `--direct=true` and attached to
//! both routers, go direct; the caller (the circuits' dialer) tells each
//! circuit's router once, and the routers' counters, summed, move by
//! exactly the circuits that were live when the direct connection came up
//! (every circuit of this test: the relayed connections are kept open with
//! `--relayed-idle-secs=0` and a long `--idle-connection-secs`, so the
//! routers' live-circuit gauges still show them). Nothing is refused, the
//! provider (the end the circuits reached) tells nothing, and later calls
//! on the direct connection count nothing more.

use super::support::*;

const UPGRADED: &str = "agentmesh_router_circuits_upgraded_total";
const LIVE: &str = "agentmesh_router_circuits";
const REFUSALS: &[&str] = &["malformed", "not_admitted", "no_such_circuit", "duplicate"];
const NOTICE_RESULTS: &[&str] = &["ok", "refused", "timed_out", "failed"];

fn notices(result: &str) -> String {
    format!(r#"agentmesh_node_upgrade_notices_total{{result="{result}"}}"#)
}

/// The routers' values of `series`, summed.
async fn routers_sum(net: &Net, series: &str) -> f64 {
    let mut sum = 0.0;
    for i in 0..net.routers.len() {
        sum += net.router_metric(i, series).await;
    }
    sum
}

/// A member's notices, every result summed.
async fn notices_sent(m: &Member) -> f64 {
    let mut sum = 0.0;
    for r in NOTICE_RESULTS {
        sum += m.metric(&notices(r)).await;
    }
    sum
}

/// Relayed connections kept open for the test.
const KEEP_CIRCUITS: &[&str] = &["--relayed-idle-secs=0", "--idle-connection-secs=3600"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_count_each_circuit_upgraded_away_once() {
    let Some(mut net) = Net::start("upgraded", &[]).await else {
        return;
    };
    let EimPair {
        provider, caller, ..
    } = net.eim_pair(KEEP_CIRCUITS, KEEP_CIRCUITS).await;
    assert_eq!(nat_kind(&provider).await, "endpoint_independent");
    assert_eq!(nat_kind(&caller).await, "endpoint_independent");
    assert_eq!(routers_sum(&net, UPGRADED).await, 0.0, "pre-created at 0");

    call_until_direct(&caller, "echo-prov", b"upgrade me").await;
    // The notice leaves when the direct connection's hello verifies, beside
    // the calls: wait for its answer.
    eventually("the caller's notice answered", || {
        let caller = &caller;
        async move { (caller.metric(&notices("ok")).await >= 1.0).then_some(()) }
    })
    .await;
    let upgraded = routers_sum(&net, UPGRADED).await;
    let live = routers_sum(&net, LIVE).await;
    assert!(upgraded >= 1.0, "a circuit was counted");
    assert_eq!(
        upgraded, live,
        "every live circuit (all the caller's to the provider) counted once"
    );
    assert!(
        routers_sum(
            &net,
            r#"agentmesh_router_circuit_requests_total{result="accepted"}"#
        )
        .await
            >= upgraded
    );
    assert_eq!(
        caller.metric(&notices("ok")).await,
        upgraded,
        "one notice per circuit, each counted"
    );
    assert_eq!(
        notices_sent(&caller).await,
        upgraded,
        "none refused or lost"
    );
    assert_eq!(
        notices_sent(&provider).await,
        0.0,
        "the end the circuits reached tells nothing"
    );
    for reason in REFUSALS {
        let series =
            format!(r#"agentmesh_router_upgrade_notices_refused_total{{reason="{reason}"}}"#);
        assert_eq!(routers_sum(&net, &series).await, 0.0, "{series}");
    }

    // Later calls take the direct connection and count nothing more.
    caller.call_until_echoed("echo-prov", b"again").await;
    assert_eq!(routers_sum(&net, UPGRADED).await, upgraded);
    assert_eq!(notices_sent(&caller).await, upgraded);
}
