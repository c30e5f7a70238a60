//! The real `agentmesh-router` binary among two in-process routers (K = 2):
//! SIGTERM drains it (members move, make-before-break, and it exits 0);
//! SIGKILL leaves every member back on K routers. Waits are on conditions
//! with a generous deadline; nothing asserts timing.

use super::mesh;
use super::support;

use std::collections::BTreeMap;
use std::process::Stdio;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use libp2p::PeerId;
use mesh::*;
use prometheus_client::registry::Registry;
use support::{DEADLINE, eventually};
use tokio::process::Child;

const K: usize = 2;
const NODES: usize = 4;

/// Starts the router binary labelled `name=bin,tier=mesh`; returns the child
/// and its PeerId (from its log).
async fn start_binary(cp: &Cp, dir: &std::path::Path) -> (Child, PeerId) {
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
    let peer = support::scan_stderr(&mut child, "peer id", |line| {
        if !line.contains("router started") {
            return None;
        }
        let (_, rest) = line.split_once("peer_id=")?;
        let id = rest.split_whitespace().next().unwrap_or_default();
        Some(id.parse::<PeerId>().expect("peer id in the log"))
    })
    .await;
    (child, peer)
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
    let (child, bin) = start_binary(&cp, bdir.path()).await;
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
