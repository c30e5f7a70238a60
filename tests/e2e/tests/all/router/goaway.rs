//! Watermarks, trimming, go-away and drain with the real programs on
//! loopback: a real control plane (SQLite in a temp dir), routers and nodes
//! started with `spawn`, raw libp2p test peers. Waits are on conditions with
//! a generous deadline; nothing asserts timing.

use super::mesh;
use super::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthResponse, GoAwayReason, Purpose, auth_response};
use mesh::*;
use prometheus_client::registry::Registry;
use support::{DEADLINE, TestPeer, eventually};

fn go_away(resp: &AuthResponse) -> Option<&agentmesh_proto::pb::mesh::GoAway> {
    match &resp.result {
        Some(auth_response::Result::GoAway(g)) => Some(g),
        _ => None,
    }
}

fn admitted(resp: &AuthResponse) -> bool {
    matches!(resp.result, Some(auth_response::Result::Admitted(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_at_the_high_watermark_gets_go_away_naming_an_alternative() {
    let cp = start_cp().await;
    // low == high: trimming off, so only admission is tested here.
    let a = start_router(&cp, "a", |c| {
        c.watermarks.high = Some(2);
        c.watermarks.low = Some(2);
    })
    .await;
    let b = start_router(&cp, "b", |_| {}).await;
    let addr = a.handle.listen_addrs()[0].clone();

    let mut peers = Vec::new();
    for _ in 0..3 {
        let mut p = TestPeer::new();
        let cred = cp.member_credential(&p.key).await;
        p.connect(a.id(), addr.clone()).await;
        peers.push((p, cred));
    }
    for (p, cred) in &peers[..2] {
        let resp = p.auth(a.id(), Some(cred.clone()), Purpose::Attach).await;
        assert!(admitted(&resp), "below high: admitted, got {resp:?}");
    }

    // The third member gets go-away OVERLOADED, naming B once A's directory lists it.
    let (p3, cred3) = &peers[2];
    let g = eventually("go-away naming router b", || async {
        let resp = p3.auth(a.id(), Some(cred3.clone()), Purpose::Attach).await;
        let g = go_away(&resp)
            .unwrap_or_else(|| panic!("at high: go-away expected, got {resp:?}"))
            .clone();
        let names_b = g
            .alternatives
            .iter()
            .any(|x| x.peer_id == b.id().to_bytes());
        names_b.then_some(g)
    })
    .await;
    assert_eq!(g.reason, GoAwayReason::Overloaded as i32);
    assert!(g.retry_after_secs > 0);
    assert!(
        g.alternatives
            .iter()
            .all(|x| x.peer_id != a.id().to_bytes()),
        "a router never names itself"
    );
    let alt = g
        .alternatives
        .iter()
        .find(|x| x.peer_id == b.id().to_bytes())
        .expect("b named");
    assert!(!alt.addrs.is_empty(), "alternative carries addresses");

    // A member already admitted re-presents and stays; transit is not counted.
    let (p1, cred1) = &peers[0];
    let resp = p1.auth(a.id(), Some(cred1.clone()), Purpose::Attach).await;
    assert!(admitted(&resp), "re-presentation at high: {resp:?}");
    let resp = p3.auth(a.id(), Some(cred3.clone()), Purpose::Transit).await;
    assert!(admitted(&resp), "transit at high: {resp:?}");

    eventually("attached gauge at the high watermark", || async {
        (a.attached() == 2.0).then_some(())
    })
    .await;
    assert!(a.metric("agentmesh_router_auth_total{purpose=\"attach\",result=\"go_away\"}") >= 1.0);
    assert!(a.goaways("overloaded", "on_auth") >= 1.0);
    assert_eq!(a.trimmed("other_routers") + a.trimmed("only_router"), 0.0);
    a.handle.shutdown().await;
    b.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaching_the_high_watermark_sheds_fifteen_percent_each_after_a_go_away() {
    const MEMBERS: usize = 20;
    const LOW: usize = 17; // 15% below 20
    let cp = start_cp().await;
    let a = start_router(&cp, "a", |c| {
        c.watermarks.high = Some(MEMBERS as u32);
        c.watermarks.trim_close_grace = Duration::from_secs(2);
        // Shed members stay away for the whole test.
        c.drain.goaway_retry_after = Duration::from_secs(3600);
        // The unauthenticated peer below stays until trimming closes it.
        c.auth.deadline = Duration::from_secs(600);
    })
    .await;
    // A connection that never authenticates: shed first.
    let mut idle = TestPeer::new();
    idle.connect(a.id(), a.handle.listen_addrs()[0].clone())
        .await;
    let mut registry = Registry::default();
    let mut dirs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..MEMBERS {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = start_node(
            &cp,
            dir.path(),
            &mut registry,
            &i.to_string(),
            1,
            selector("name", "a"),
            vec![],
        )
        .await;
        nodes.push(n);
        dirs.push(dir);
    }

    // The 20th admission reaches the high watermark: 3 members are shed.
    eventually("trimmed down to the low watermark", || async {
        let shed = a.trimmed("other_routers") + a.trimmed("only_router");
        (shed == (MEMBERS - LOW) as f64 && a.attached() == LOW as f64).then_some(())
    })
    .await;
    assert_eq!(
        a.goaways("overloaded", "acked"),
        (MEMBERS - LOW) as f64,
        "every shed member acknowledged a go-away"
    );
    assert_eq!(a.trimmed("only_router"), (MEMBERS - LOW) as f64);
    assert_eq!(a.trimmed("unauthenticated"), 1.0);
    let aid = a.id();
    idle.wait(
        "the unauthenticated connection closed",
        |e| matches!(e, support::Ev::Closed { peer, remaining: 0 } if *peer == aid),
    )
    .await;

    // Member side: exactly the shed members got go-away OVERLOADED, and they
    // are the ones no longer attached to A.
    let shed: Vec<usize> = eventually("shed members detached", || async {
        let text = encode(&registry);
        let got: Vec<usize> = (0..MEMBERS)
            .filter(|i| node_goaways(&text, &i.to_string(), "overloaded") >= 1.0)
            .collect();
        let detached: Vec<usize> = (0..MEMBERS)
            .filter(|i| !nodes[*i].status().borrow().admitted.contains(&a.id()))
            .collect();
        (got.len() == MEMBERS - LOW && got == detached).then_some(got)
    })
    .await;
    assert_eq!(shed.len(), MEMBERS - LOW);
    assert_eq!(a.attached(), LOW as f64, "shed members do not come back");
    for n in nodes {
        n.shutdown().await;
    }
    a.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_one_of_three_routers_keeps_members_on_k_routers_and_calls_working() {
    const K: usize = 2;
    let cp = start_cp().await;
    let mut routers = Vec::new();
    for name in ["r1", "r2", "r3"] {
        routers.push(start_router(&cp, name, |c| c.drain.grace = Duration::from_secs(30)).await);
    }
    let backend = echo_backend().await;
    let mut registry = Registry::default();
    let mut dirs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..6 {
        let dir = tempfile::tempdir().expect("tempdir");
        let expose = if i < 3 {
            vec![(format!("echo-{i}"), backend)]
        } else {
            vec![]
        };
        let n = start_node(
            &cp,
            dir.path(),
            &mut registry,
            &i.to_string(),
            K,
            selector("tier", "mesh"),
            expose,
        )
        .await;
        nodes.push(n);
        dirs.push(dir);
    }
    let nodes = Arc::new(nodes);
    on_k_routers(&nodes, K).await;

    // Every router has read a directory listing all three (alternatives).
    eventually("routers see each other in the directory", || async {
        routers
            .iter()
            .all(|r| r.metric("agentmesh_router_directory_sync_total{result=\"ok\"}") >= 3.0)
            .then_some(())
    })
    .await;

    // Drain the router holding an exposing member (the busiest such one).
    let drained_idx = (0..3)
        .max_by_key(|i| {
            let id = routers[*i].id();
            let exposing = (0..3)
                .filter(|n| nodes[*n].status().borrow().reserved.contains(&id))
                .count();
            (exposing, routers[*i].attached() as i64)
        })
        .expect("three routers");
    let drained = routers[drained_idx].id();
    for r in &routers {
        tracing::info!(
            router = %r.id(),
            attached = r.attached(),
            directory_ok = r.metric("agentmesh_router_directory_sync_total{result=\"ok\"}"),
            lease_ok = r.metric("agentmesh_router_lease_total{result=\"ok\"}"),
            "before the drain"
        );
    }
    for n in nodes.iter() {
        let s = n.status().borrow().clone();
        tracing::info!(candidates = s.candidates, reserved = ?s.reserved, "node before the drain");
    }
    let targets: Vec<String> = (0..3)
        .filter(|n| nodes[*n].status().borrow().reserved.contains(&drained))
        .map(|n| format!("echo-{n}"))
        .collect();
    assert!(
        !targets.is_empty(),
        "some exposing member is on the drained router"
    );
    let members_on_drained = nodes
        .iter()
        .filter(|n| n.status().borrow().admitted.contains(&drained))
        .count();
    // Calls succeed before the drain (the DHT has the records).
    let caller = 3;
    for t in &targets {
        eventually("a first call to each target", || async {
            call_echo(&nodes[caller], t, b"hello").await.ok()
        })
        .await;
    }

    // Sample every node and call the targets while the router drains.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (nodes, stop) = (nodes.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut samples, mut bad) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                for (i, n) in nodes.iter().enumerate() {
                    let s = n.status().borrow().clone();
                    samples += 1;
                    if !s.ready || s.admitted.len() < K {
                        bad.push(format!("node {i}: {s:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (samples, bad)
        })
    };
    let (calls_ok, calls_failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let caller_task = {
        let (nodes, stop, ok, failed) = (
            nodes.clone(),
            stop.clone(),
            calls_ok.clone(),
            calls_failed.clone(),
        );
        let targets = targets.clone();
        tokio::spawn(async move {
            // Each call may be retried (a fresh lookup and route) up to
            // CALL_ATTEMPTS times; first attempts that failed are reported.
            let (mut errors, mut retried) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::SeqCst) {
                for t in &targets {
                    let mut last = None;
                    for attempt in 0..CALL_ATTEMPTS {
                        match call_echo(&nodes[caller], t, &[7u8; 4096]).await {
                            Ok(()) => {
                                last = None;
                                break;
                            }
                            Err(e) => {
                                if attempt == 0 {
                                    retried.push(format!("{t}: {e}"));
                                }
                                last = Some(format!("{t}: {e}"));
                            }
                        }
                    }
                    match last {
                        None => ok.fetch_add(1, Ordering::SeqCst),
                        Some(e) => {
                            errors.push(e);
                            failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            }
            (errors, retried)
        })
    };

    // POST /drain on the metrics listener.
    let maddr = routers[drained_idx]
        .handle
        .metrics_addr()
        .expect("metrics listener");
    let (_, resp) = agentmesh_testkit::http_post(maddr, "/drain").await;
    assert!(resp.starts_with("HTTP/1.1 202"), "{resp}");

    let mut done = routers[drained_idx].handle.drained();
    tokio::time::timeout(DEADLINE, done.wait_for(|d| *d))
        .await
        .expect("drain finished in time")
        .expect("drained channel");
    assert!(
        !*routers[drained_idx].handle.ready().borrow(),
        "a draining router is not ready"
    );
    eventually("every node on K routers, none the drained one", || async {
        nodes
            .iter()
            .all(|n| {
                let s = n.status().borrow().clone();
                s.ready && s.reserved.len() >= K && !s.admitted.contains(&drained)
            })
            .then_some(())
    })
    .await;
    // A few more calls after the move.
    let after = calls_ok.load(Ordering::SeqCst) + targets.len();
    eventually("calls after the drain", || async {
        (calls_ok.load(Ordering::SeqCst) >= after).then_some(())
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let (samples, bad) = sampler.await.expect("sampler");
    let (errors, retried) = caller_task.await.expect("caller");
    tracing::info!(
        calls = calls_ok.load(Ordering::SeqCst),
        first_attempts_failed = retried.len(),
        ?retried,
        "calls during the drain"
    );

    let d = &routers[drained_idx];
    assert_eq!(
        d.goaways("draining", "acked"),
        members_on_drained as f64,
        "every member of the drained router acknowledged go-away DRAINING"
    );
    assert!(samples > 0);
    assert!(
        bad.is_empty(),
        "{} of {samples} samples had a node not ready or below K: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
    assert_eq!(
        calls_failed.load(Ordering::SeqCst),
        0,
        "calls failed during the drain: {errors:?}"
    );
    let nodes = Arc::try_unwrap(nodes).unwrap_or_else(|_| panic!("nodes still shared"));
    for n in nodes {
        n.shutdown().await;
    }
    for r in routers {
        r.handle.shutdown().await;
    }
}
