//! The node's `/metrics` carries libp2p's own metrics (libp2p-metrics, one
//! registry with ours): a real control plane, a real
//! router and a real node on loopback, scraped over HTTP as Prometheus would.

use super::support;

use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::eventually;
use prometheus_client::registry::Registry;
use support::*;

/// Sum of every series of family `name` (any labels) in Prometheus text.
fn family_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A node that serves `--metrics-addr` counts its swarm's connections in
/// `libp2p_swarm_*` next to its `agentmesh_node_*` metrics; one embedded
/// with only a caller's registry (the ladder's way) gets ours and no
/// libp2p families, so thousands of them allocate none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_include_libp2p_swarm_families_once_connected() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let (n, _dir) = spawn_node(&cp, &member, "spawn", |c| c).await;
    ready(&n, "n").await;

    let (code, m) = http_get(n.metrics_addr().expect("metrics"), "/metrics").await;
    assert_eq!(code, 200, "{m}");
    // Readiness needs an admitted connection to the router: established
    // before it, so it is counted by the time the node is ready.
    assert!(
        family_sum(&m, "libp2p_swarm_connections_established_total") >= 1.0,
        "no libp2p connection counted: {m}"
    );
    assert_eq!(metric(&m, "agentmesh_node_ready"), 1.0, "{m}");
    assert_eq!(metric(&m, "agentmesh_node_routers_attached"), 1.0, "{m}");
    for limit in ["per_peer", "total"] {
        let series =
            format!("agentmesh_streams_pending_opens_refused_total{{limit=\"{limit}\"}} 0");
        assert!(m.contains(&series), "{series} missing: {m}");
    }

    // Behaviour events are recorded too: ping measures the router connection
    // as soon as it is up (waited for, bounded; not a timing assertion).
    let addr = n.metrics_addr().expect("metrics");
    eventually(
        "a ping round trip in libp2p_ping_rtt_seconds",
        || async move {
            let (_, m) = http_get(addr, "/metrics").await;
            (metric(&m, "libp2p_ping_rtt_seconds_count") >= 1.0).then_some(())
        },
    )
    .await;

    let mut registry = Registry::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let embedded = agentmesh_node::spawn(
        {
            let mut c = node_config(&cp, &member, dir.path());
            c.metrics_addr = None;
            c.local.no_socket = true;
            c
        },
        Some(&mut registry),
    )
    .await
    .expect("spawn embedded");
    ready(&embedded, "embedded").await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(text.contains("agentmesh_node_ready 1"), "{text}");
    assert!(
        !text.contains("libp2p_"),
        "libp2p families in an embedder's registry: {text}"
    );

    embedded.shutdown().await;
    n.shutdown().await;
    r.handle.shutdown().await;
}
