//! The refused-stream budget and connections the router dialed, against
//! the real router binary: a real peer of the directory (enrolled with a
//! router token, its listen address on 127.0.0.69 leased), which the router
//! dials, opens catalog streams on that connection before it authenticates
//! back. They are refused (it is not admitted yet), far more than the
//! budget, and yet the connection stays open, nothing is counted as a
//! stranger's close or failed login, and the peer's auth as a router on the
//! same connection then succeeds. Before the fix the router closed its own
//! connection after the budget and charged the peer's address a failed
//! login (`docs/security.md`, known gaps of session 12).
//!
//! The rule it checks: a connection we dialed is a peer we chose, not a
//! stranger reaching in; strangers connecting to us keep their budget
//! (`hostile_refused`).

use super::hostile_kit::start_router_with_refused_budget;
use super::support;

use std::net::{IpAddr, Ipv4Addr};

use agentmesh_hostile::dialed_router::{self, Case};
use agentmesh_proto::pb::credential::Role;
use support::cp::start_cp;
use support::{DEADLINE, metric};

/// Where the dialed peer listens.
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 69);
/// The router's budget of refused streams per stranger connection.
const BUDGET: u64 = 8;
/// Streams the peer opens: far past the budget.
const STREAMS: usize = 4 * BUDGET as usize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_we_dialed_is_not_closed_for_streams_refused_before_it_authenticates() {
    let cp = start_cp().await;
    let (r, _rdir) = start_router_with_refused_budget(&cp, BUDGET).await;

    let report = dialed_router::run(Case {
        control_plane: cp.url.clone(),
        token: cp.token(Role::Router).await,
        router: r.peer,
        listen_ip: IpAddr::V4(PEER),
        streams: STREAMS,
        step_deadline: DEADLINE,
    })
    .await
    .expect("the dialed-router case");
    tracing::info!(%report, "dialed router");

    assert_eq!(report.dialed_in, 1, "the router dialed once: {report}");
    assert_eq!(
        (report.streams_opened, report.opens_failed),
        (STREAMS as u64, 0),
        "every stream negotiated, none failed for a closing connection: {report}"
    );
    assert_eq!(report.streams_answered, 0, "not admitted yet: {report}");
    assert_eq!(report.open_after_streams, 1, "still connected: {report}");
    assert_eq!(report.admitted, 1, "admitted as a router after: {report}");
    assert_eq!(report.open_at_end, 1, "on the same connection: {report}");

    let m = r.metrics_text().await;
    let refused = r#"agentmesh_router_slots_refused_total{budget="catalog",reason="not_admitted"}"#;
    assert!(
        metric(&m, refused) >= STREAMS as f64,
        "the streams were refused as a peer not admitted: {m}"
    );
    let closed = r#"agentmesh_router_connections_closed_total{reason="refused_streams"}"#;
    let logins = r#"agentmesh_router_failed_logins_total{reason="refused_streams"}"#;
    assert_eq!(metric(&m, closed), 0.0, "{m}");
    assert_eq!(metric(&m, logins), 0.0, "{m}");

    cp.handle.shutdown().await;
}
