//! The router counts the bytes it relays: a relayed call moves
//! `agentmesh_router_relayed_bytes_total` by at least the call's payload
//! each way (the caller is the circuit's source, the provider its
//! destination). A real control plane, a real router and two real nodes
//! on loopback; no timing.

use super::support;

use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{TestRouter, start_cp};

const TO_DESTINATION: &str = r#"agentmesh_router_relayed_bytes_total{direction="to_destination"}"#;
const TO_SOURCE: &str = r#"agentmesh_router_relayed_bytes_total{direction="to_source"}"#;
/// The echoed payload, bytes.
const PAYLOAD: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_call_moves_the_relayed_bytes_by_its_payload_each_way() {
    let cp = start_cp().await;
    let r = TestRouter::start(&cp, &[("name", "r")], |_| {}).await;
    // Both directions exist at 0 before any circuit.
    let text = r.handle.metrics_text();
    for series in [TO_DESTINATION, TO_SOURCE] {
        assert!(text.contains(&format!("{series} 0")), "{series}: {text}");
    }
    let token = cp.token(Role::Member).await;
    let ((p, _pd), (c, _cd)) = support::echo_pair(&cp, &token, |c| c, |c| c).await;
    let mut s = support::call_until_found(&c, "echo").await;
    let before = (r.metric(TO_DESTINATION), r.metric(TO_SOURCE));
    support::round_trip(&mut s, PAYLOAD).await;
    drop(s);
    // The echo came back through the router, so the router wrote the
    // payload to the provider and read it back before the caller got it.
    let sent = r.metric(TO_DESTINATION) - before.0;
    let back = r.metric(TO_SOURCE) - before.1;
    assert!(sent >= PAYLOAD as f64, "to the destination: {sent}");
    assert!(back >= PAYLOAD as f64, "to the source: {back}");
    c.shutdown().await;
    p.shutdown().await;
    r.handle.shutdown().await;
}
