//! Helpers shared by the integration tests: start a real control plane on
//! loopback with a real SQLite file, raw HTTP GETs, metric parsing.
#![allow(dead_code, unreachable_pub)]

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use agentmesh_controlplane::{Client, ClientConfig, Config, Handle, spawn};
use agentmesh_proto::pb::credential::{Role, TokenKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ADMIN: &str = "test-admin-token-0123456789";

pub fn config(dir: &Path) -> Config {
    Config {
        admin_token: Some(ADMIN.into()),
        ..Config::ephemeral(&dir.join("cp.db"))
    }
}

pub async fn start(dir: &Path) -> Handle {
    spawn(config(dir)).await.expect("control plane starts")
}

/// A raw gRPC client whose connection comes from `ip` (any 127.x.y.z is
/// local on loopback), to act as a second source for per-IP limits.
pub async fn raw_client_from(
    h: &Handle,
    ip: [u8; 4],
) -> agentmesh_proto::pb::controlplane::control_plane_client::ControlPlaneClient<
    tonic::transport::Channel,
> {
    let ch = tonic::transport::Endpoint::from_shared(h.public_url().to_string())
        .expect("url")
        .local_address(Some(std::net::IpAddr::from(ip)))
        .connect_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect from a second loopback address");
    agentmesh_proto::pb::controlplane::control_plane_client::ControlPlaneClient::new(ch)
}

/// A client with a short budget: tests that expect refusals get them fast.
pub fn client(h: &Handle) -> Client {
    Client::new(ClientConfig {
        url: h.public_url().to_string(),
        retry_budget: Duration::from_secs(20),
        rpc_timeout: Duration::from_secs(10),
        ca_pem: None,
    })
    .expect("client config")
}

pub async fn token(
    h: &Handle,
    kind: TokenKind,
    role: Role,
    labels: &[(&str, &str)],
    uses: u32,
) -> String {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    h.create_token(kind, role, labels, uses, Duration::from_secs(3600))
        .await
        .expect("token minted")
}

/// `GET path` over a raw HTTP/1.1 connection; returns (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect http");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
        .await
        .expect("http answer within 30 s")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample whose name and labels start with `prefix`
/// (e.g. `agentmesh_control_plane_deleted_total{table="nodes",reason="lapsed"}`).
pub fn metric(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub async fn metrics(h: &Handle) -> String {
    let (status, body) = http_get(h.http_addr(), "/metrics").await;
    assert_eq!(status, 200);
    body
}

/// Runs SQL against the control plane's database file (as an operator or a
/// clock in the future would see it).
pub fn sql(dir: &Path, stmt: &str) -> usize {
    let c = rusqlite::Connection::open(dir.join("cp.db")).expect("open db");
    c.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    c.execute(stmt, []).expect("sql runs")
}

pub fn sql_count(dir: &Path, stmt: &str) -> i64 {
    let c = rusqlite::Connection::open(dir.join("cp.db")).expect("open db");
    c.query_row(stmt, [], |r| r.get(0)).expect("count")
}

/// The real `agentmesh-control-plane` binary, serving.
pub struct Served {
    /// The process (killed when dropped).
    pub child: tokio::process::Child,
    /// The URL its log names (`public_url=`): what clients dial and proofs sign.
    pub url: String,
    /// Its HTTP listener (`/metrics`, `/readyz`).
    pub http_addr: SocketAddr,
}

/// Starts the real binary with `args` (which should bind port 0) and waits,
/// at most 60 s, for the log line naming its addresses.
pub async fn serve_binary(args: &[&str]) -> Served {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentmesh-control-plane"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let (url, http_addr) = tokio::time::timeout(Duration::from_secs(60), async {
        let after = |line: &str, key: &str| {
            line.split(key)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
        };
        while let Some(line) = lines.next_line().await.expect("read log") {
            if let (Some(url), Some(http)) =
                (after(&line, "public_url="), after(&line, "http_addr="))
            {
                return (url, http.parse::<SocketAddr>().expect("http_addr"));
            }
        }
        panic!("control plane exited before logging its address");
    })
    .await
    .expect("started within 60 s");
    // Keep reading its log so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Served {
        child,
        url,
        http_addr,
    }
}
