//! Nodes in a real mesh on loopback: a real control plane (SQLite in a temp
//! dir), real routers started with `spawn`, nodes started with `spawn`.
//! Waits are on conditions with a generous deadline, never on sleeps.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_node::{CallError, Config, NodeHandle};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Label, Role, TokenKind};
use agentmesh_router::RouterHandle;
use rand::RngCore as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

const ADMIN: &str = "test-admin-token-0123456789abcdef";
const DEADLINE: Duration = Duration::from_secs(60);

struct Cp {
    _handle: agentmesh_controlplane::Handle,
    url: String,
    client: Client,
    _dir: tempfile::TempDir,
}

async fn start_cp() -> Cp {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = agentmesh_controlplane::Config {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: format!("sqlite://{}", dir.path().join("cp.db").display()),
        admin_token: Some(ADMIN.to_string()),
        ..Default::default()
    };
    let handle = agentmesh_controlplane::spawn(config)
        .await
        .expect("control plane");
    let url = format!("http://{}", handle.grpc_addr());
    let client = Client::new(ClientConfig {
        url: url.clone(),
        ca_pem: None,
        retry_budget: Duration::from_secs(30),
        rpc_timeout: Duration::from_secs(10),
    })
    .expect("client");
    Cp {
        _handle: handle,
        url,
        client,
        _dir: dir,
    }
}

impl Cp {
    async fn token(&self, role: Role, labels: &[(&str, &str)]) -> String {
        self.client
            .create_token(
                ADMIN,
                CreateTokenRequest {
                    kind: TokenKind::Bootstrap as i32,
                    role: role as i32,
                    labels: labels
                        .iter()
                        .map(|(k, v)| Label {
                            key: k.to_string(),
                            value: v.to_string(),
                        })
                        .collect(),
                    max_uses: 100,
                    ttl_secs: 3600,
                },
            )
            .await
            .expect("create token")
            .token
    }
}

struct Router {
    handle: RouterHandle,
    _dir: tempfile::TempDir,
}

async fn start_router(cp: &Cp, name: &str) -> Router {
    let dir = tempfile::tempdir().expect("tempdir");
    let labels: BTreeMap<String, String> = [("name".to_string(), name.to_string())].into();
    let config = agentmesh_router::Config {
        control_plane: cp.url.clone(),
        token: cp.token(Role::Router, &[("name", name)]).await,
        key_path: dir.path().join("router.key"),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
        labels,
        lease_interval: Duration::from_secs(1),
        ..Default::default()
    };
    let handle = agentmesh_router::spawn(config).await.expect("router");
    let mut ready = handle.ready();
    tokio::time::timeout(DEADLINE, ready.wait_for(|r| *r))
        .await
        .expect("router ready in time")
        .expect("ready channel");
    Router { handle, _dir: dir }
}

/// A TCP echo backend on 127.0.0.1:0.
async fn echo_backend() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

fn node_config(cp: &Cp, token: &str, dir: &Path) -> Config {
    Config {
        control_plane: cp.url.clone(),
        token: token.to_string(),
        data_dir: dir.to_path_buf(),
        routers: 1,
        directory_interval_secs: 1,
        metrics_addr: Some("127.0.0.1:0".parse().expect("addr")),
        ..Config::default()
    }
}

fn selector(name: &str) -> BTreeMap<String, String> {
    [("name".to_string(), name.to_string())].into()
}

async fn ready(node: &NodeHandle, what: &str) {
    assert!(
        node.wait_ready(DEADLINE).await,
        "{what} not ready: {:?}",
        node.status().borrow()
    );
}

/// Calls until a provider is found (the routers' DHT needs a moment to
/// learn a new record), up to the deadline.
async fn call_until_found(node: &NodeHandle, service: &str) -> agentmesh_node::CallStream {
    let end = Instant::now() + DEADLINE;
    loop {
        match node.call(service).await {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < end, "call {service} never succeeded: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn round_trip(stream: &mut agentmesh_node::CallStream, len: usize) {
    let mut payload = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut payload);
    let (mut r, mut w) = tokio::io::split(stream);
    let send = async {
        w.write_all(&payload).await.expect("write");
        w.shutdown().await.expect("half-close");
    };
    let recv = async {
        let mut back = Vec::with_capacity(len);
        r.read_to_end(&mut back).await.expect("read");
        back
    };
    let ((), back) = tokio::join!(send, recv);
    assert_eq!(back.len(), payload.len(), "echo length");
    assert!(back == payload, "echo came back different");
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == series).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_on_r1_calls_b_on_r2_through_transit_and_a_relay() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let member = cp.token(Role::Member, &[]).await;
    let backend = echo_backend().await;

    let bdir = tempfile::tempdir().expect("tempdir");
    let b = agentmesh_node::spawn(
        Config {
            router_selector: selector("r2"),
            expose: vec![("echo".into(), backend), ("secret".into(), backend)],
            allow: vec!["secret=label:team=x".parse().expect("rule")],
            ..node_config(&cp, &member, bdir.path())
        },
        None,
    )
    .await
    .expect("spawn b");
    let adir = tempfile::tempdir().expect("tempdir");
    let a = agentmesh_node::spawn(
        Config {
            router_selector: selector("r1"),
            forward: vec![("127.0.0.1:0".parse().expect("addr"), "echo".into())],
            ..node_config(&cp, &member, adir.path())
        },
        None,
    )
    .await
    .expect("spawn a");
    ready(&b, "b").await;
    ready(&a, "a").await;
    assert_eq!(a.status().borrow().reserved, vec![r1.handle.peer_id()]);
    assert_eq!(b.status().borrow().reserved, vec![r2.handle.peer_id()]);

    // A shares no router with B: transit to R2, circuit through R2.
    let mut s = call_until_found(&a, "echo").await;
    assert_eq!(s.route().provider, b.peer_id());
    assert_eq!(s.route().via_router, r2.handle.peer_id());
    assert!(s.route().transit, "route: {:?}", s.route());
    round_trip(&mut s, 1 << 20).await;
    drop(s);

    // The allow rule refuses A (no team=x label), with a reason.
    match a.call("secret").await {
        Err(e @ CallError::Failed { refused: true, .. }) => {
            assert!(e.to_string().contains("NOT_ALLOWED"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Nobody provides this one.
    assert!(matches!(
        a.call("nope").await,
        Err(CallError::NoProviders(_))
    ));

    // --forward: a local TCP connection becomes a call.
    let mut t = tokio::net::TcpStream::connect(a.forward_addrs()[0])
        .await
        .expect("forward");
    t.write_all(b"through the forward\n").await.expect("write");
    let mut line = String::new();
    tokio::io::BufReader::new(&mut t)
        .read_line(&mut line)
        .await
        .expect("read");
    assert_eq!(line, "through the forward\n");
    drop(t);

    // The Unix socket: readiness and a call.
    let sock = a.socket_path().expect("socket").to_path_buf();
    let mut u = tokio::net::UnixStream::connect(&sock).await.expect("unix");
    u.write_all(b"GET /readyz HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    let mut out = String::new();
    u.read_to_string(&mut out).await.expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let mut u = tokio::net::UnixStream::connect(&sock).await.expect("unix");
    u.write_all(b"CALL echo\nhello over the socket")
        .await
        .expect("write");
    u.shutdown().await.expect("half-close");
    let mut out = String::new();
    u.read_to_string(&mut out).await.expect("read");
    assert_eq!(out, "OK\nhello over the socket");

    // Metrics and /readyz over HTTP.
    let (code, body) = http_get(a.metrics_addr().expect("metrics"), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    let (_, am) = http_get(a.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &am,
            r#"agentmesh_node_calls_total{direction="outbound",result="ok"}"#
        ) >= 3.0,
        "{am}"
    );
    assert_eq!(
        metric(
            &am,
            r#"agentmesh_node_calls_total{direction="outbound",result="refused"}"#
        ),
        1.0
    );
    assert_eq!(metric(&am, "agentmesh_node_routers_attached"), 1.0);
    let (_, bm) = http_get(b.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &bm,
            r#"agentmesh_node_calls_total{direction="inbound",result="accepted"}"#
        ) >= 3.0,
        "{bm}"
    );
    assert_eq!(
        metric(
            &bm,
            r#"agentmesh_node_calls_total{direction="inbound",result="not_allowed"}"#
        ),
        1.0
    );
    assert!(
        metric(
            &bm,
            r#"agentmesh_node_call_bytes_total{direction="received"}"#
        ) >= f64::from(1u32 << 20)
    );

    // A member sharing B's router calls without transit.
    let cdir = tempfile::tempdir().expect("tempdir");
    let c = agentmesh_node::spawn(
        Config {
            router_selector: selector("r2"),
            ..node_config(&cp, &member, cdir.path())
        },
        None,
    )
    .await
    .expect("spawn c");
    ready(&c, "c").await;
    let mut s = call_until_found(&c, "echo").await;
    assert!(!s.route().transit, "route: {:?}", s.route());
    assert_eq!(s.route().via_router, r2.handle.peer_id());
    round_trip(&mut s, 4096).await;
    drop(s);

    // Restart A with the same data dir and no token: same identity, no
    // re-enrollment (it could not enroll without a token), ready again.
    let a_id = a.peer_id();
    a.shutdown().await;
    let a2 = agentmesh_node::spawn(
        Config {
            router_selector: selector("r1"),
            ..node_config(&cp, "", adir.path())
        },
        None,
    )
    .await
    .expect("restart a");
    assert_eq!(a2.peer_id(), a_id);
    ready(&a2, "a restarted").await;
    let mut s = call_until_found(&a2, "echo").await;
    round_trip(&mut s, 1024).await;
    drop(s);

    a2.shutdown().await;
    c.shutdown().await;
    b.shutdown().await;
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_router_dies_reattaches_elsewhere() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let member = cp.token(Role::Member, &[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let n = agentmesh_node::spawn(node_config(&cp, &member, dir.path()), None)
        .await
        .expect("spawn");
    ready(&n, "n").await;
    let first = n.status().borrow().reserved[0];
    let (dead, alive) = if first == r1.handle.peer_id() {
        (r1, r2)
    } else {
        (r2, r1)
    };
    let alive_id = alive.handle.peer_id();
    dead.handle.shutdown().await;
    let mut st = n.status();
    tokio::time::timeout(
        DEADLINE,
        st.wait_for(|s| s.ready && s.reserved == vec![alive_id]),
    )
    .await
    .unwrap_or_else(|_| panic!("never re-attached: {:?}", n.status().borrow()))
    .expect("status");
    n.shutdown().await;
    alive.handle.shutdown().await;
}

/// GETs /readyz over the node's Unix socket; `None` if it cannot connect yet.
async fn socket_readyz(path: &Path) -> Option<String> {
    let mut u = tokio::net::UnixStream::connect(path).await.ok()?;
    u.write_all(b"GET /readyz HTTP/1.1\r\n\r\n").await.ok()?;
    let mut out = String::new();
    u.read_to_string(&mut out).await.ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_run_a_node_and_call_through_its_socket() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member, &[]).await;
    let backend = echo_backend().await;
    let bdir = tempfile::tempdir().expect("tempdir");
    let b = agentmesh_node::spawn(
        Config {
            expose: vec![("echo".into(), backend)],
            ..node_config(&cp, &member, bdir.path())
        },
        None,
    )
    .await
    .expect("spawn b");
    ready(&b, "b").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    tokio::fs::write(&token_file, format!("{member}\n"))
        .await
        .expect("token file");
    let data = dir.path().join("data");
    let exe = env!("CARGO_BIN_EXE_agentmesh-node");
    let mut node = tokio::process::Command::new(exe)
        .args([
            "run",
            "--control-plane",
            &cp.url,
            "--routers",
            "1",
            "--directory-interval-secs",
            "1",
        ])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--data-dir")
        .arg(&data)
        .kill_on_drop(true)
        .spawn()
        .expect("run the node binary");
    let sock = data.join(agentmesh_node::config::SOCKET_FILE);
    let end = Instant::now() + DEADLINE;
    loop {
        if socket_readyz(&sock)
            .await
            .is_some_and(|out| out.starts_with("HTTP/1.1 200"))
        {
            break;
        }
        assert!(Instant::now() < end, "node binary never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `agentmesh-node call echo`: stdin to the service, the answer on stdout.
    let end = Instant::now() + DEADLINE;
    loop {
        let mut call = tokio::process::Command::new(exe)
            .args(["call", "echo", "--data-dir"])
            .arg(&data)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run call");
        let mut stdin = call.stdin.take().expect("stdin");
        stdin.write_all(b"hello from stdin\n").await.expect("stdin");
        drop(stdin);
        let out = call.wait_with_output().await.expect("call output");
        if out.status.success() {
            assert_eq!(out.stdout, b"hello from stdin\n");
            break;
        }
        // The routers' DHT may not know the record yet: retry until the deadline.
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(Instant::now() < end, "call never succeeded: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // SIGTERM: graceful stop, exit status 0, socket removed.
    let pid = node.id().expect("pid").to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(DEADLINE, node.wait())
        .await
        .expect("node exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status}");
    assert!(!sock.exists(), "socket left behind");

    b.shutdown().await;
    r.handle.shutdown().await;
}
