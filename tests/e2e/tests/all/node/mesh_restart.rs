//! Every router restarting at once under members started outside them (a
//! cluster restart, a parallel rollout, `agentmesh-one` restarted): the
//! real router binary drained by SIGTERM (go-away DRAINING, asking members
//! to stay away 300 s), then started again on the same port, with its key
//! (same PeerId) or a new one. Members run with the default 300 s
//! directory interval. They must be ready again within seconds of the
//! first router answering, not after their shun and the interval (6 min
//! before): with no router held they fetch the directory again within
//! 1-2 s (doubling), and a router back in it, not draining, ends its shun.
//! Waits are on conditions with deadlines; the one on readiness after the
//! restart (20 s) is generous for seconds and far below the 300 s it
//! catches.
//!
//! Back from holding no router, a member dials one router at a time until
//! one serves and attaches the other K − 1 after a random wait of up to
//! `--router-rejoin-spread-ms`. With the restarted routers' keys the
//! spread is an hour, so each member is ready again on exactly one router
//! (a draw under the 100 ms the test polls in has odds of 1 in 36,000);
//! under new PeerIds it is 1 s, and members are back on both.

use super::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentmesh_node::{Config, NodeHandle};
use agentmesh_proto::pb::credential::Role;
use libp2p::PeerId;
use support::*;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Members started outside the mesh.
const MEMBERS: usize = 3;
/// Routers each member holds (every router of the mesh).
const K: usize = 2;
/// The longest a member may take to be ready again after the first router
/// is: seconds are expected (a 1-2 s directory fetch, then dial and
/// reserve); the old behaviour took the 300 s shun and interval.
const BACK_WITHIN: Duration = Duration::from_secs(20);

/// One router binary, restartable on the same port and data dir.
struct RouterBin {
    name: &'static str,
    dir: PathBuf,
    port: u16,
    metrics: SocketAddr,
    child: Option<Child>,
    peer: Option<PeerId>,
}

impl RouterBin {
    fn new(name: &'static str, dir: &Path) -> Self {
        Self {
            name,
            dir: dir.to_path_buf(),
            port: agentmesh_testkit::free_tcp_port(),
            metrics: SocketAddr::from(([127, 0, 0, 1], agentmesh_testkit::free_tcp_port())),
            child: None,
            peer: None,
        }
    }

    /// Starts the binary with key file `key` (in its data dir); returns
    /// once it logged its PeerId.
    async fn start(&mut self, cp: &Cp, token_file: &Path, key: &str) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_e2e-agentmesh-router"))
            .args(["--control-plane", &cp.url])
            .arg("--token-file")
            .arg(token_file)
            .arg("--key-path")
            .arg(self.dir.join(key))
            .args(["--listen", &format!("/ip4/127.0.0.1/tcp/{}", self.port)])
            .args(["--metrics-addr", &self.metrics.to_string()])
            .args(["--lease-interval-secs", "1", "--clock-skew-secs", "0"])
            // Nowhere to move to (every router drains): a short grace.
            .args(["--drain-grace-secs", "3"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start router binary");
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("router started")
                    && let Some((_, rest)) = line.split_once("peer_id=")
                    && let Some(tx) = tx.take()
                {
                    let id = rest.split_whitespace().next().unwrap_or_default();
                    let _ = tx.send(id.parse::<PeerId>().expect("peer id in the log"));
                }
            }
        });
        let peer = tokio::time::timeout(DEADLINE, rx)
            .await
            .expect("peer id logged in time")
            .expect("router exited before logging its peer id");
        self.child = Some(child);
        self.peer = Some(peer);
    }

    fn peer(&self) -> PeerId {
        self.peer.expect("started")
    }

    /// Whether its /readyz answers 200 now.
    async fn is_ready(&self) -> bool {
        let Ok(mut s) = tokio::net::TcpStream::connect(self.metrics).await else {
            return false;
        };
        let req = "GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        if s.write_all(req.as_bytes()).await.is_err() {
            return false;
        }
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
        out.starts_with("HTTP/1.1 200")
    }

    /// SIGTERM, as a restart does: the router drains (go-away DRAINING to
    /// its members, a last lease saying so) and exits.
    fn sigterm(&self) {
        let pid = self.child.as_ref().and_then(Child::id).expect("running");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM {pid}");
    }

    async fn exited(&mut self) {
        let mut child = self.child.take().expect("running");
        let status = tokio::time::timeout(DEADLINE, child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} exits after its drain", self.name))
            .expect("wait");
        assert!(status.success(), "{}: clean exit: {status:?}", self.name);
    }
}

/// Members (K = 2, the default 300 s directory interval) on both routers,
/// both routers drained by SIGTERM and started again on the same ports,
/// with their keys (`same_keys`) or new ones: every member is ready again
/// within [`BACK_WITHIN`] of the first router being ready, on one router
/// (its rejoin spread counted once); then, when `rejoin_spread` is short,
/// back on K.
async fn members_return_after_every_router_restarts(same_keys: bool, rejoin_spread: Duration) {
    let cp = start_cp().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, cp.token(Role::Router).await).expect("write token");
    let mut routers = [
        RouterBin::new("r1", dir.path()),
        RouterBin::new("r2", dir.path()),
    ];
    for r in &mut routers {
        r.start(&cp, &token_file, "router.key").await;
    }
    eventually("both routers ready", || async {
        for r in &routers {
            if !r.is_ready().await {
                return None;
            }
        }
        Some(())
    })
    .await;
    let first: Vec<PeerId> = routers.iter().map(RouterBin::peer).collect();

    let member = cp.token(Role::Member).await;
    let mut members: Vec<(NodeHandle, tempfile::TempDir)> = Vec::new();
    for i in 0..MEMBERS {
        members.push(
            spawn_node(&cp, &member, &format!("member {i}"), |mut c| {
                c.routers.count = K;
                c.control_plane.directory_interval =
                    Config::default().control_plane.directory_interval;
                c.routers.rejoin_spread = rejoin_spread;
                c
            })
            .await,
        );
    }
    on_all(&members, &first, "every member on both routers").await;

    // The restart: both drain at once and exit.
    for r in &routers {
        r.sigterm();
    }
    for r in &mut routers {
        r.exited().await;
    }
    eventually("every member without a router", || async {
        members
            .iter()
            .all(|(n, _)| {
                let s = n.status().borrow().clone();
                !s.ready && s.reserved.is_empty()
            })
            .then_some(())
    })
    .await;

    let key = if same_keys {
        "router.key"
    } else {
        "router2.key"
    };
    for r in &mut routers {
        r.start(&cp, &token_file, key).await;
    }
    let again: Vec<PeerId> = routers.iter().map(RouterBin::peer).collect();
    assert_eq!(again == first, same_keys, "{first:?} then {again:?}");
    // From the moment the first router answers ready.
    let first_ready = eventually("a restarted router ready", || async {
        for r in &routers {
            if r.is_ready().await {
                return Some(Instant::now());
            }
        }
        None
    })
    .await;
    let back_by = first_ready + BACK_WITHIN;
    // Routers each member held when first seen ready again.
    let mut held_when_ready: Vec<Option<usize>> = vec![None; members.len()];
    loop {
        let mut waiting = Vec::new();
        for (i, (n, _)) in members.iter().enumerate() {
            let s = n.status().borrow().clone();
            if !s.ready {
                waiting.push(format!("{:?}", s.readyz_line()));
            } else if held_when_ready[i].is_none() {
                held_when_ready[i] = Some(s.reserved.len());
            }
        }
        if waiting.is_empty() {
            break;
        }
        assert!(
            Instant::now() < back_by,
            "members not ready {BACK_WITHIN:?} after a router was: {waiting:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (n, _) in &members {
        let text = http_get(n.metrics_addr().expect("metrics addr"), "/metrics")
            .await
            .1;
        assert_eq!(
            agentmesh_testkit::metric(&text, REJOIN_SPREAD),
            1.0,
            "one rejoin spread per member: {text}"
        );
    }
    if rejoin_spread > BACK_WITHIN {
        // The other router waits for the hour's draw: one router each.
        assert!(
            held_when_ready.iter().all(|h| *h == Some(1)),
            "routers held when ready again: {held_when_ready:?}"
        );
    } else {
        on_all(
            &members,
            &again,
            "every member back on both restarted routers",
        )
        .await;
    }

    for (n, _dir) in members {
        n.shutdown().await;
    }
    cp.handle.shutdown().await;
}

/// Waits (`what`) until every member is ready and reserved on every one
/// of `routers`.
async fn on_all(members: &[(NodeHandle, tempfile::TempDir)], routers: &[PeerId], what: &str) {
    eventually(what, || async {
        members
            .iter()
            .all(|(n, _)| {
                let s = n.status().borrow().clone();
                s.ready && routers.iter().all(|r| s.reserved.contains(r))
            })
            .then_some(())
    })
    .await;
}

/// The member's count of attaches put off after a rejoin.
const REJOIN_SPREAD: &str = r#"agentmesh_node_router_attaches_spread_total{reason="rejoin"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_back_within_seconds_on_one_router_after_every_router_restarts_with_its_key() {
    members_return_after_every_router_restarts(true, Duration::from_secs(3600)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_back_within_seconds_after_every_router_restarts_under_a_new_peer_id() {
    members_return_after_every_router_restarts(false, Duration::from_secs(1)).await;
}
