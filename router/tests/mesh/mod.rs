//! Shared by the go-away and drain tests: a real control plane, routers
//! started with `spawn` (labelled `tier=mesh`), nodes with their metrics in
//! one registry, an echo backend and a checked echo call.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use agentmesh_router::{Config, RouterHandle};
use libp2p::PeerId;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

pub(crate) use crate::support::cp::{Cp, start_cp};
use crate::support::{DEADLINE, metric};

/// Attempts of one call during a drain (each a fresh lookup and route).
pub(crate) const CALL_ATTEMPTS: usize = 3;

pub(crate) struct Router {
    pub(crate) handle: RouterHandle,
    _dir: tempfile::TempDir,
}

impl Router {
    pub(crate) fn id(&self) -> PeerId {
        self.handle.peer_id()
    }
    pub(crate) fn metric(&self, series: &str) -> f64 {
        metric(&self.handle.metrics_text(), series)
    }
    pub(crate) fn goaways(&self, reason: &str, result: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_goaway_sent_total{{reason=\"{reason}\",result=\"{result}\"}}"
        ))
    }
    pub(crate) fn trimmed(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_trimmed_total{{reason=\"{reason}\"}}"
        ))
    }
    pub(crate) fn attached(&self) -> f64 {
        self.metric("agentmesh_router_attached_members")
    }
}

/// A router labelled `name=NAME,tier=mesh`, leasing every second.
pub(crate) async fn start_router(cp: &Cp, name: &str, adjust: impl FnOnce(&mut Config)) -> Router {
    let dir = tempfile::tempdir().expect("tempdir");
    let labels: BTreeMap<String, String> = [
        ("name".to_string(), name.to_string()),
        ("tier".to_string(), "mesh".to_string()),
    ]
    .into();
    let mut config = Config {
        control_plane: cp.url.clone(),
        token: cp.token_labelled(Role::Router, &labels).await,
        key_path: dir.path().join("router.key"),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
        labels,
        metrics_addr: Some("127.0.0.1:0".parse().expect("addr")),
        lease_interval: Duration::from_secs(1),
        clock_skew: Duration::ZERO,
        ..Default::default()
    };
    adjust(&mut config);
    let handle = agentmesh_router::spawn(config).await.expect("router");
    let mut ready = handle.ready();
    tokio::time::timeout(DEADLINE, ready.wait_for(|r| *r))
        .await
        .expect("router ready in time")
        .expect("ready channel");
    Router { handle, _dir: dir }
}

pub(crate) fn selector(k: &str, v: &str) -> BTreeMap<String, String> {
    [(k.to_string(), v.to_string())].into()
}

/// A node with K = `routers`, selecting routers by `selector`, its metrics
/// in `registry` under the label `member=NAME`.
pub(crate) async fn start_node(
    cp: &Cp,
    dir: &Path,
    registry: &mut Registry,
    name: &str,
    routers: usize,
    selector: BTreeMap<String, String>,
    expose: Vec<(String, SocketAddr)>,
) -> NodeHandle {
    let token = cp.token(Role::Member).await;
    let sub = registry.sub_registry_with_label(("member".into(), name.to_string().into()));
    agentmesh_node::spawn(
        agentmesh_node::Config {
            control_plane: cp.url.clone(),
            token,
            data_dir: dir.to_path_buf(),
            routers,
            router_selector: selector,
            expose,
            directory_interval_secs: 1,
            no_socket: true,
            metrics_addr: None,
            ..agentmesh_node::Config::default()
        },
        Some(sub),
    )
    .await
    .expect("spawn node")
}

pub(crate) fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    text
}

/// Go-aways a node counted with `result`, from the shared registry's text.
pub(crate) fn node_goaways(text: &str, member: &str, result: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("agentmesh_node_goaways_total{"))
        .filter(|l| l.contains(&format!("result=\"{result}\"")))
        .filter(|l| l.contains(&format!("member=\"{member}\"")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

pub(crate) async fn echo_backend() -> SocketAddr {
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

/// One call to `service` echoing `payload`; the error says what failed.
pub(crate) async fn call_echo(
    node: &NodeHandle,
    service: &str,
    payload: &[u8],
) -> Result<(), String> {
    let stream = node.call(service).await.map_err(|e| e.to_string())?;
    let (mut r, mut w) = tokio::io::split(stream);
    let send = async {
        w.write_all(payload).await?;
        w.shutdown().await
    };
    let recv = async {
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.map(|_| back)
    };
    let deadline = Duration::from_secs(30);
    let (sent, back) = tokio::time::timeout(deadline, async { tokio::join!(send, recv) })
        .await
        .map_err(|_| "echo did not finish".to_string())?;
    sent.map_err(|e| format!("write: {e}"))?;
    let back = back.map_err(|e| format!("read: {e}"))?;
    if back != payload {
        return Err(format!("echo came back different ({} bytes)", back.len()));
    }
    Ok(())
}
