//! The real `agentmesh-router` binary among two in-process routers (K = 2):
//! SIGTERM drains it (members move, make-before-break, and it exits 0);
//! a call streaming through it when the drain starts completes with all its
//! bytes after both its ends moved away; SIGKILL leaves every member back on
//! K routers. Waits are on conditions with a generous deadline; nothing
//! asserts timing.

use super::mesh;
use super::support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use rand::RngCore as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use libp2p::PeerId;
use mesh::*;
use prometheus_client::registry::Registry;
use support::{DEADLINE, eventually};
use tokio::process::Child;

const K: usize = 2;
const NODES: usize = 4;

/// The binary's log lines, read from its stderr as they come.
type Log = Arc<Mutex<Vec<String>>>;

/// Starts the router binary labelled `name=bin,tier=mesh`; returns the child,
/// its PeerId (from its log) and its log.
async fn start_binary(cp: &Cp, dir: &std::path::Path) -> (Child, PeerId, Log) {
    let labels: BTreeMap<String, String> = [
        ("name".to_string(), "bin".to_string()),
        ("tier".to_string(), "mesh".to_string()),
    ]
    .into();
    let token_file = dir.join("router.token");
    std::fs::write(&token_file, cp.token_labelled(Role::Router, &labels).await)
        .expect("write token");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_e2e-agentmesh-router"))
        .args(["--control-plane", &cp.url])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--key-path")
        .arg(dir.join("router.key"))
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .args(["--label", "name=bin", "--label", "tier=mesh"])
        .args(["--lease-interval-secs", "1", "--clock-skew-secs", "0"])
        .args(["--drain-grace-secs", "20"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start router binary");
    let stderr = child.stderr.take().expect("stderr piped");
    let log: Log = Arc::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let lines = log.clone();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut read = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = read.next_line().await {
            if line.contains("router started")
                && let Some((_, rest)) = line.split_once("peer_id=")
                && let Some(tx) = tx.take()
            {
                let id = rest.split_whitespace().next().unwrap_or_default();
                let _ = tx.send(id.parse::<PeerId>().expect("peer id in the log"));
            }
            lines.lock().expect("log lock").push(line);
        }
    });
    let peer = tokio::time::timeout(DEADLINE, rx)
        .await
        .expect("peer id logged in time")
        .expect("router exited before logging its peer id");
    (child, peer, log)
}

/// A control plane, two in-process routers, the binary router and NODES
/// nodes with K = 2, all ready and some of them on the binary.
struct Mesh {
    cp: Cp,
    routers: Vec<Router>,
    child: Child,
    bin: PeerId,
    nodes: Vec<NodeHandle>,
    registry: Registry,
    _dirs: Vec<tempfile::TempDir>,
}

async fn start_mesh() -> Mesh {
    let cp = start_cp().await;
    let mut routers = Vec::new();
    for name in ["r1", "r2"] {
        routers.push(start_router(&cp, name, |_| {}).await);
    }
    let bdir = tempfile::tempdir().expect("tempdir");
    let (child, bin, _log) = start_binary(&cp, bdir.path()).await;
    let mut dirs = vec![bdir];
    let mut registry = Registry::default();
    let mut nodes = Vec::new();
    // Nodes start once the binary is in the directory, so it gets members.
    eventually("the binary router in the directory", || async {
        let d = cp.client.get_directory().await.ok()?;
        (d.routers.len() == 3).then_some(())
    })
    .await;
    for i in 0..NODES {
        let dir = tempfile::tempdir().expect("tempdir");
        nodes.push(
            start_node(
                &cp,
                dir.path(),
                &mut registry,
                &i.to_string(),
                K,
                selector("tier", "mesh"),
                vec![],
            )
            .await,
        );
        dirs.push(dir);
    }
    on_k_routers(&nodes, K).await;
    Mesh {
        cp,
        routers,
        child,
        bin,
        nodes,
        registry,
        _dirs: dirs,
    }
}

impl Mesh {
    fn on_binary(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.status().borrow().reserved.contains(&self.bin))
            .count()
    }

    async fn every_node_back_on_k_routers(&self) {
        eventually("every node on K routers, none the binary", || async {
            self.nodes
                .iter()
                .all(|n| {
                    let s = n.status().borrow().clone();
                    s.ready && s.reserved.len() >= K && !s.reserved.contains(&self.bin)
                })
                .then_some(())
        })
        .await;
    }

    async fn stop(self) {
        for n in self.nodes {
            n.shutdown().await;
        }
        for r in self.routers {
            r.handle.shutdown().await;
        }
        self.cp.handle.shutdown().await;
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_binary_members_move_and_it_exits_cleanly() {
    let mut m = start_mesh().await;
    let moved = m.on_binary();
    assert!(moved >= 1, "some node holds the binary router");
    signal(m.child.id().expect("pid"), "-TERM");
    let status = tokio::time::timeout(DEADLINE, m.child.wait())
        .await
        .expect("router exits after its drain")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");
    m.every_node_back_on_k_routers().await;
    // Each member of the binary was told to go (it did not just lose it).
    let text = encode(&m.registry);
    let told: f64 = (0..NODES)
        .map(|i| node_goaways(&text, &i.to_string(), "draining"))
        .sum();
    assert_eq!(told, moved as f64, "go-away DRAINING per member");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_router_leaves_every_member_back_on_k_routers() {
    let mut m = start_mesh().await;
    assert!(m.on_binary() >= 1, "some node holds the binary router");
    m.child.kill().await.expect("SIGKILL");
    m.every_node_back_on_k_routers().await;
    let text = encode(&m.registry);
    let told: f64 = (0..NODES)
        .map(|i| node_goaways(&text, &i.to_string(), "draining"))
        .sum();
    assert_eq!(told, 0.0, "a killed router sends nothing");
    m.stop().await;
}

/// Bytes of the streamed call, each half.
const HALF: usize = 256 * 1024;

/// A node preferring the binary router (`name=bin`), K = `k`, its metrics
/// in `registry` under `member=NAME`.
async fn start_on_binary(
    cp: &Cp,
    dir: &std::path::Path,
    registry: &mut Registry,
    name: &str,
    k: usize,
    expose: Vec<(String, std::net::SocketAddr)>,
) -> NodeHandle {
    start_node_with(cp, dir, registry, name, |c| {
        c.routers.count = k;
        c.routers.selector = selector("tier", "mesh");
        c.routers.prefer = selector("name", "bin");
        c.services.expose = expose;
    })
    .await
}

/// The linger ends a node counted with `reason`.
fn linger_ends(text: &str, member: &str, reason: &str) -> f64 {
    node_counter(text, "goaway_linger_ends_total", ("reason", reason), member)
}

/// A call streaming through the binary router when SIGTERM drains it: the
/// caller (K = 1) and the provider (K = 2) both move off the binary
/// (make-before-break, no longer holding it) while the call is open; the
/// call then carries its second half and comes back whole, because both
/// keep their connection to the draining router while the call runs over
/// it (before, each closed it on release and cut the call). The router's
/// drain ends once the call is over and no member is left, before its
/// grace, and it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_streaming_through_a_draining_router_completes_with_all_its_bytes() {
    let cp = start_cp().await;
    let mut routers = Vec::new();
    for name in ["r1", "r2"] {
        routers.push(start_router(&cp, name, |_| {}).await);
    }
    let bdir = tempfile::tempdir().expect("tempdir");
    let (mut child, bin, log) = start_binary(&cp, bdir.path()).await;
    eventually("the binary router in the directory", || async {
        let d = cp.client.get_directory().await.ok()?;
        (d.routers.len() == 3).then_some(())
    })
    .await;
    let mut registry = Registry::default();
    let (pdir, cdir) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let echo = vec![("echo".to_string(), echo_backend().await)];
    let provider = start_on_binary(&cp, pdir.path(), &mut registry, "provider", 2, echo).await;
    let caller = start_on_binary(&cp, cdir.path(), &mut registry, "caller", 1, vec![]).await;
    on_k_routers(std::slice::from_ref(&provider), 2).await;
    on_k_routers(std::slice::from_ref(&caller), 1).await;
    for n in [&provider, &caller] {
        let s = n.status().borrow().clone();
        assert!(s.reserved.contains(&bin), "not on the binary: {s:?}");
    }

    // The caller holds only the binary: the call goes through it.
    let mut stream = support::eventually("a call to echo", || async {
        caller.call("echo").await.ok()
    })
    .await;
    assert_eq!(stream.route().via_router, bin, "{:?}", stream.route());
    let mut payload = vec![0u8; 2 * HALF];
    rand::thread_rng().fill_bytes(&mut payload);
    let mut back = vec![0u8; 2 * HALF];
    stream
        .write_all(&payload[..HALF])
        .await
        .expect("write first half");
    stream
        .read_exact(&mut back[..HALF])
        .await
        .expect("read first half");

    signal(child.id().expect("pid"), "-TERM");
    // Both ends moved: neither holds the binary any more, nor is leaving it.
    eventually("caller and provider off the binary", || async {
        [(&caller, 1), (&provider, 2)]
            .iter()
            .all(|(n, k)| {
                let s = n.status().borrow().clone();
                s.ready
                    && s.reserved.len() == *k
                    && !s.reserved.contains(&bin)
                    && s.leaving.is_empty()
            })
            .then_some(())
    })
    .await;
    let text = encode(&registry);
    for member in ["caller", "provider"] {
        assert_eq!(
            node_goaways(&text, member, "draining"),
            1.0,
            "{member} told once"
        );
    }
    // The rest of the call, over the circuit through the draining router.
    stream
        .write_all(&payload[HALF..])
        .await
        .expect("write second half");
    stream.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    stream
        .read_to_end(&mut rest)
        .await
        .expect("read to the end");
    back.truncate(HALF);
    back.extend(rest);
    assert_eq!(back.len(), payload.len(), "bytes echoed");
    assert!(back == payload, "the echo came back different");
    assert_eq!(stream.route().via_router, bin);
    drop(stream);

    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("router exits after its drain")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");
    let lines = log.lock().expect("log lock").clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("every member moved and no circuit is left")),
        "the drain ran to its grace instead of ending with its last member: {lines:#?}"
    );
    // Each end let go of the router once its call was over, none at a deadline.
    let text = encode(&registry);
    for member in ["caller", "provider"] {
        assert_eq!(linger_ends(&text, member, "deadline"), 0.0, "{member}");
        assert_eq!(
            linger_ends(&text, member, "calls_done") + linger_ends(&text, member, "router_closed"),
            1.0,
            "{member}: one linger, ended with its call or by the router"
        );
    }
    assert!(
        linger_ends(&text, "caller", "calls_done") >= 1.0,
        "the caller let go of the router itself once its call ended"
    );
    for n in [provider, caller] {
        n.shutdown().await;
    }
    for r in routers {
        r.handle.shutdown().await;
    }
    cp.handle.shutdown().await;
}
