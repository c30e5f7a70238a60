//! `agentmesh-router`: a well-known libp2p peer that admits authenticated
//! members, relays circuits between them, and hosts the service catalog
//! (Kademlia among routers only).
//!
//! The program is a value: [`spawn`] binds its listeners and starts its
//! tasks, returning a [`RouterHandle`] with the bound addresses, readiness
//! and a graceful [`RouterHandle::shutdown`]. Every task lives in the
//! handle's `JoinSet`, so dropping the handle aborts them all.

pub mod admission;
mod auth;
mod catalog;
pub mod cli;
pub mod config;
mod cp;
mod drain;
mod frames;
mod goaway;
mod http;
pub mod identity;
mod mesh;
mod metrics;
mod relay;
mod relay_capacity;
mod resources;
mod shrink;
mod state;
mod streams;
mod swarm;
#[cfg(test)]
mod test_support;
mod trim;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig, ClientError};
use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use catalog::service_key;
pub use config::Config;
pub use frames::WireError;
pub use identity::IdentityError;
pub use relay_capacity::capacity_layer as relay_capacity_layer;
pub use resources::config as resource_config;
pub use swarm::{BuildError, KAD_PROTOCOL};

/// Commands queued to the swarm loop at most.
const COMMAND_QUEUE: usize = 256;
/// How long `spawn` waits for every listener to report its address.
const LISTEN_DEADLINE: Duration = Duration::from_secs(10);
/// How long `shutdown` waits for tasks to finish before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The identity key could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The control plane's CA file could not be read.
    #[error("reading control-plane CA {path}: {source}")]
    ReadCa {
        /// The CA file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The control-plane client could not be built.
    #[error("control-plane client: {0}")]
    Client(#[from] ClientError),
    /// The swarm could not be built.
    #[error(transparent)]
    Swarm(#[from] swarm::BuildError),
    /// A listen address could not be bound.
    #[error("listening on {addr}: {reason}")]
    Listen {
        /// The address.
        addr: Multiaddr,
        /// What failed.
        reason: String,
    },
    /// The metrics listener could not be bound.
    #[error("binding metrics listener {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A blocking start-up task failed.
    #[error("start-up task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A running router.
pub struct RouterHandle {
    peer_id: PeerId,
    shared: Arc<state::Shared>,
    metrics_addr: Option<SocketAddr>,
    ready: watch::Receiver<bool>,
    registry: Arc<Registry>,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
}

impl RouterHandle {
    /// The router's PeerId.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Bound listen addresses, with real ports.
    pub fn listen_addrs(&self) -> Vec<Multiaddr> {
        self.shared.listen_addrs.read().clone()
    }

    /// Addresses announced to members (external addresses).
    pub fn external_addrs(&self) -> Vec<Multiaddr> {
        self.shared.external_addrs.read().clone()
    }

    /// The watermarks and relay reservation cap in effect (flags, else sized
    /// from the memory budget at start).
    pub fn sizing(&self) -> config::Sizing {
        self.shared.sizing
    }

    /// The bound metrics listener, if one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Readiness as a watch channel (true once ready, see DESIGN.md).
    pub fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// The metrics in Prometheus text format (what `/metrics` serves).
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }

    /// Starts draining (what SIGTERM and `POST /drain` do): readiness turns
    /// false, a last lease says so, every attached member gets go-away
    /// DRAINING, and after `drain_grace` (or once no member is left) every
    /// connection closes and the router stops. Returns at once; idempotent.
    /// Watch [`RouterHandle::drained`] for the end.
    pub fn drain(&self) {
        if self.shared.drain.request() {
            tracing::info!("drain requested");
        }
    }

    /// True once a drain finished and the router closed its connections.
    pub fn drained(&self) -> watch::Receiver<bool> {
        self.shared.drain.finished()
    }

    /// Stops every task, waiting up to a short grace period.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        let tasks = &mut self.tasks;
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("router tasks did not stop within the grace period; aborting");
            self.tasks.shutdown().await;
        }
    }
}

/// The external address for `bound` when the listener was configured as
/// `configured`: the bound address if the configured IP is specific (e.g.
/// loopback), else none (0.0.0.0 needs `--external-addr`).
pub(crate) fn derive_external(configured: &Multiaddr, bound: &Multiaddr) -> Option<Multiaddr> {
    let specific = configured.iter().any(|p| match p {
        Protocol::Ip4(ip) => !ip.is_unspecified(),
        Protocol::Ip6(ip) => !ip.is_unspecified(),
        Protocol::Dns(_) | Protocol::Dns4(_) | Protocol::Dns6(_) => true,
        _ => false,
    });
    specific.then(|| bound.clone())
}

/// Starts a router: loads (or creates) its key, binds its listeners and the
/// metrics listener, and starts enrollment, leasing, the mesh and the
/// protocols in the background. Returns once every listener is bound.
pub async fn spawn(config: Config) -> Result<RouterHandle, SpawnError> {
    let key_path = config.key_path.clone();
    let keypair =
        tokio::task::spawn_blocking(move || identity::load_or_create(&key_path)).await??;
    let ca_pem = match &config.control_plane_ca {
        Some(path) => Some(
            tokio::fs::read(path)
                .await
                .map_err(|source| SpawnError::ReadCa {
                    path: path.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let client = Client::new(ClientConfig {
        url: config.control_plane.clone(),
        ca_pem,
        retry_budget: config.control_plane_retry_budget,
        rpc_timeout: config.control_plane_rpc_timeout,
    })?;

    let mut registry = Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let p2p_metrics = libp2p::metrics::Metrics::new(&mut registry);
    let (resources, sizing) =
        resources::start(&config, &mut registry, metrics.refused.clone()).await?;
    let stall_probe = config
        .runtime_watchdog
        .then(|| agentmesh_runtime::watchdog::StallMetrics::register(&mut registry));
    if config.runtime_watchdog {
        // Same process-wide switch: the binary's allocator is jemalloc.
        agentmesh_runtime::allocator::register(&mut registry);
        relay_capacity::register(
            &mut registry,
            metrics
                .refused
                .get_or_create(&relay_capacity::RELAY_STOP_REFUSAL)
                .clone(),
        );
    }
    goaway::check_watermarks(&sizing, resources.budgets());
    metrics::register_sizing(&mut registry, &sizing);
    let (shared, ready) = state::Shared::new(
        config,
        sizing,
        keypair,
        metrics,
        cp::ControlPlane::new(client),
        resources,
    );
    let peer_id = shared.peer_id;

    let mut swarm = swarm::build(&shared)?;
    swarm.behaviour().stream.register_metrics(&mut registry);
    let registry = Arc::new(registry);
    let mut control = swarm.behaviour().stream.new_control();
    let auth_in = control
        .accept(StreamProtocol::new(agentmesh_proto::protocols::AUTH))
        .map_err(|_| SpawnError::Listen {
            addr: Multiaddr::empty(),
            reason: "auth protocol registered twice".into(),
        })?;
    let catalog_in = control
        .accept(StreamProtocol::new(agentmesh_proto::protocols::CATALOG))
        .map_err(|_| SpawnError::Listen {
            addr: Multiaddr::empty(),
            reason: "catalog protocol registered twice".into(),
        })?;

    // Bind every listener and wait for its first address.
    let mut listeners = HashMap::new();
    for addr in &shared.config.listen {
        let id = swarm
            .listen_on(addr.clone())
            .map_err(|e| SpawnError::Listen {
                addr: addr.clone(),
                reason: e.to_string(),
            })?;
        listeners.insert(id, addr.clone());
    }
    let mut pending: HashSet<_> = listeners.keys().copied().collect();
    let deadline = tokio::time::Instant::now() + LISTEN_DEADLINE;
    while !pending.is_empty() {
        let ev = tokio::time::timeout_at(deadline, swarm.select_next_some())
            .await
            .map_err(|_| SpawnError::Listen {
                addr: Multiaddr::empty(),
                reason: "no listen address within 10 s".into(),
            })?;
        match ev {
            SwarmEvent::NewListenAddr {
                listener_id,
                address,
            } => {
                pending.remove(&listener_id);
                shared.listen_addrs.write().push(address.clone());
                if shared.config.external_addr.is_empty()
                    && let Some(ext) = listeners
                        .get(&listener_id)
                        .and_then(|c| derive_external(c, &address))
                {
                    swarm.add_external_address(ext.clone());
                    shared.external_addrs.write().push(ext);
                }
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => {
                let addr = listeners
                    .get(&listener_id)
                    .cloned()
                    .unwrap_or_else(Multiaddr::empty);
                return Err(SpawnError::Listen {
                    addr,
                    reason: format!("listener closed: {reason:?}"),
                });
            }
            SwarmEvent::ListenerError { listener_id, error } => {
                let addr = listeners
                    .get(&listener_id)
                    .cloned()
                    .unwrap_or_else(Multiaddr::empty);
                return Err(SpawnError::Listen {
                    addr,
                    reason: error.to_string(),
                });
            }
            _ => {}
        }
    }
    for ext in &shared.config.external_addr {
        swarm.add_external_address(ext.clone());
        shared.external_addrs.write().push(ext.clone());
    }
    let has_external = !shared.external_addrs.read().is_empty();
    if !has_external {
        tracing::warn!(
            "no external address: the relay stays off and the router is not ready (set --external-addr)"
        );
    }
    shared.update_readiness(|r| {
        r.listening = true;
        r.external_addr = has_external;
    });

    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();

    let metrics_addr = match shared.config.metrics_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| SpawnError::Metrics { addr, source })?;
            let bound = listener
                .local_addr()
                .map_err(|source| SpawnError::Metrics { addr, source })?;
            tasks.spawn(http::serve(
                listener,
                registry.clone(),
                shared.clone(),
                cancel.clone(),
            ));
            Some(bound)
        }
        None => None,
    };

    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let event_loop = swarm::event_loop::EventLoop::new(
        swarm,
        shared.clone(),
        cmd_rx,
        p2p_metrics,
        control.clone(),
        listeners,
    );
    if let Some(stalls) = stall_probe {
        let probe = agentmesh_runtime::watchdog::spawn(stalls);
        let cancel = cancel.clone();
        tasks.spawn(async move {
            cancel.cancelled().await;
            probe.abort();
        });
    }
    tasks.spawn(event_loop.run(cancel.clone()));
    tasks.spawn(goaway::overload::run(
        shared.clone(),
        control.clone(),
        cmd_tx.clone(),
        cancel.clone(),
    ));
    tasks.spawn(drain::run(
        shared.clone(),
        control.clone(),
        cmd_tx.clone(),
        cancel.clone(),
    ));
    tasks.spawn(cp::run(shared.clone(), cancel.clone()));
    tasks.spawn(streams::accept_loop(
        shared.clone(),
        auth_in,
        shared.config.auth_max_inflight_streams,
        "auth",
        cancel.clone(),
        auth::server::serve,
    ));
    let ctx = catalog::server::CatalogCtx {
        shared: shared.clone(),
        commands: cmd_tx,
        control,
    };
    tasks.spawn(streams::accept_loop(
        shared.clone(),
        catalog_in,
        shared.config.catalog_max_inflight_streams,
        "catalog",
        cancel.clone(),
        move |_, peer, stream| catalog::server::serve(ctx.clone(), peer, stream),
    ));

    tracing::info!(%peer_id, listen = ?shared.listen_addrs.read(), "router started");
    Ok(RouterHandle {
        peer_id,
        shared,
        metrics_addr,
        ready,
        registry,
        cancel,
        tasks,
    })
}
