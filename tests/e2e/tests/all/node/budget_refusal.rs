//! A member whose router refuses its streams for a budget says so: a real
//! router whose per-peer catalog stream budget is 0 refuses every catalog
//! stream of a real member during negotiation (it closes the stream
//! without confirming the protocol; yamux and multistream-select carry no
//! reason), and the member's call error says the router closed the stream
//! without answering, i.e. refused it, and points at the router's refusal
//! counter, where the refusal is counted. Before, it read "i/o: unexpected
//! end of file" (and, with a non-optimistic open, "remote peer does not
//! support /agentmesh/catalog/1").

use super::support;

use agentmesh_proto::pb::credential::Role;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_stream_refused_for_a_budget_reads_as_refused() {
    let cp = start_cp().await;
    let r = Router::start(&cp, &[("name", "r1")], |c| {
        c.listen = vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")];
        c.control_plane.lease_interval = std::time::Duration::from_secs(1);
        c.resources
            .peer_stream_budgets
            .insert("catalog".to_string(), 0);
    })
    .await;
    let token = cp.token(Role::Member).await;
    let (a, _dir) = spawn_node(&cp, &token, "spawn a", |c| c).await;
    ready(&a, "a").await;

    let err = a.call("echo").await.expect_err("no lookup gets through");
    let text = err.to_string();
    assert!(
        text.contains("/agentmesh/catalog/1")
            && text.contains("refused the stream")
            && text.contains("budgets")
            && text.contains("agentmesh_router_refused_total"),
        "{text}"
    );
    let refused = r.metric(
        r#"agentmesh_router_refused_total{resource="stream",scope="peer",protocol="catalog"}"#,
    );
    assert!(refused >= 1.0, "the router counted it: {refused}");
}
