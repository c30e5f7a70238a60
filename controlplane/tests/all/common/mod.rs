//! Helpers shared by the integration tests: a database on either backend
//! and one test body run on both ([`backend`], [`on_both!`]), the real
//! binary ([`binary`]), a real control plane on loopback, raw HTTP GETs,
//! metric parsing.
#![allow(dead_code, unreachable_pub)]

#[macro_use]
pub mod backend;
pub mod binary;
pub mod watcher;

pub use backend::{Backend, TestDb};

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use agentmesh_controlplane::{Client, ClientConfig, Config, Handle, spawn};
use agentmesh_proto::pb::credential::{Role, TokenKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ADMIN: &str = "test-admin-token-0123456789";

/// A control plane on a SQLite file in `dir`, for the tests that run on
/// SQLite only (see [`TestDb::config`] for the others), with the allow-all
/// policy (the policy tests choose their own).
pub fn config(dir: &Path) -> Config {
    Config {
        admin_token: Some(ADMIN.into()),
        policy_allow_all: true,
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
    client_at(h.public_url())
}

/// [`client`] for a control plane at `url` (a real binary's).
pub fn client_at(url: &str) -> Client {
    Client::new(ClientConfig {
        url: url.to_string(),
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
