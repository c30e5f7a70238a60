//! Shared by the go-away and drain tests: a real control plane, routers
//! started with `spawn` (labelled `tier=mesh`), nodes with their metrics in
//! one registry, an echo backend and a checked echo call.

#![allow(dead_code, unused_imports)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use agentmesh_node::NodeHandle;
use agentmesh_proto::pb::credential::Role;
use agentmesh_router::Config;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

pub(crate) use super::support::cp::{Cp, start_cp};
pub(crate) use agentmesh_testkit::{TestRouter, echo_backend};

/// Attempts of one call during a drain (each a fresh lookup and route).
pub(crate) const CALL_ATTEMPTS: usize = 3;

/// The routers of these tests (see [`TestRouter`]).
pub(crate) type Router = TestRouter;

/// The router metrics the go-away and drain tests read.
pub(crate) trait MeshMetrics {
    /// Go-aways sent with `reason` and `result`.
    fn goaways(&self, reason: &str, result: &str) -> f64;
    /// Members trimmed for `reason`.
    fn trimmed(&self, reason: &str) -> f64;
    /// Members attached now.
    fn attached(&self) -> f64;
}

impl MeshMetrics for TestRouter {
    fn goaways(&self, reason: &str, result: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_goaway_sent_total{{reason=\"{reason}\",result=\"{result}\"}}"
        ))
    }
    fn trimmed(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_trimmed_total{{reason=\"{reason}\"}}"
        ))
    }
    fn attached(&self) -> f64 {
        self.metric("agentmesh_router_attached_members")
    }
}

/// A router labelled `name=NAME,tier=mesh`, leasing every second, with
/// its metrics endpoint on.
pub(crate) async fn start_router(cp: &Cp, name: &str, adjust: impl FnOnce(&mut Config)) -> Router {
    TestRouter::start(cp, &[("name", name), ("tier", "mesh")], |c| {
        c.metrics_addr = Some("127.0.0.1:0".parse().expect("addr"));
        adjust(c);
    })
    .await
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
    start_node_with(cp, dir, registry, name, |c| {
        c.routers.count = routers;
        c.routers.selector = selector;
        c.services.expose = expose;
    })
    .await
}

/// A node with the config of these tests changed by `adjust`, its metrics
/// in `registry` under the label `member=NAME`.
pub(crate) async fn start_node_with(
    cp: &Cp,
    dir: &Path,
    registry: &mut Registry,
    name: &str,
    adjust: impl FnOnce(&mut agentmesh_node::Config),
) -> NodeHandle {
    let token = cp.token(Role::Member).await;
    let sub = registry.sub_registry_with_label(("member".into(), name.to_string().into()));
    let mut config = agentmesh_node::Config {
        data_dir: dir.to_path_buf(),
        metrics_addr: None,
        control_plane: agentmesh_node::config::ControlPlaneConfig {
            url: cp.url.clone(),
            token,
            directory_interval: Duration::from_secs(1),
            ..Default::default()
        },
        local: agentmesh_node::config::LocalConfig {
            no_socket: true,
            ..Default::default()
        },
        ..agentmesh_node::Config::default()
    };
    adjust(&mut config);
    agentmesh_node::spawn(config, Some(sub))
        .await
        .expect("spawn node")
}

/// Waits until every node is ready and reserved on at least `k` routers.
pub(crate) async fn on_k_routers(nodes: &[NodeHandle], k: usize) {
    super::support::eventually("every node reserved on K routers", || async {
        nodes
            .iter()
            .all(|n| {
                let s = n.status().borrow().clone();
                s.ready && s.reserved.len() >= k
            })
            .then_some(())
    })
    .await;
}

pub(crate) fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode");
    text
}

/// Go-aways a node counted with `result`, from the shared registry's text.
pub(crate) fn node_goaways(text: &str, member: &str, result: &str) -> f64 {
    node_counter(text, "goaways_total", ("result", result), member)
}

/// `agentmesh_node_<series>{key="value"}` of node `member`, from the shared
/// registry's text (0 when absent).
pub(crate) fn node_counter(
    text: &str,
    series: &str,
    (key, value): (&str, &str),
    member: &str,
) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("agentmesh_node_{series}{{")))
        .filter(|l| l.contains(&format!("{key}=\"{value}\"")))
        .filter(|l| l.contains(&format!("member=\"{member}\"")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
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
