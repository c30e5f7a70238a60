//! Test harness: a real control plane (SQLite in a temp dir), real routers
//! and nodes started with `spawn`, an echo backend, and a raw libp2p peer
//! that speaks the protocols by hand (to present bad credentials).

#![allow(dead_code, unreachable_pub)]

mod raw;
#[allow(unused_imports)]
pub use raw::RawPeer;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_node::{Config, NodeHandle};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Label, Role, TokenKind};
use agentmesh_router::RouterHandle;
use rand::RngCore as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

pub const ADMIN: &str = "test-admin-token-0123456789abcdef";
pub const DEADLINE: Duration = Duration::from_secs(60);

pub struct Cp {
    pub handle: agentmesh_controlplane::Handle,
    pub url: String,
    pub client: Client,
    _dir: tempfile::TempDir,
}

pub async fn start_cp() -> Cp {
    start_cp_with(agentmesh_controlplane::Config::default()).await
}

/// A control plane with `base`'s settings (addresses, database and admin token are the test's).
pub async fn start_cp_with(base: agentmesh_controlplane::Config) -> Cp {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = agentmesh_controlplane::Config {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: format!("sqlite://{}", dir.path().join("cp.db").display()),
        admin_token: Some(ADMIN.to_string()),
        ..base
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
        handle,
        url,
        client,
        _dir: dir,
    }
}

impl Cp {
    pub async fn token(&self, role: Role, labels: &[(&str, &str)]) -> String {
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

pub struct Router {
    pub handle: RouterHandle,
    _dir: tempfile::TempDir,
}

pub async fn start_router(cp: &Cp, name: &str) -> Router {
    start_router_with(cp, name, Duration::from_secs(1)).await
}

/// A router labelled `name=NAME` leasing (and reading the directory) every `lease_interval`.
pub async fn start_router_with(cp: &Cp, name: &str, lease_interval: Duration) -> Router {
    start_router_on(cp, name, lease_interval, "/ip4/127.0.0.1/tcp/0").await
}

/// A router listening on `listen` only.
pub async fn start_router_on(
    cp: &Cp,
    name: &str,
    lease_interval: Duration,
    listen: &str,
) -> Router {
    start_router_tweaked(cp, name, lease_interval, listen, |_| {}).await
}

/// A router as [`start_router_on`], its config changed by `tweak` before spawning.
pub async fn start_router_tweaked(
    cp: &Cp,
    name: &str,
    lease_interval: Duration,
    listen: &str,
    tweak: impl FnOnce(&mut agentmesh_router::Config),
) -> Router {
    let dir = tempfile::tempdir().expect("tempdir");
    let labels: BTreeMap<String, String> = [("name".to_string(), name.to_string())].into();
    let config = agentmesh_router::Config {
        control_plane: cp.url.clone(),
        token: cp.token(Role::Router, &[("name", name)]).await,
        key_path: dir.path().join("router.key"),
        listen: vec![listen.parse().expect("addr")],
        labels,
        lease_interval,
        clock_skew: Duration::ZERO,
        ..Default::default()
    };
    let mut config = config;
    tweak(&mut config);
    let handle = agentmesh_router::spawn(config).await.expect("router");
    let mut ready = handle.ready();
    tokio::time::timeout(DEADLINE, ready.wait_for(|r| *r))
        .await
        .expect("router ready in time")
        .expect("ready channel");
    Router { handle, _dir: dir }
}

/// A TCP echo backend on 127.0.0.1:0.
pub async fn echo_backend() -> SocketAddr {
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

pub fn node_config(cp: &Cp, token: &str, dir: &Path) -> Config {
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

pub fn selector(name: &str) -> BTreeMap<String, String> {
    [("name".to_string(), name.to_string())].into()
}

pub async fn ready(node: &NodeHandle, what: &str) {
    assert!(
        node.wait_ready(DEADLINE).await,
        "{what} not ready: {:?}",
        node.status().borrow()
    );
}

/// Calls until a provider is found (the routers' DHT needs a moment to
/// learn a new record), up to the deadline.
pub async fn call_until_found(node: &NodeHandle, service: &str) -> agentmesh_node::CallStream {
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

pub async fn round_trip(stream: &mut agentmesh_node::CallStream, len: usize) {
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

pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
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

pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == series).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// GETs /readyz over the node's Unix socket; `None` if it cannot connect yet.
pub async fn socket_readyz(path: &Path) -> Option<String> {
    let mut u = tokio::net::UnixStream::connect(path).await.ok()?;
    u.write_all(b"GET /readyz HTTP/1.1\r\n\r\n").await.ok()?;
    let mut out = String::new();
    u.read_to_string(&mut out).await.ok()?;
    Some(out)
}
