//! Attack 1 of issue 17 against the real router binary: strangers from one
//! address hold the router's auth slots with auth streams that stall, while
//! real members from another address enroll, attach and call each other.
//!
//! - 64 unauthenticated connections from 127.0.0.66 (a fresh PeerId each,
//!   as many as one address may hold), 4 auth streams each, every stream
//!   one length byte and then nothing: together exactly the router's
//!   default 256 auth slots, renewed as the router closes them (after
//!   [`RENEW_DELAY`], so refused renewals do not spin). The router
//!   runs with auth and stream deadlines longer than the test, so nothing
//!   but fairness ever frees a slot for a member.
//! - A second, silent attack from 127.0.0.67 (auth streams that send not a
//!   byte): each counts as a failed login once the first-byte deadline
//!   passes, and the source is blocked for a short while.
//!
//! Asserted: members from 127.0.0.9 are ready and call each other within
//! generous bounds (unhindered they take well under a second; a bound, not
//! a timing measurement), and the router's counters show what it did: slots
//! taken from the heaviest source, renewals refused for their source's
//! share, failed logins of the silent streams and a block of their source.
//!
//! Not tested: a member dialing from the attacker's own address. It is the
//! attacker's source, whose whole share of unauthenticated connections the
//! attack holds; before authentication nothing tells the two apart.

use super::support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use agentmesh_hostile::router_auth::{self, Attack, Stall};
use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use support::cp::{Cp, start_cp};
use support::{DEADLINE, eventually, http_get, metric, scan_stderr};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Child;
use tokio::time::Instant;

/// Where the attack comes from.
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 66);
/// Where the silent attack comes from.
const SILENT_ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 67);
/// Where the members dial from.
const MEMBERS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// Connections of the attack: the default unauthenticated connections one
/// address may hold.
const PEERS: usize = 64;
/// Auth streams per connection: the default per-peer auth budget.
const STREAMS_PER_PEER: usize = 4;
/// Peers and streams of the silent attack: 32 failed logins at once, past
/// the default 30 per minute.
const SILENT_PEERS: usize = 8;
/// Longest time a member may take to be ready while the attack runs:
/// generous (unhindered, well under a second) so it cannot flake, yet far
/// below what the attack costs a member without fair shares (it never got
/// a slot while the attacker held them all).
const MEMBER_BOUND: Duration = Duration::from_secs(20);
/// Pause of the attack between a stream's close and its renewal: a
/// renewal refused at once would otherwise spin as fast as loopback allows
/// and load the shared test machine rather than the router's fairness.
const RENEW_DELAY: Duration = Duration::from_millis(50);
/// Auth and stream deadlines of the router: longer than the test, so the
/// attack's slots are never freed by a timeout.
const LONG_DEADLINE_SECS: &str = "300";

/// The router binary with its PeerId, listen and metrics addresses.
struct RouterBin {
    _child: Child,
    peer: PeerId,
    listen: Multiaddr,
    metrics: SocketAddr,
}

impl RouterBin {
    async fn metrics_text(&self) -> String {
        http_get(self.metrics, "/metrics").await.1
    }

    async fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics_text().await, series)
    }

    /// The listen address with the PeerId, as the attack dials it.
    fn addr(&self) -> Multiaddr {
        self.listen.clone().with(Protocol::P2p(self.peer))
    }
}

/// The first `/ip4/...` multiaddr in a log line (the listen address in
/// "router started ... listen=[/ip4/127.0.0.1/tcp/P]").
fn first_multiaddr(line: &str) -> Option<Multiaddr> {
    let start = line.find("/ip4/")?;
    let rest = &line[start..];
    let end = rest
        .find(|c: char| c == ']' || c == ',' || c.is_whitespace())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Starts the router binary (default limits, a 1 GiB memory limit, long
/// auth and stream deadlines) and waits until it is ready.
async fn start_router(cp: &Cp, dir: &std::path::Path) -> RouterBin {
    let token_file = dir.join("router.token");
    std::fs::write(&token_file, cp.token(Role::Router).await).expect("write token");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_e2e-agentmesh-router"))
        .args(["--control-plane", &cp.url])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--key-path")
        .arg(dir.join("router.key"))
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--lease-interval-secs", "1"])
        .args(["--auth-deadline-secs", LONG_DEADLINE_SECS])
        .args(["--stream-timeout-secs", LONG_DEADLINE_SECS])
        // A known budget, whatever the machine's cgroup says: the attack's
        // connections and streams fit in the strangers' share of it.
        .args(["--memory-limit-bytes", "1073741824"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start router binary");
    // "router started" (PeerId, listen address) comes before "metrics on".
    let mut started = None;
    let (peer, listen, metrics) = scan_stderr(&mut child, "router addresses", |line| {
        if line.contains("router started") {
            let (_, rest) = line.split_once("peer_id=")?;
            let id = rest.split_whitespace().next()?.parse::<PeerId>().ok()?;
            started = Some((id, first_multiaddr(line)?));
            return None;
        }
        let (_, rest) = line.split_once("metrics on http://")?;
        let addr = rest.trim().parse::<SocketAddr>().ok()?;
        let (id, listen) = started.clone()?;
        Some((id, listen, addr))
    })
    .await;
    let r = RouterBin {
        _child: child,
        peer,
        listen,
        metrics,
    };
    eventually("the router binary ready", || async {
        (http_get(r.metrics, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    r
}

/// A member dialing from [`MEMBERS`], one router, exposing `expose`.
async fn start_member(
    cp: &Cp,
    dir: &std::path::Path,
    expose: Vec<(String, SocketAddr)>,
) -> NodeHandle {
    agentmesh_node::spawn(
        agentmesh_node::Config {
            control_plane: cp.url.clone(),
            token: cp.token(Role::Member).await,
            data_dir: dir.to_path_buf(),
            routers: 1,
            expose,
            directory_interval: std::time::Duration::from_secs(1),
            no_socket: true,
            metrics_addr: None,
            dial_source_ip: Some(IpAddr::V4(MEMBERS)),
            ..agentmesh_node::Config::default()
        },
        None,
    )
    .await
    .expect("spawn member")
}

/// Waits until `n` is ready (attached, reserved, its records accepted),
/// within [`MEMBER_BOUND`].
async fn ready_within_bound(n: &NodeHandle, who: &str) {
    let mut status = n.status();
    tokio::time::timeout(MEMBER_BOUND, status.wait_for(|s| s.ready))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{who} not ready within {MEMBER_BOUND:?} during the attack: {:?}",
                n.status().borrow()
            )
        })
        .expect("status");
}

/// One echo call from `caller`, retried within [`MEMBER_BOUND`] (the
/// provider's record may reach the catalog a moment after it is ready).
async fn echo_within_bound(caller: &NodeHandle) {
    let end = Instant::now() + MEMBER_BOUND;
    let mut last = String::new();
    while Instant::now() < end {
        match echo(caller).await {
            Ok(()) => return,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no echo call within {MEMBER_BOUND:?} during the attack: {last}");
}

async fn echo(caller: &NodeHandle) -> Result<(), String> {
    let payload = b"members still call each other";
    let stream = caller.call("echo").await.map_err(|e| e.to_string())?;
    let (mut r, mut w) = tokio::io::split(stream);
    w.write_all(payload).await.map_err(|e| e.to_string())?;
    w.shutdown().await.map_err(|e| e.to_string())?;
    let mut back = Vec::new();
    tokio::time::timeout(DEADLINE, r.read_to_end(&mut back))
        .await
        .map_err(|_| "echo did not finish".to_string())?
        .map_err(|e| e.to_string())?;
    (back == payload)
        .then_some(())
        .ok_or_else(|| format!("echo came back different: {back:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_holding_the_auth_slots_do_not_keep_members_out() {
    let cp = start_cp().await;
    let rdir = tempfile::tempdir().expect("tempdir");
    let r = start_router(&cp, rdir.path()).await;

    // The attack takes every auth slot.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let attack = tokio::spawn(router_auth::run_until(
        Attack {
            router: r.addr(),
            source_ip: IpAddr::V4(ATTACKER),
            peers: PEERS,
            streams_per_peer: STREAMS_PER_PEER,
            stall: Stall::LengthByte,
            renew_delay: RENEW_DELAY,
            duration: 2 * DEADLINE,
        },
        async {
            let _ = stopped.await;
        },
    ));
    let slots = (PEERS * STREAMS_PER_PEER) as f64;
    eventually("the attack holds every auth slot", || async {
        let held = r
            .metric(r#"agentmesh_router_streams{protocol="auth",direction="inbound"}"#)
            .await;
        (held >= slots).then_some(())
    })
    .await;

    // The silent attack from another address: its streams are failed logins.
    let (stop_silent, silent_stopped) = tokio::sync::oneshot::channel::<()>();
    let silent = tokio::spawn(router_auth::run_until(
        Attack {
            router: r.addr(),
            source_ip: IpAddr::V4(SILENT_ATTACKER),
            peers: SILENT_PEERS,
            streams_per_peer: STREAMS_PER_PEER,
            stall: Stall::Silent,
            renew_delay: RENEW_DELAY,
            duration: 2 * DEADLINE,
        },
        async {
            let _ = silent_stopped.await;
        },
    ));

    // Members from a third address: enroll, attach, call.
    let started = Instant::now();
    let backend = agentmesh_testkit::echo_backend().await;
    let (pdir, cdir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let provider = start_member(&cp, pdir.path(), vec![("echo".into(), backend)]).await;
    let caller = start_member(&cp, cdir.path(), vec![]).await;
    ready_within_bound(&provider, "the provider").await;
    ready_within_bound(&caller, "the caller").await;
    let ready = started.elapsed();
    echo_within_bound(&caller).await;
    tracing::info!(?ready, called = ?started.elapsed(), "members during the attack");

    // What the router did, as its counters show it.
    let series = |s: &str| s.to_string();
    let preempted = series(r#"agentmesh_router_slots_preempted_total{budget="auth"}"#);
    let share =
        series(r#"agentmesh_router_slots_refused_total{budget="auth",reason="source_share"}"#);
    let silent_logins = series(r#"agentmesh_router_failed_logins_total{reason="silent"}"#);
    let blocks = series("agentmesh_router_failed_login_blocks_total");
    let m = eventually(
        "the silent streams counted and their source blocked",
        || async {
            let m = r.metrics_text().await;
            (metric(&m, &silent_logins) >= 30.0 && metric(&m, &blocks) >= 1.0).then_some(m)
        },
    )
    .await;
    assert!(
        metric(&m, &preempted) >= 1.0,
        "slots taken from the attack: {m}"
    );
    // A renewal that finds every slot taken waits in the auth queue behind
    // the others (or is refused its place there, or answered busy, when
    // the queue cannot serve it): either way it is held back, not given a
    // slot at once.
    let queue_share = series(
        r#"agentmesh_router_slots_refused_total{budget="auth_queue",reason="source_share"}"#,
    );
    let busy = series(r#"agentmesh_router_auth_total{purpose="attach",result="busy"}"#);
    let waits: f64 = ["served", "timed_out", "preempted", "full"]
        .iter()
        .map(|o| {
            let s = format!(r#"agentmesh_router_slots_waits_total{{budget="auth",outcome="{o}"}}"#);
            metric(&m, &s)
        })
        .sum();
    assert!(
        metric(&m, &share) + metric(&m, &queue_share) + metric(&m, &busy) + waits >= 1.0,
        "renewals held back: {m}"
    );
    let auth_silent = r#"agentmesh_router_auth_total{purpose="attach",result="silent"}"#;
    assert!(metric(&m, auth_silent) >= 30.0, "{m}");
    // The stalled streams that sent a length byte are slow, not failed logins.
    for reason in ["malformed", "bad_signature", "wrong_peer"] {
        let s = format!("agentmesh_router_failed_logins_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&m, &s), 0.0, "{s}: {m}");
    }

    let _ = stop.send(());
    let _ = stop_silent.send(());
    let report = attack.await.expect("attack task").expect("attack");
    let silent = silent
        .await
        .expect("silent attack task")
        .expect("silent attack");
    tracing::info!(%report, %silent, "attack reports");
    assert!(
        report.connections >= PEERS as u64,
        "the attack ran: {report}"
    );
    assert!(
        report.streams_opened > slots as u64,
        "its streams were renewed: {report}"
    );
    assert!(
        silent.streams_closed >= 30,
        "silent streams closed: {silent}"
    );
    caller.shutdown().await;
    provider.shutdown().await;
    cp.handle.shutdown().await;
}
