//! Unit-test support: the router's components built without I/O (the
//! control-plane client connects lazily and is never called), so tests can
//! drive the swarm loop directly.

use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use libp2p::identity::Keypair;
use prometheus_client::registry::Registry;

use crate::admission::{Admission, Purpose};
use crate::config::Config;
use crate::resources::ResourceManager;
use crate::tables::Owner;

/// The memory budget test routers are sized with: 64 MiB.
const MEMORY_BUDGET_BYTES: u64 = 64 << 20;

/// The components for the default config after `adjust`, and the owner of
/// their tables (the swarm loop's part: the test holds it, or hands it to
/// an `EventLoop`).
pub(crate) fn components(adjust: impl FnOnce(&mut Config)) -> (crate::Components, Owner) {
    let mut config = Config::default();
    adjust(&mut config);
    let mut registry = Registry::default();
    let mut metrics = crate::register_metrics(&mut registry);
    let client = Client::new(ClientConfig {
        // Nothing listens here; no test calls the control plane.
        url: "http://127.0.0.1:9".into(),
        ca_pem: None,
        retry_budget: Duration::from_secs(1),
        rpc_timeout: Duration::from_secs(1),
    })
    .expect("client");
    let (shared, owner) = crate::Shared::new(&config, &mut metrics, &mut registry, client);
    let sizing = config.sizing(MEMORY_BUDGET_BYTES);
    let budgets = crate::resources::budgets(
        &config.resources,
        config.budget_watermarks(&sizing),
        MEMORY_BUDGET_BYTES,
    );
    let resources = ResourceManager::new(
        budgets,
        &mut registry,
        metrics.refused.clone(),
        shared.resource_deps(&metrics),
    );
    let c = crate::Components::new(
        config,
        sizing,
        Keypair::generate_ed25519(),
        metrics,
        shared,
        resources,
    );
    (c, owner)
}

/// An admission of `purpose` until far in the future.
pub(crate) fn admission(purpose: Purpose) -> Admission {
    Admission {
        purpose,
        until: i64::MAX / 2,
        node_id: "test".into(),
        attached_routers: vec![],
        groups: None,
        push: Default::default(),
    }
}
