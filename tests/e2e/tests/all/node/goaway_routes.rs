//! Calls route around a provider's leaving router: a real control plane,
//! real routers started with `spawn` and real nodes on loopback. Waits are
//! on conditions with a generous deadline; the assertions are on routes
//! and on calls surviving the leaving router's close.

use super::support;

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use support::*;

/// The drained router's grace: the provider keeps it this long (it cannot
/// reach K elsewhere), so calls have time to start while it is leaving.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Calls opened while the provider's router is leaving.
const CALLS: usize = 4;

fn labels(k: &str) -> BTreeMap<String, String> {
    [(k.to_string(), "1".to_string())].into()
}

/// A provider on routers a and x (K=2) whose router a drains while its only
/// other candidate refuses it keeps a until a closes (make before break),
/// but stops naming a in its record at once. A caller on another router (c)
/// that reached the provider through a transit circuit via a before the
/// drain then routes its new calls via x, on a new connection (not the one
/// through a, which is left to close with a), and those calls outlive a.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_while_the_providers_router_is_leaving_avoid_it_and_outlive_it() {
    let cp = start_cp().await;
    let a = Router::start(&cp, &[("name", "a"), ("p", "1")], |c| {
        c.listen = vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")];
        c.drain.grace = DRAIN_GRACE;
    })
    .await;
    let c = Router::start(&cp, &[("name", "c"), ("c", "1")], |_| {}).await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut base| {
        base.routers.count = 2;
        base.routers.selector = labels("p");
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    let (caller, _cdir) = spawn_node(&cp, &member, "spawn caller", |mut base| {
        base.routers.selector = labels("c");
        // The circuit through a stays open (no idle close) for the test.
        base.connections.relayed_idle = Duration::from_secs(3600);
        base
    })
    .await;
    ready(&provider, "provider").await;
    ready(&caller, "caller").await;

    // While the provider is on a alone, the caller's only way is a transit
    // circuit through a.
    let mut s = call_until_found(&caller, "echo").await;
    assert_eq!(s.route().via_router, a.id(), "{:?}", s.route());
    round_trip(&mut s, 64).await;
    drop(s);

    // Then x comes (the provider holds a and x) and b, which refuses every
    // new member.
    let x = Router::start(&cp, &[("name", "x"), ("p", "1")], |_| {}).await;
    let mut st = provider.status();
    let mut both = vec![a.id(), x.id()];
    both.sort();
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.reserved == both))
        .await
        .unwrap_or_else(|_| panic!("provider not on a + x: {:?}", provider.status().borrow()))
        .expect("status");
    let b = Router::start(&cp, &[("name", "b"), ("p", "1")], |c| {
        c.watermarks.high = Some(0);
    })
    .await;
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.candidates == 3))
        .await
        .unwrap_or_else(|_| panic!("b not a candidate: {:?}", provider.status().borrow()))
        .expect("status");

    let published = |m: &str| metric(m, r#"agentmesh_node_publishes_total{result="ok"}"#);
    let (_, m) = http_get(provider.metrics_addr().expect("metrics"), "/metrics").await;
    let before = published(&m);
    a.handle.drain();
    // The provider marks a leaving and publishes a record naming x only, to
    // both routers.
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (_, m) = http_get(provider.metrics_addr().expect("metrics"), "/metrics").await;
        let leaving = provider.status().borrow().leaving.clone();
        if leaving == vec![a.id()] && published(&m) >= before + 2.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no record without a: {:?}",
            provider.status().borrow()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut open = Vec::new();
    for n in 0..CALLS {
        let s = caller.call("echo").await.expect("call while a is leaving");
        assert_eq!(s.route().via_router, x.id(), "call {n}: {:?}", s.route());
        open.push(s);
    }
    let mut drained = a.handle.drained();
    tokio::time::timeout(DEADLINE, drained.wait_for(|d| *d))
        .await
        .expect("drain finished in time")
        .expect("drained watch");
    let mut st = provider.status();
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.reserved == vec![x.id()]))
        .await
        .unwrap_or_else(|_| panic!("provider still on a: {:?}", provider.status().borrow()))
        .expect("status");

    // Every call opened while a was leaving still carries bytes.
    for (n, s) in open.iter_mut().enumerate() {
        let payload = format!("call {n} after a closed").into_bytes();
        let back = tokio::time::timeout(DEADLINE, exchange(s, &payload))
            .await
            .unwrap_or_else(|_| panic!("call {n}: echo timed out"))
            .unwrap_or_else(|e| panic!("call {n} was cut when a closed: {e}"));
        assert_eq!(back, payload, "call {n}");
    }
    drop(open);

    caller.shutdown().await;
    provider.shutdown().await;
    for r in [a, c, x, b] {
        r.handle.shutdown().await;
    }
}
