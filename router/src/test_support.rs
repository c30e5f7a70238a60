//! Unit-test support: the router's shared state built without I/O (the
//! control-plane client connects lazily and is never called), so tests can
//! drive the swarm loop, the relay configuration and stream servers directly.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use libp2p::identity::Keypair;
use prometheus_client::registry::Registry;

use crate::Config;
use crate::state::Shared;

/// The memory budget test routers are sized with: 64 MiB.
const MEMORY_BUDGET_BYTES: u64 = 64 << 20;

/// Shared state for the default config after `adjust`.
pub(crate) fn shared(adjust: impl FnOnce(&mut Config)) -> Arc<Shared> {
    let mut config = Config::default();
    adjust(&mut config);
    let mut registry = Registry::default();
    let metrics = crate::metrics::Metrics::new(&mut registry);
    let sizing = config.sizing(MEMORY_BUDGET_BYTES);
    let budgets = crate::resources::budgets(&config, &sizing, MEMORY_BUDGET_BYTES);
    let resources =
        crate::resources::ResourceManager::new(budgets, &mut registry, metrics.refused.clone());
    let client = Client::new(ClientConfig {
        // Nothing listens here; no test calls the control plane.
        url: "http://127.0.0.1:9".into(),
        ca_pem: None,
        retry_budget: Duration::from_secs(1),
        rpc_timeout: Duration::from_secs(1),
    })
    .expect("client");
    let (shared, _ready) = Shared::new(
        config,
        sizing,
        Keypair::generate_ed25519(),
        metrics,
        crate::cp::ControlPlane::new(client),
        resources,
    );
    shared
}

/// An admission of `purpose` until far in the future.
pub(crate) fn admission(purpose: crate::admission::Purpose) -> crate::admission::Admission {
    crate::admission::Admission {
        purpose,
        until: i64::MAX / 2,
        node_id: "test".into(),
        attached_routers: vec![],
    }
}
