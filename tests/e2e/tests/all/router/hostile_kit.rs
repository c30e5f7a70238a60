//! What the hostile-peer tests against the router binary share: the
//! router binary with long deadlines (so only the defences under test free
//! anything), members dialing from [`MEMBERS`], and bounded waits for them
//! to be ready and to call.

use super::support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use support::cp::Cp;
use support::{DEADLINE, eventually, http_get, metric, scan_stderr};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Child;
use tokio::time::Instant;

/// Where the members dial from, unless a test names another address.
pub(super) const MEMBERS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// Longest time a member may take to be ready while an attack runs:
/// generous (unhindered, well under a second) so it cannot flake, yet far
/// below what the attacks cost a member without their defences.
pub(super) const MEMBER_BOUND: Duration = Duration::from_secs(20);
/// Auth and stream deadlines of the router: longer than the tests, so the
/// attacks' connections and slots are never freed by a timeout.
const LONG_DEADLINE_SECS: &str = "300";

/// The router binary with its PeerId, listen and metrics addresses.
pub(super) struct RouterBin {
    _child: Child,
    pub(super) peer: PeerId,
    listen: Multiaddr,
    pub(super) metrics: SocketAddr,
}

impl RouterBin {
    pub(super) async fn metrics_text(&self) -> String {
        http_get(self.metrics, "/metrics").await.1
    }

    pub(super) async fn metric(&self, series: &str) -> f64 {
        metric(&self.metrics_text().await, series)
    }

    /// The listen address with the PeerId, as the attack dials it.
    pub(super) fn addr(&self) -> Multiaddr {
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
pub(super) async fn start_router(cp: &Cp, dir: &std::path::Path, extra: &[&str]) -> RouterBin {
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
        .args(extra)
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

/// [`start_router`] in a fresh directory with `--stranger-refused-streams-max
/// budget`; the directory lives as long as the router needs it.
pub(super) async fn start_router_with_refused_budget(
    cp: &Cp,
    budget: u64,
) -> (RouterBin, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = budget.to_string();
    let r = start_router(cp, dir.path(), &["--stranger-refused-streams-max", &budget]).await;
    (r, dir)
}

/// A member dialing from [`MEMBERS`], one router, exposing `expose`.
pub(super) async fn start_member(
    cp: &Cp,
    dir: &std::path::Path,
    expose: Vec<(String, SocketAddr)>,
) -> NodeHandle {
    start_member_from(cp, dir, expose, MEMBERS).await
}

/// A member dialing from `source`, one router, exposing `expose`.
pub(super) async fn start_member_from(
    cp: &Cp,
    dir: &std::path::Path,
    expose: Vec<(String, SocketAddr)>,
    source: Ipv4Addr,
) -> NodeHandle {
    agentmesh_node::spawn(
        agentmesh_node::Config {
            data_dir: dir.to_path_buf(),
            metrics_addr: None,
            control_plane: agentmesh_node::config::ControlPlaneConfig {
                url: cp.url.clone(),
                token: cp.token(Role::Member).await,
                directory_interval: std::time::Duration::from_secs(1),
                ..Default::default()
            },
            routers: agentmesh_node::config::RoutersConfig {
                count: 1,
                ..Default::default()
            },
            services: agentmesh_node::config::ServicesConfig {
                expose,
                ..Default::default()
            },
            local: agentmesh_node::config::LocalConfig {
                no_socket: true,
                ..Default::default()
            },
            connections: agentmesh_node::config::ConnectionConfig {
                dial_source_ip: Some(IpAddr::V4(source)),
                ..Default::default()
            },
            ..agentmesh_node::Config::default()
        },
        None,
    )
    .await
    .expect("spawn member")
}

/// Waits until `n` is ready (attached, reserved, its records accepted),
/// within [`MEMBER_BOUND`].
pub(super) async fn ready_within_bound(n: &NodeHandle, who: &str) {
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
pub(super) async fn echo_within_bound(caller: &NodeHandle) {
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
