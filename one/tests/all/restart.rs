//! Restarting the real `agentmesh-one` binary under members started
//! outside it (node values with the default 300 s directory interval): its
//! routers drain (go-away DRAINING asks members to stay away 300 s), the
//! process exits, and the same command starts it again on the same ports
//! and data dir (routers keep their keys: same PeerIds). Members must be
//! ready again within seconds of the first router being ready, then on
//! K = 2; before, they stayed away 6 min 09 s (the shun, then the
//! interval). Waits are on conditions with deadlines; the one on readiness
//! after the restart (20 s) catches the old 300 s.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentmesh_node::{Config, NodeHandle};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Generous: a cold, loaded CI machine starts the mesh slowly.
const DEADLINE: Duration = Duration::from_secs(60);
/// Longest a member may take to be ready after the first router is.
const BACK_WITHIN: Duration = Duration::from_secs(20);
const MEMBERS: usize = 2;

fn bindable(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free loopback port `p` with `p + 1` free too (router i uses base + i).
fn free_pair() -> u16 {
    for _ in 0..100 {
        let p = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        if p < u16::MAX && bindable(p + 1) {
            return p;
        }
    }
    panic!("no two consecutive free ports");
}

/// The ports one `agentmesh-one` runs on, kept across its restart.
struct Ports {
    grpc: u16,
    http: u16,
    routers: u16,
    metrics: u16,
}

/// What the banner says.
struct Banner {
    control_plane: String,
    token_file: String,
}

/// Starts `agentmesh-one` with two routers on `ports`, data in `dir`;
/// returns once its banner is out (stdout and stderr drained meanwhile).
async fn start_one(dir: &Path, ports: &Ports) -> (Child, Banner) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh-one"))
        .arg("--data-dir")
        .arg(dir)
        .args(["--routers", "2"])
        .args(["--grpc-addr", &format!("127.0.0.1:{}", ports.grpc)])
        .args(["--http-addr", &format!("127.0.0.1:{}", ports.http)])
        .args(["--router-base-port", &ports.routers.to_string()])
        .args(["--router-metrics-base-port", &ports.metrics.to_string()])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start agentmesh-one");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut control_plane, mut token_file) = (None, None);
    tokio::time::timeout(DEADLINE, async {
        while let Some(l) = stdout.next_line().await.expect("stdout") {
            if let Some(rest) = l.strip_prefix("control plane") {
                control_plane = rest.split_whitespace().next().map(str::to_string);
            }
            if let Some(rest) = l.strip_prefix("member token") {
                token_file = Some(rest.trim().to_string());
            }
            if l.starts_with("join with") {
                return;
            }
        }
        panic!("agentmesh-one exited before printing its banner");
    })
    .await
    .expect("banner within the deadline");
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = stdout.into_inner().read_to_end(&mut sink).await;
    });
    let mut stderr = child.stderr.take().expect("stderr");
    tokio::spawn(async move {
        let mut sink = Vec::new();
        let _ = stderr.read_to_end(&mut sink).await;
    });
    let banner = Banner {
        control_plane: control_plane.expect("control plane in the banner"),
        token_file: token_file.expect("member token in the banner"),
    };
    (child, banner)
}

async fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("pid").to_string();
    let sent = Command::new("kill")
        .args([sig, &pid])
        .status()
        .await
        .expect("kill");
    assert!(sent.success());
}

/// Whether a router's /readyz (on its metrics listener) answers 200.
async fn router_ready(addr: SocketAddr) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
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

/// Waits until `done` holds for every member, up to `limit`; the panic
/// shows what the members say.
async fn members_until(
    members: &[(NodeHandle, tempfile::TempDir)],
    what: &str,
    limit: Instant,
    done: impl Fn(&agentmesh_node::NodeStatus) -> bool,
) {
    loop {
        let waiting: Vec<String> = members
            .iter()
            .map(|(n, _)| n.status().borrow().clone())
            .filter(|s| !done(s))
            .map(|s| s.readyz_line())
            .collect();
        if waiting.is_empty() {
            return;
        }
        assert!(Instant::now() < limit, "{what}: {waiting:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_outside_are_back_within_seconds_after_agentmesh_one_restarts() {
    agentmesh_testkit::init_tracing("agentmesh_node=info");
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = Ports {
        grpc: free_pair(),
        http: free_pair(),
        routers: free_pair(),
        metrics: free_pair(),
    };
    let (mut one, banner) = start_one(dir.path(), &ports).await;
    let token = std::fs::read_to_string(&banner.token_file).expect("token file");
    let mut members = Vec::new();
    for i in 0..MEMBERS {
        let data = tempfile::tempdir().expect("tempdir");
        let node = agentmesh_node::spawn(
            Config {
                data_dir: data.path().to_path_buf(),
                control_plane: agentmesh_node::config::ControlPlaneConfig {
                    url: banner.control_plane.clone(),
                    token: token.trim().to_string(),
                    ..Default::default()
                },
                routers: agentmesh_node::config::RoutersConfig {
                    count: 2,
                    ..Default::default()
                },
                local: agentmesh_node::config::LocalConfig {
                    no_socket: true,
                    ..Default::default()
                },
                ..Config::default()
            },
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("member {i}: {e}"));
        members.push((node, data));
    }
    members_until(
        &members,
        "members on both routers",
        Instant::now() + DEADLINE,
        |s| s.ready && s.reserved.len() == 2,
    )
    .await;

    // The restart: SIGTERM drains both routers (go-away DRAINING to every
    // member; they have nowhere to go, so they keep the leaving routers
    // until closed). Once every member was told, a second SIGTERM ends the
    // wait for the drain's grace (30 s) as an impatient operator does;
    // the members are left exactly as after the whole grace: shunned for
    // the go-away's 300 s, with no router.
    signal(&one, "-TERM").await;
    members_until(
        &members,
        "members told to go away by both routers",
        Instant::now() + DEADLINE,
        |s| s.leaving.len() == 2,
    )
    .await;
    signal(&one, "-TERM").await;
    let exit = tokio::time::timeout(DEADLINE, one.wait())
        .await
        .expect("agentmesh-one stops")
        .expect("wait");
    assert!(exit.success(), "{exit}");
    members_until(
        &members,
        "members without a router",
        Instant::now() + DEADLINE,
        |s| !s.ready && s.reserved.is_empty(),
    )
    .await;

    let (_again, _) = start_one(dir.path(), &ports).await;
    let metrics: Vec<SocketAddr> = (0..2)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], ports.metrics + i)))
        .collect();
    let end = Instant::now() + DEADLINE;
    let first_ready = 'wait: loop {
        for m in &metrics {
            if router_ready(*m).await {
                break 'wait Instant::now();
            }
        }
        assert!(Instant::now() < end, "no router ready after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    members_until(
        &members,
        "members not ready 20 s after a router was",
        first_ready + BACK_WITHIN,
        |s| s.ready,
    )
    .await;
    members_until(
        &members,
        "members not back on both routers",
        Instant::now() + DEADLINE,
        |s| s.ready && s.reserved.len() == 2,
    )
    .await;
    for (n, _data) in members {
        n.shutdown().await;
    }
}
