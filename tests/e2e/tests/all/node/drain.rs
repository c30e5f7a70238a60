//! A router drains under a fleet: a real control plane, three real routers
//! started with `spawn`, real nodes on loopback (K=2). Waits are on
//! conditions with a generous deadline; the assertions are counts.

use super::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use libp2p::PeerId;
use support::*;

/// Plain members (no service, no calls) besides the provider and callers.
const PLAIN_MEMBERS: usize = 6;
/// Members calling the provider throughout the drain.
const CALLERS: usize = 4;

async fn on_k(node: &NodeHandle, k: usize, gone: Option<PeerId>) -> bool {
    let mut st = node.status();
    tokio::time::timeout(
        DEADLINE,
        st.wait_for(|s| {
            s.ready && s.reserved.len() == k && gone.is_none_or(|g| !s.reserved.contains(&g))
        }),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

/// Waits (checking every 20 ms, up to [`DEADLINE`]) until `ok` counts at
/// least `n` successful calls; the panic names `what` and the count.
async fn calls_reach(ok: &AtomicUsize, n: usize, what: &str) {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let now = ok.load(Ordering::SeqCst);
        if now >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{what}: {now} of {n} successful calls within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Why one call failed.
enum Failure {
    /// `call()` itself failed: no stream.
    Call(String),
    /// The call was accepted, then its echo failed (the circuit under an
    /// accepted call was cut).
    Echo(String),
}

/// One call and a small echo.
async fn call_once(node: &NodeHandle, n: usize) -> Result<(), Failure> {
    let mut s = node
        .call("echo")
        .await
        .map_err(|e| Failure::Call(e.to_string()))?;
    let payload = format!("call {n} through a draining mesh").into_bytes();
    match tokio::time::timeout(DEADLINE, exchange(&mut s, &payload)).await {
        Ok(Ok(back)) if back == payload => Ok(()),
        Ok(Ok(back)) => Err(Failure::Echo(format!(
            "echo came back as {} bytes",
            back.len()
        ))),
        Ok(Err(e)) => Err(Failure::Echo(e.to_string())),
        Err(_) => Err(Failure::Echo("echo timed out".into())),
    }
}

/// Draining the router a provider is attached to (three routers, K=2):
/// every call made during the drain succeeds on its first `call()` (a route
/// that fails under the move is retried on a fresh one, inside the
/// node), and every member ends back on K routers, none of them the
/// drained one (with only K routers left, a shunned router must not keep
/// a member below K), and no call already accepted loses its circuit: a
/// member that releases the drained router keeps its connection while a
/// call streams through it (before, about one call in ~200 was cut when
/// the provider released it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_succeed_first_time_and_everyone_is_back_on_k_while_a_router_drains() {
    let cp = start_cp().await;
    let routers = [
        start_router(&cp, "r1").await,
        start_router(&cp, "r2").await,
        start_router(&cp, "r3").await,
    ];
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let mut dirs = Vec::new();
    let mut spawn = async |expose: bool| {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = node_config(&cp, &member, dir.path());
        config.routers.count = 2;
        if expose {
            config.services.expose = vec![("echo".into(), backend)];
        }
        dirs.push(dir);
        agentmesh_node::spawn(config, None).await.expect("spawn")
    };
    let provider = spawn(true).await;
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        callers.push(spawn(false).await);
    }
    let mut plain = Vec::new();
    for _ in 0..PLAIN_MEMBERS {
        plain.push(spawn(false).await);
    }
    for n in std::iter::once(&provider).chain(&callers).chain(&plain) {
        assert!(
            on_k(n, 2, None).await,
            "not on 2 routers: {:?}",
            n.status().borrow()
        );
    }
    // Each caller finds the provider once (the routers' DHT learns the
    // record), before the drain.
    for c in &callers {
        let mut s = call_until_found(c, "echo").await;
        round_trip(&mut s, 1024).await;
    }

    let before = provider.status().borrow().reserved.clone();
    let drained = routers
        .iter()
        .find(|r| before.contains(&r.handle.peer_id()))
        .expect("one of the provider's routers");
    let gone = drained.handle.peer_id();

    // Callers call in a loop from before the drain until it is over.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let callers = Arc::new(callers);
    let mut loops = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let (callers, stop, ok) = (callers.clone(), stop.clone(), ok.clone());
        loops.spawn(async move {
            let (mut failures, mut cut) = (Vec::new(), Vec::new());
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                match call_once(&callers[i], n).await {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(Failure::Call(e)) => failures.push(format!("caller {i} call {n}: {e}")),
                    Err(Failure::Echo(e)) => cut.push(format!("caller {i} call {n}: {e}")),
                }
            }
            (failures, cut)
        });
    }
    // Some calls before the drain starts.
    let start = ok.load(Ordering::SeqCst);
    calls_reach(&ok, start + CALLERS * 2, "calls before the drain").await;
    drained.handle.drain();
    let mut done = drained.handle.drained();
    tokio::time::timeout(DEADLINE, done.wait_for(|d| *d))
        .await
        .expect("drain finished in time")
        .expect("drained watch");
    assert!(
        on_k(&provider, 2, Some(gone)).await,
        "provider not back on K: {:?}",
        provider.status().borrow()
    );
    // A few more calls after the drained router closed everything.
    let after = ok.load(Ordering::SeqCst);
    calls_reach(&ok, after + CALLERS * 2, "calls after the drain").await;
    stop.store(true, Ordering::SeqCst);
    let (mut failures, mut cut) = (Vec::new(), Vec::new());
    while let Some(r) = loops.join_next().await {
        let (f, c) = r.expect("caller loop");
        failures.extend(f);
        cut.extend(c);
    }
    let total = ok.load(Ordering::SeqCst) + failures.len() + cut.len();
    assert!(
        failures.is_empty(),
        "{} of {total} call() failed during the drain: {failures:#?}",
        failures.len(),
    );
    assert!(
        cut.is_empty(),
        "{} of {total} accepted calls cut during the drain: {cut:#?}",
        cut.len(),
    );

    // Everyone back on K routers, none of them the drained one.
    let callers = Arc::try_unwrap(callers).expect("loops are done");
    let mut below = Vec::new();
    for n in std::iter::once(&provider).chain(&callers).chain(&plain) {
        if !on_k(n, 2, Some(gone)).await {
            below.push(n.status().borrow().clone());
        }
    }
    assert!(below.is_empty(), "members not back on K: {below:#?}");

    let mut retries = 0.0;
    for c in &callers {
        let (_, m) = http_get(c.metrics_addr().expect("metrics"), "/metrics").await;
        for reason in ["connect_failed", "stream_failed", "no_providers"] {
            retries += metric(
                &m,
                &format!(r#"agentmesh_node_call_retries_total{{reason="{reason}"}}"#),
            );
        }
    }
    eprintln!(
        "{total} calls during the drain: every call() ok, {retries} retried on a fresh route, \
         {} accepted then cut: {cut:?}",
        cut.len()
    );

    for n in std::iter::once(provider).chain(callers).chain(plain) {
        n.shutdown().await;
    }
    for r in routers {
        r.handle.shutdown().await;
    }
}
