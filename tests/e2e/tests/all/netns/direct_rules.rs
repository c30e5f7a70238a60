//! The rules a direct connection keeps after it is up (`docs/direct.md`,
//! "Security rules"): two members behind endpoint-independent NATs go
//! direct, then the control plane changes what they may do, and the
//! direct connection itself closes, not only the calls on it.
//!
//! - A policy that grants neither member a service of the other: each
//!   side judges its authenticated direct connection again on the new
//!   policy and closes it, counted in
//!   `agentmesh_node_direct_closed_total{reason="policy"}` (only an
//!   authenticated connection is judged so: the count also shows the hello
//!   verified on both sides).
//! - The caller revoked: the provider closes the direct connection on the
//!   new revocation list, `reason="revoked"`.
//!
//! Either way `agentmesh_node_direct_connections` goes back to 0 and
//! `status` names no direct peer on either side.

use libp2p::PeerId;
use rand::RngCore as _;

use super::support::*;

/// Every member may provide anything, nobody may call anything.
const NO_GRANTS: &str = r#"format = 1
[groups]
members = { role = "member" }
[[owners]]
services = ["*"]
groups = ["members"]
"#;

const OPEN: &str = r#"agentmesh_node_direct_connections{nat="endpoint_independent"}"#;

fn closed(reason: &str) -> String {
    format!(r#"agentmesh_node_direct_closed_total{{reason="{reason}"}}"#)
}

/// Neither member closed a direct connection for any of `reasons`.
async fn none_closed_for(members: [&Member; 2], reasons: &[&str]) {
    for m in members {
        for reason in reasons {
            assert_eq!(m.metric(&closed(reason)).await, 0.0, "{}: {reason}", m.name);
        }
    }
}

/// Two members behind EIM NATs on two routers, the caller forwarding to
/// the provider's `echo-prov`, with a direct connection between them.
async fn direct_pair(net: &mut Net) -> (Member, Member) {
    let EimPair {
        provider, caller, ..
    } = net.eim_pair(&[], &[]).await;
    let mut payload = vec![0u8; 4 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    call_until_direct(&caller, "echo-prov", &payload).await;
    for m in [&caller, &provider] {
        eventually(
            &format!("{}: one direct connection open", m.name),
            || async { (m.metric(OPEN).await == 1.0).then_some(()) },
        )
        .await;
    }
    (caller, provider)
}

/// Waits until `m` holds no direct connection (gauge and status).
async fn no_direct_left(m: &Member) {
    eventually(
        &format!("{}: no direct connection left", m.name),
        || async {
            let peers = m.status().await?.direct?.direct_peers;
            (m.metric(OPEN).await == 0.0 && peers.is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_no_longer_grants_either_side_closes_their_direct_connection() {
    let Some(mut net) = Net::start("direct_policy", &[]).await else {
        return;
    };
    let (caller, provider) = direct_pair(&mut net).await;
    for m in [&caller, &provider] {
        assert_eq!(m.metric(&closed("policy")).await, 0.0, "{}", m.name);
        assert_eq!(
            m.metric(&closed("unauthenticated")).await,
            0.0,
            "{}",
            m.name
        );
    }
    net.apply_policy(NO_GRANTS).await;
    no_direct_left(&caller).await;
    no_direct_left(&provider).await;
    // Closed for the policy by at least one side (each judges; the other
    // may see it closed first), and by nothing else of ours.
    let by_policy =
        caller.metric(&closed("policy")).await + provider.metric(&closed("policy")).await;
    assert!(
        (1.0..=2.0).contains(&by_policy),
        "closed for the policy: {by_policy}"
    );
    none_closed_for([&caller, &provider], &["unauthenticated", "revoked"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_caller_closes_its_direct_connection() {
    let Some(mut net) = Net::start("direct_revoke", &[]).await else {
        return;
    };
    let (caller, provider) = direct_pair(&mut net).await;
    let status = caller.status().await.expect("caller status");
    let caller_id: PeerId = status.peer_id.parse().expect("peer id");
    net.revoke_node(caller_id).await;
    no_direct_left(&provider).await;
    no_direct_left(&caller).await;
    // The provider closed it for the revocation; the caller's peer is not
    // revoked, so the caller never closes it for that.
    assert_eq!(provider.metric(&closed("revoked")).await, 1.0);
    assert_eq!(caller.metric(&closed("revoked")).await, 0.0);
    none_closed_for([&caller, &provider], &["unauthenticated", "policy"]).await;
}
