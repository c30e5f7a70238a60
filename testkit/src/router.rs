//! Routers started in-process through `agentmesh_router::spawn`, each with
//! its key in a temp dir, ready before the test goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_router::config::ControlPlaneConfig;
use agentmesh_router::{Config, RouterHandle};
use libp2p::{Multiaddr, PeerId};

use crate::{Cp, DEADLINE, metric};

/// A running router and the temp dir holding its key (removed on drop).
pub struct TestRouter {
    /// The running router.
    pub handle: RouterHandle,
    /// Its first bound listen address (with the real port), to dial it.
    pub addr: Multiaddr,
    _dir: tempfile::TempDir,
}

impl TestRouter {
    /// Starts a router registered with `cp` under `labels` (both its token
    /// and its config carry them), listening on loopback TCP port 0,
    /// leasing every second with no clock skew; `adjust` changes anything
    /// else before it is spawned. Returns once the router reports ready.
    pub async fn start(cp: &Cp, labels: &[(&str, &str)], adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut config = Config {
            control_plane: ControlPlaneConfig {
                url: cp.url.clone(),
                token: cp.token_labelled(Role::Router, &labels).await,
                lease_interval: Duration::from_secs(1),
                clock_skew: Duration::ZERO,
                ..Default::default()
            },
            key_path: dir.path().join("router.key"),
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
            labels,
            ..Default::default()
        };
        adjust(&mut config);
        let handle = spawn_ready(config).await;
        let addr = handle
            .listen_addrs()
            .first()
            .cloned()
            .expect("a ready router has a listen address");
        Self {
            handle,
            addr,
            _dir: dir,
        }
    }

    /// The router's peer id.
    pub fn id(&self) -> PeerId {
        self.handle.peer_id()
    }

    /// One series of the router's metrics (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        metric(&self.handle.metrics_text(), series)
    }

    /// `agentmesh_router_refused_total` for one `resource`, `scope` and
    /// `protocol`: what the limit tests assert bit.
    pub fn refused(&self, resource: &str, scope: &str, protocol: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_refused_total{{resource=\"{resource}\",scope=\"{scope}\",protocol=\"{protocol}\"}}"
        ))
    }

    /// Every `agentmesh_router_handshakes_shed_total` series summed: the
    /// handshakes a per-source or global handshake limit cancelled for a
    /// newcomer (the limit biting without a refusal).
    pub fn handshakes_shed(&self) -> f64 {
        self.handle
            .metrics_text()
            .lines()
            .filter(|l| l.starts_with("agentmesh_router_handshakes_shed_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

/// Spawns a router from `config` and waits (up to [`DEADLINE`]) until it
/// reports ready: for tests that build the whole config themselves.
pub async fn spawn_ready(config: Config) -> RouterHandle {
    let handle = agentmesh_router::spawn(config).await.expect("router");
    let mut ready = handle.ready();
    tokio::time::timeout(DEADLINE, ready.wait_for(|r| *r))
        .await
        .expect("router ready in time")
        .expect("ready channel");
    handle
}
