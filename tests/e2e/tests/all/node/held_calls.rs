//! Call slots that cannot be held hostage: a real control plane, router
//! and provider node on loopback, a backend that never writes, and the
//! hostile harness holding the provider's calls silent
//! (`agentmesh-hostile provider-held-calls`: several identities enrolled
//! with one token, each with its own circuit, each call accepted and then
//! left silent).
//!
//! - a harness process that freezes (SIGSTOP) or dies (SIGKILL) loses its
//!   calls as soon as the provider finds its connection dead (pings every
//!   second here), long before the idle deadline, and the backend's
//!   connections close with them;
//! - one token's identities share one share of the slots once all are
//!   taken: a fleet of another token still gets its calls, and a fleet
//!   alone on one token may use every slot;
//! - a call idle past `--call-idle-timeout-secs` ends, counted.

use super::support;

use std::sync::Arc;
use std::time::Duration;

use agentmesh_hostile::held_calls::{self, HeldCalls, Progress};
use agentmesh_node::{Config, NodeHandle};
use agentmesh_proto::pb::credential::Role;
use libp2p::identity::Keypair;
use support::*;
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const HOSTILE_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-hostile");

/// The provider's pings: a peer that stops answering is closed after two
/// failures (1 + 1 s each, the least the flags allow).
const PING: Duration = Duration::from_secs(1);
/// An idle deadline far above what the freeze and kill tests wait: what
/// ends their calls must be the dead connection.
const LONG_IDLE: Duration = Duration::from_secs(300);

/// `agentmesh_node_calls_ended_total{direction="inbound",reason}`.
fn ended(m: &str, reason: &str) -> f64 {
    metric(
        m,
        &format!(r#"agentmesh_node_calls_ended_total{{direction="inbound",reason="{reason}"}}"#),
    )
}

/// `agentmesh_node_calls_total{direction="inbound",result}`.
fn inbound(m: &str, result: &str) -> f64 {
    metric(
        m,
        &format!(r#"agentmesh_node_calls_total{{direction="inbound",result="{result}"}}"#),
    )
}

async fn metrics_of(node: &NodeHandle) -> String {
    http_get(node.metrics_addr().expect("metrics"), "/metrics")
        .await
        .1
}

/// A router and a ready provider exposing `quiet` (a [`SilentBackend`])
/// and `echo`, members by `token`, its config changed by `tweak`.
async fn provider(
    cp: &Cp,
    token: &str,
    tweak: impl FnOnce(Config) -> Config,
) -> (Router, NodeHandle, tempfile::TempDir, SilentBackend) {
    let r = start_router(cp, "r1").await;
    let quiet = SilentBackend::start().await;
    let echo = echo_backend().await;
    let (p, dir) = spawn_node(cp, token, "spawn provider", |mut base| {
        base.services.expose = vec![("quiet".into(), quiet.addr), ("echo".into(), echo)];
        tweak(base)
    })
    .await;
    ready(&p, "provider").await;
    (r, p, dir, quiet)
}

/// Starts the harness binary holding `calls` calls to `quiet` on each of
/// `identities` identities it enrolls with `token`; killed when dropped.
async fn hostile_process(
    cp: &Cp,
    r: &Router,
    provider: &NodeHandle,
    dir: &std::path::Path,
    token: &str,
    identities: usize,
    calls: usize,
) -> Child {
    let token_file = binary::token_file(dir, token).await;
    Command::new(HOSTILE_EXE)
        .args(["provider-held-calls", "--control-plane", &cp.url])
        .arg("--token-file")
        .arg(&token_file)
        .args(["--router", &format!("{}/p2p/{}", r.addr, r.id())])
        .args(["--provider", &provider.peer_id().to_string()])
        .args(["--service", "quiet"])
        .args(["--identities", &identities.to_string()])
        .args(["--calls-per-identity", &calls.to_string()])
        .args(["--duration-secs", "300"])
        .kill_on_drop(true)
        .spawn()
        .expect("run the hostile harness")
}

async fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("pid").to_string();
    let sent = Command::new("kill")
        .args([sig, &pid])
        .status()
        .await
        .expect("kill");
    assert!(sent.success(), "kill {sig} {pid}");
}

/// The harness holds `n` calls: the provider serves them and the backend
/// holds their connections.
async fn wait_held(p: &NodeHandle, backend: &SilentBackend, n: usize) {
    eventually(&format!("{n} calls held"), || async {
        let m = metrics_of(p).await;
        let active = metric(&m, "agentmesh_node_inbound_calls_active");
        (active == n as f64 && backend.open() == n).then_some(())
    })
    .await;
}

/// Every call is gone: the provider serves none, the backend holds no
/// connection, and `n` ended because their connection closed (none idle).
/// Returns how long that took.
async fn wait_released(p: &NodeHandle, backend: &SilentBackend, n: usize) -> Duration {
    let start = Instant::now();
    let m = eventually(
        "every held call ended and its backend connection closed",
        || async {
            let m = metrics_of(p).await;
            let active = metric(&m, "agentmesh_node_inbound_calls_active");
            (active == 0.0 && backend.open() == 0).then_some(m)
        },
    )
    .await;
    let took = start.elapsed();
    assert_eq!(ended(&m, "connection_closed"), n as f64, "{m}");
    assert_eq!(ended(&m, "idle_timeout"), 0.0, "{m}");
    took
}

/// Two identities of one token hold 3 silent calls each; their process is
/// frozen. The provider's pings find the connections dead and close them;
/// the calls end with them (not at the 300 s idle deadline) and the
/// backend's connections close. (Before: a connection closed by the
/// provider left its calls parked for good, until an unrelated event woke
/// them; the finding saw 9.5 minutes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_caller_loses_its_calls_when_its_connection_is_found_dead() {
    let cp = start_cp().await;
    let token = cp.token(Role::Member).await;
    let (r, p, dir, backend) = provider(&cp, &token, |mut c| {
        c.connections.ping_interval = PING;
        c.connections.ping_timeout = PING;
        c.calls.idle_timeout = LONG_IDLE;
        c
    })
    .await;
    let child = hostile_process(&cp, &r, &p, dir.path(), &token, 2, 3).await;
    wait_held(&p, &backend, 6).await;
    signal(&child, "-STOP").await;
    let took = wait_released(&p, &backend, 6).await;
    eprintln!("frozen caller's 6 calls released in {took:?}");
    assert_eq!(backend.accepted(), 6, "the frozen caller made no more");
    drop(child);
    p.shutdown().await;
    r.handle.shutdown().await;
}

/// The same with the harness process killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_caller_loses_its_calls_when_its_connection_goes() {
    let cp = start_cp().await;
    let token = cp.token(Role::Member).await;
    let (r, p, dir, backend) = provider(&cp, &token, |mut c| {
        c.connections.ping_interval = PING;
        c.connections.ping_timeout = PING;
        c.calls.idle_timeout = LONG_IDLE;
        c
    })
    .await;
    let mut child = hostile_process(&cp, &r, &p, dir.path(), &token, 2, 3).await;
    wait_held(&p, &backend, 6).await;
    signal(&child, "-KILL").await;
    let _ = child.wait().await;
    let took = wait_released(&p, &backend, 6).await;
    eprintln!("killed caller's 6 calls released in {took:?}");
    p.shutdown().await;
    r.handle.shutdown().await;
}

/// Slots in the token test, and each caller PeerId's cap.
const SLOTS: usize = 8;
const PER_CALLER: usize = 4;

/// An attacker token's three identities hold every one of 8 slots (4 per
/// identity at most) while nobody else calls; then the members of a fleet
/// token call `echo`, each call while the attacker holds all 8, and every
/// call is accepted, each taking one of the attacker's idle calls, while
/// the attacker's renewals are refused for its token's share. With the attack gone, the fleet alone (one token,
/// two members) holds all 8. (Before: the attacker's identities held 8 of
/// 8 and the fleet's calls were refused `TOO_MANY_CALLS`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tokens_identities_cannot_keep_another_tokens_members_out() {
    let cp = start_cp().await;
    let (attacker_token, fleet_token) =
        (cp.token(Role::Member).await, cp.token(Role::Member).await);
    let (r, p, _pdir, backend) = provider(&cp, &fleet_token, |mut c| {
        c.calls.max_inbound = SLOTS;
        c.calls.max_inbound_per_caller = PER_CALLER;
        c
    })
    .await;
    let (a, _adir) = spawn_node(&cp, &fleet_token, "spawn a", |c| c).await;
    let (b, _bdir) = spawn_node(&cp, &fleet_token, "spawn b", |c| c).await;
    ready(&a, "a").await;
    ready(&b, "b").await;
    for n in [&a, &b] {
        let mut s = call_until_found(n, "echo").await;
        assert_eq!(exchange(&mut s, b"before").await.expect("echo"), b"before");
    }

    let mut identities = Vec::new();
    for _ in 0..3 {
        let key = Keypair::generate_ed25519();
        let credential = cp.enroll(&attacker_token, &key).await;
        identities.push((key, credential));
    }
    let attack = HeldCalls {
        router: r.id(),
        router_addr: r.addr.clone(),
        provider: p.peer_id(),
        service: "quiet".into(),
        calls_per_identity: PER_CALLER,
        duration: Duration::from_secs(300),
        renew_pause: Duration::from_millis(100),
    };
    let progress = Arc::new(Progress::default());
    let running = {
        let progress = progress.clone();
        tokio::spawn(async move { held_calls::run(&attack, identities, progress).await })
    };
    // No contention: the attacker's token takes every slot; its third
    // identity finds them all taken by its own token.
    eventually("the attacker's token holds every slot", || async {
        assert!(!running.is_finished(), "the attack ended early");
        let m = metrics_of(&p).await;
        (progress.report().held == SLOTS as u64 && inbound(&m, "token_share") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(backend.open(), SLOTS);

    // Every fleet call comes while the attacker holds all the slots (it
    // renews the one it lost once the call before is done), so each
    // takes one of its calls.
    for (n, who) in [(&a, "a"), (&b, "b")] {
        for i in 1..=3 {
            eventually("the attacker holds every slot again", || async {
                (progress.report().held == SLOTS as u64 && backend.open() == SLOTS).then_some(())
            })
            .await;
            let mut s = n
                .call("echo")
                .await
                .unwrap_or_else(|e| panic!("{who}'s call {i} during the attack: {e}"));
            let payload = format!("{who} {i}");
            let back = tokio::time::timeout(DEADLINE, exchange(&mut s, payload.as_bytes()))
                .await
                .unwrap_or_else(|_| panic!("{who}'s call {i}: no echo in time"))
                .expect("echo");
            assert_eq!(back, payload.as_bytes());
        }
    }
    assert!(!running.is_finished(), "the attack still runs");
    let m = metrics_of(&p).await;
    assert_eq!(ended(&m, "preempted"), 6.0, "one per fleet call: {m}");
    assert_eq!(inbound(&m, "too_many_calls"), 0.0, "{m}");
    // The attacker learns of a preemption when its stream's end reaches
    // it, after the provider counted it: stopping before then would not
    // count the last one (a loaded cold CI run saw 5 of 6).
    eventually("the attacker saw each preemption end its call", || async {
        (progress.report().ended_by_provider >= 6).then_some(())
    })
    .await;
    progress.stop();
    let report = running.await.expect("attack task").expect("attack set-up");
    eprintln!(
        "attack: {report:?}; provider: preempted={} token_share={}",
        ended(&m, "preempted"),
        inbound(&m, "token_share")
    );
    assert!(report.ended_by_provider >= 6, "{report:?}");

    // Alone, one token may use every slot: 4 calls from each fleet member.
    eventually("the attacker's calls are gone", || async {
        let m = metrics_of(&p).await;
        (metric(&m, "agentmesh_node_inbound_calls_active") == 0.0).then_some(())
    })
    .await;
    let mut held = Vec::new();
    for (n, who) in [(&a, "a"), (&b, "b")] {
        for i in 1..=PER_CALLER {
            let s = n
                .call("quiet")
                .await
                .unwrap_or_else(|e| panic!("{who}'s held call {i}: {e}"));
            held.push(s);
        }
    }
    let m = metrics_of(&p).await;
    assert_eq!(
        metric(&m, "agentmesh_node_inbound_calls_active"),
        SLOTS as f64
    );
    drop(held);
    a.shutdown().await;
    b.shutdown().await;
    p.shutdown().await;
    r.handle.shutdown().await;
}

/// A call through a `--forward` listener that nobody speaks on: the
/// provider ends it at its 2 s idle deadline and counts it, its backend
/// connection closes, and the forwarded client sees its connection end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_idle_past_the_deadline_ends_and_is_counted() {
    let cp = start_cp().await;
    let token = cp.token(Role::Member).await;
    let (r, p, _pdir, backend) = provider(&cp, &token, |mut c| {
        c.calls.idle_timeout = Duration::from_secs(2);
        c
    })
    .await;
    let (a, _adir) = spawn_node(&cp, &token, "spawn a", |mut c| {
        c.local.forward = vec![("127.0.0.1:0".parse().expect("addr"), "quiet".into())];
        c
    })
    .await;
    ready(&a, "a").await;
    // The routers know the provider's record once a call finds it.
    let mut s = call_until_found(&a, "echo").await;
    assert_eq!(exchange(&mut s, b"before").await.expect("echo"), b"before");
    drop(s);
    let t0 = Instant::now();
    let mut client = tokio::net::TcpStream::connect(a.forward_addrs()[0])
        .await
        .expect("connect to the forward listener");
    eventually("the forwarded call reaches the backend", || async {
        (backend.accepted() == 1).then_some(())
    })
    .await;
    eprintln!("reached the backend after {:?}", t0.elapsed());
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(DEADLINE, client.read(&mut buf))
        .await
        .expect("the forwarded connection ends");
    eprintln!("the forwarded connection ended after {:?}", t0.elapsed());
    assert!(matches!(n, Ok(0) | Err(_)), "nothing was sent: {n:?}");
    drop(client);
    let m = eventually("the idle call counted", || async {
        let m = metrics_of(&p).await;
        (ended(&m, "idle_timeout") >= 1.0).then_some(m)
    })
    .await;
    assert_eq!(ended(&m, "idle_timeout"), 1.0, "{m}");
    assert_eq!(metric(&m, "agentmesh_node_inbound_calls_active"), 0.0);
    eventually("the backend connection closed", || async {
        (backend.open() == 0).then_some(())
    })
    .await;
    a.shutdown().await;
    p.shutdown().await;
    r.handle.shutdown().await;
}
