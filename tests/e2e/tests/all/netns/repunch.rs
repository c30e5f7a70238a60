//! Punching again when a member's observed address changes
//! (`docs/direct.md`, `node/src/direct/repunch.rs`): two members behind
//! endpoint-independent NATs go direct; the path between their NATs is
//! cut, so the caller's calls fall back to the relay and its punches to
//! the provider back off for `--punch-backoff-min-secs` (600 s here,
//! longer than the test); the cut heals; then the caller's host moves to
//! another address on its LAN (a new lease, a new network:
//! `agentmesh_netns::Nat::move_host`), so its connections from the old
//! address stop carrying bytes and its NAT gives its new flows another
//! public port. The caller's routers observe the new port, its calls keep
//! working (relayed while nothing direct is up), and it punches the
//! provider again at once despite the backoff, counted as `repunched`,
//! after which calls are direct again.

use std::time::Duration;

use rand::RngCore as _;

use super::support::*;

/// The addresses `m`'s routers observed it at, once both agree.
async fn observed_once_agreed(m: &Member) -> String {
    eventually(&format!("{}: both routers agree", m.name), || async {
        let d = m.status().await?.direct?;
        let first = d.observed.first()?.addr.clone();
        (d.observed.len() == 2 && d.observed.iter().all(|o| o.addr == first)).then_some(first)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_callers_mapping_moves_it_punches_again_and_calls_go_direct() {
    let Some(mut net) = Net::start("direct_repunch", &[]).await else {
        return;
    };
    // The dead path noticed quickly (as in `direct.rs`), and a backoff
    // after the fallback that outlasts the test.
    let EimPair {
        provider,
        caller,
        provider_nat: pgw,
        caller_nat: cgw,
    } = net
        .eim_pair(
            &[],
            &[
                &DEAD_PATH_NOTICED_FAST[..],
                &[
                    "--punch-backoff-min-secs=600",
                    "--punch-backoff-max-secs=600",
                    // The move costs the caller both routers; back on one,
                    // the second (whose observation agrees) within 1 s, not
                    // the default 30 s rejoin spread.
                    "--router-rejoin-spread-ms=1000",
                ],
            ]
            .concat(),
        )
        .await;
    let ch = caller.host.clone();
    assert_eq!(nat_kind(&caller).await, "endpoint_independent");
    let before = observed_once_agreed(&caller).await;

    let mut payload = vec![0u8; 16 * 1024];
    rand::thread_rng().fill_bytes(&mut payload);
    call_until_direct(&caller, "echo-prov", &payload).await;
    let punched = r#"agentmesh_node_upgrade_attempts_total{result="direct"}"#;
    let repunched = r#"agentmesh_node_upgrade_attempts_total{result="repunched"}"#;
    assert_eq!(caller.metric(repunched).await, 0.0);

    // The relayed connection closes for idleness first
    // (`--relayed-idle-secs`), so the fallback below makes a new one: the
    // provider, which the circuit reaches, starts dcutr's exchange on it
    // and the caller, backing off from the dead path, declines it. That
    // must not back the provider off (`no_exchange`): it would refuse the
    // caller's re-punch after the move for its whole backoff.
    let idle_closed = r#"agentmesh_node_relayed_idle_closed_total{direction="outbound"}"#;
    let closed_before = caller.metric(idle_closed).await;
    eventually("the relayed connection closed for idleness", || async {
        (caller.metric(idle_closed).await > closed_before).then_some(())
    })
    .await;

    // The direct path dies: calls fall back to the relay, and punches to
    // the provider back off.
    let fallbacks = "agentmesh_node_direct_fallbacks_total";
    cgw.cut_to(pgw.public_addr(), true).await.expect("cut");
    eventually("a call falls back to the relay", || {
        let (caller, payload) = (&caller, &payload);
        async move {
            caller.call_until_echoed("echo-prov", payload).await;
            (caller.metric(fallbacks).await >= 1.0).then_some(())
        }
    })
    .await;
    cgw.cut_to(pgw.public_addr(), false).await.expect("heal");

    let old = ch.addr();
    let new = cgw.move_host(&ch).await.expect("move the caller's host");
    assert_ne!(old, new);

    // Calls (each retried until it echoes) until the routers agree on a
    // new address of the caller and a punch to the provider came up again.
    // A punch runs once per relayed connection: one that failed (a loaded
    // machine can miss dcutr's timing) is not retried on a relayed
    // connection kept busy by these calls, so after 10 s without success
    // each round leaves it idle past `--relayed-idle-secs` (3 s) and the
    // next call makes a new one, punched again (up to 3 re-punches).
    let moved_at = std::time::Instant::now();
    let after = eventually("the caller punches again from its new mapping", || {
        let (caller, payload, before) = (&caller, &payload, &before);
        async move {
            caller.call_until_echoed("echo-prov", payload).await;
            let now = caller.status().await?.direct?;
            let first = now.observed.first()?.addr.clone();
            let agreed = now.observed.len() == 2 && now.observed.iter().all(|o| o.addr == first);
            let again =
                caller.metric(repunched).await >= 1.0 && caller.metric(punched).await >= 2.0;
            let done = agreed && first != *before && again;
            if !done && moved_at.elapsed() > Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
            done.then_some(first)
        }
    })
    .await;
    eprintln!("caller observed at {before}, then at {after} (host {old} -> {new})");

    // Later calls go direct again.
    let direct = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    let direct_before = caller.metric(direct).await;
    eventually("a call on the new direct connection", || {
        let (caller, payload) = (&caller, &payload);
        async move {
            caller.call_until_echoed("echo-prov", payload).await;
            (caller.metric(direct).await > direct_before).then_some(())
        }
    })
    .await;
    let status = caller
        .status()
        .await
        .expect("status")
        .direct
        .expect("direct");
    assert_eq!(status.direct_peers.len(), 1, "{status:?}");
    // Bounded: one re-punch for one change of address (at most one per
    // relayed connection made after it, and none once direct again).
    let n = caller.metric(repunched).await;
    assert!((1.0..=3.0).contains(&n), "{n} re-punches");
    let mut counts = Vec::new();
    for series in [
        r#"agentmesh_node_upgrade_attempts_total{result="skipped_backoff"}"#,
        r#"agentmesh_node_upgrade_attempts_total{result="failed"}"#,
        fallbacks,
    ] {
        counts.push(format!("{series}={}", caller.metric(series).await));
    }
    eprintln!("caller: repunched={n} {}", counts.join(" "));
    let no_exchange = r#"agentmesh_node_upgrade_attempts_total{result="no_exchange"}"#;
    assert!(
        provider.metric(no_exchange).await >= 1.0,
        "the provider's punch on the fallback's relayed connection was declined"
    );
    for (who, m) in [("caller", &caller), ("provider", &provider)] {
        let text = m.metrics().await;
        let upgrades: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("agentmesh_node_upgrade_attempts_total") && !l.ends_with(" 0")
            })
            .collect();
        eprintln!("{who}: {upgrades:?}");
    }
}
