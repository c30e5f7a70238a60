//! `agentmesh-router`: a well-known libp2p peer that admits authenticated
//! members, relays circuits between them, and hosts the service catalog
//! (Kademlia among routers only).
//!
//! The program is a value: [`spawn`] binds its listeners and starts its
//! tasks, returning a [`RouterHandle`] with the bound addresses, readiness
//! and a graceful [`RouterHandle::shutdown`]. Every long-lived task is
//! spawned under a name and joined by the supervisor ([`supervisor`]), which
//! reports one that stops outside a drain or shutdown through
//! [`RouterHandle::failed`] and `/readyz`; dropping the handle aborts them
//! all.

mod addrs;
pub mod admission;
mod auth;
mod catalog;
pub mod cli;
pub mod config;
mod cp;
mod directory;
mod drain;
mod goaway;
mod http;
pub mod identity;
mod metrics;
mod owned;
mod policy;
mod policy_metrics;
mod protocols;
mod readiness;
mod relay;
mod resources;
mod shrink;
mod start;
mod streams;
mod supervisor;
mod swarm;
mod tables;
#[cfg(test)]
mod test_support;
mod trim;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig, ClientError, Connections, Dialing};
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use catalog::service_key;
pub use config::Config;
pub use identity::IdentityError;
pub use protocols::KAD_PROTOCOL;
pub use relay::capacity::capacity_layer as relay_capacity_layer;
pub use resources::config as resource_config;
pub use supervisor::TaskFailure;
pub use swarm::BuildError;

use agentmesh_runtime::watchdog::StallMetrics;
use agentmesh_streams::IncomingStreams;

/// Commands queued to the swarm loop at most (and, apart, provider searches).
const COMMAND_QUEUE: usize = 256;
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
    addrs: Arc<addrs::Addrs>,
    sizing: config::Sizing,
    drain: Arc<drain::DrainState>,
    metrics_addr: Option<SocketAddr>,
    ready: watch::Receiver<bool>,
    registry: Arc<Registry>,
    cancel: CancellationToken,
    /// The supervisor, which owns every other task (a set of one, so
    /// dropping the handle aborts it and with it every task).
    supervisor: JoinSet<()>,
    failed: watch::Receiver<Option<TaskFailure>>,
    aborts: Arc<parking_lot::Mutex<HashMap<&'static str, tokio::task::AbortHandle>>>,
}

impl From<addrs::BindError> for SpawnError {
    fn from(e: addrs::BindError) -> Self {
        Self::Listen {
            addr: e.addr,
            reason: e.reason,
        }
    }
}

impl RouterHandle {
    /// The router's PeerId.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Bound listen addresses, with real ports.
    pub fn listen_addrs(&self) -> Vec<Multiaddr> {
        self.addrs.listen.read().clone()
    }

    /// Addresses announced to members (external addresses).
    pub fn external_addrs(&self) -> Vec<Multiaddr> {
        self.addrs.external.read().clone()
    }

    /// The watermarks and relay reservation cap in effect (flags, else sized
    /// from the memory budget at start).
    pub fn sizing(&self) -> config::Sizing {
        self.sizing
    }

    /// The bound metrics listener, if one was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Readiness as a watch channel: true once the router listens, has an
    /// external address, holds the control plane's keys and had a lease
    /// accepted; false again for good once it drains.
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
        if self.drain.request() {
            tracing::info!("drain requested");
        }
    }

    /// True once a drain finished and the router closed its connections.
    pub fn drained(&self) -> watch::Receiver<bool> {
        self.drain.finished()
    }

    /// The first long-lived task that stopped outside a drain or shutdown,
    /// once one did (the router is then unready for good; the owner should
    /// shut it down: the binary exits non-zero).
    pub fn failed(&self) -> watch::Receiver<Option<TaskFailure>> {
        self.failed.clone()
    }

    /// Test hook: aborts the long-lived task `name` as if it had died
    /// (the supervisor's tests). Returns whether such a task was running.
    #[doc(hidden)]
    pub fn stop_task_for_test(&self, name: &str) -> bool {
        match self.aborts.lock().get(name) {
            Some(abort) => {
                abort.abort();
                true
            }
            None => false,
        }
    }

    /// Stops every task, waiting up to a short grace period.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        let supervisor = &mut self.supervisor;
        let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while supervisor.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("router tasks did not stop within the grace period; aborting");
            // Aborting the supervisor drops its set, which aborts the rest.
            self.supervisor.shutdown().await;
        }
    }
}

/// The router's state, one component per concern; each task gets the
/// components it needs (see [`spawn`]), never the whole set.
pub(crate) struct Components {
    pub(crate) config: Arc<Config>,
    pub(crate) sizing: config::Sizing,
    pub(crate) keypair: Keypair,
    pub(crate) peer_id: PeerId,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) link: Arc<cp::Link>,
    /// The admission table (the swarm loop's; read-only here).
    pub(crate) admissions: admission::Admissions,
    /// Asks the swarm loop to change its tables.
    pub(crate) tables: tables::Handle,
    /// Circuits relayed now, as the swarm loop publishes them.
    pub(crate) circuits: watch::Receiver<usize>,
    /// The catalog's records (the swarm loop's; read-only here).
    pub(crate) records: owned::View<catalog::store::CatalogStore>,
    pub(crate) directory: Arc<directory::Directory>,
    pub(crate) addrs: Arc<addrs::Addrs>,
    pub(crate) resources: Arc<resources::ResourceManager>,
    pub(crate) drain: Arc<drain::DrainState>,
    pub(crate) readiness: Arc<readiness::ReadinessState>,
    /// The held policy and revocations (`policy::state`).
    pub(crate) policy: Arc<policy::state::PolicyState>,
}

/// What exists before the resource manager, which reads it: the swarm
/// loop's tables (their owner goes to the loop, their views and a handle to
/// everyone else), the policy state, the link and the log gate.
pub(crate) struct Shared {
    views: tables::Views,
    tables: tables::Handle,
    policy: Arc<policy::state::PolicyState>,
    link: cp::Link,
}

impl Shared {
    /// The tables (returning their owner for the swarm loop) and what reads
    /// them; `metrics.log` becomes the router's one log gate. Registers the
    /// tables' metrics.
    pub(crate) fn new(
        config: &Config,
        metrics: &mut metrics::Metrics,
        registry: &mut Registry,
        client: Client,
    ) -> (Self, tables::Owner) {
        let (owner, views, tables) = tables::Owner::new(
            registry,
            config.state_command_deadline,
            config.catalog.max_records,
        );
        metrics.log = agentmesh_runtime::log_gate::LogGate::new(resources::LOG_KINDS);
        metrics.policy.log = metrics.log.clone();
        let shared = Self {
            policy: Arc::new(policy::state::PolicyState::new(metrics.policy.clone())),
            link: cp::Link::new(client, views.trust.clone()),
            views,
            tables,
        };
        (shared, owner)
    }

    /// What the resource manager reads: the admission table and the
    /// policy's circuit check, handed over when it is built.
    pub(crate) fn resource_deps(&self, metrics: &metrics::Metrics) -> resources::Deps {
        let admissions = self.views.admissions.clone();
        resources::Deps {
            admitted: Arc::new(admissions.clone()),
            circuit_policy: Arc::new(policy::CircuitCheck {
                state: self.policy.clone(),
                admissions,
            }),
            log: metrics.log.clone(),
        }
    }
}

impl Components {
    /// The components of a router that has not started anything yet.
    pub(crate) fn new(
        config: Config,
        sizing: config::Sizing,
        keypair: Keypair,
        metrics: metrics::Metrics,
        shared: Shared,
        resources: Arc<resources::ResourceManager>,
    ) -> Self {
        Self {
            policy: shared.policy,
            records: shared.views.catalog,
            config: Arc::new(config),
            sizing,
            peer_id: keypair.public().to_peer_id(),
            keypair,
            readiness: Arc::new(readiness::ReadinessState::new(metrics.ready.clone())),
            metrics,
            link: Arc::new(shared.link),
            admissions: shared.views.admissions,
            tables: shared.tables,
            circuits: shared.views.circuits,
            directory: Arc::new(directory::Directory::new(shared.views.router_set)),
            addrs: Arc::default(),
            resources,
            drain: Arc::default(),
        }
    }

    fn policy_ctx(&self) -> policy::PolicyCtx {
        policy::PolicyCtx {
            state: self.policy.clone(),
            link: self.link.clone(),
            admissions: self.admissions.clone(),
            tables: self.tables.clone(),
            resources: self.resources.clone(),
            skew_secs: self.config.control_plane.skew_secs(),
        }
    }

    fn ownership(&self) -> policy::publish::Ownership {
        policy::publish::Ownership {
            state: self.policy.clone(),
            link: self.link.clone(),
            admissions: self.admissions.clone(),
            skew_secs: self.config.control_plane.skew_secs(),
        }
    }

    fn goaways(&self) -> goaway::GoAways {
        goaway::GoAways {
            config: self.config.drain,
            stream_timeout: self.config.connections.stream_timeout,
            me: self.peer_id,
            directory: self.directory.clone(),
            metrics: self.metrics.clone(),
        }
    }

    fn cp(&self) -> cp::Cp {
        cp::Cp {
            config: self.config.clone(),
            keypair: self.keypair.clone(),
            sizing: self.sizing,
            link: self.link.clone(),
            tables: self.tables.clone(),
            metrics: self.metrics.clone(),
            admissions: self.admissions.clone(),
            directory: self.directory.clone(),
            readiness: self.readiness.clone(),
            addrs: self.addrs.clone(),
            policy: Arc::new(self.policy_ctx()),
        }
    }

    /// What the swarm loop works with.
    pub(crate) fn swarm_parts(&self) -> swarm::event_loop::Parts {
        swarm::event_loop::Parts {
            config: self.config.clone(),
            sizing: self.sizing,
            metrics: self.metrics.clone(),
            admissions: self.admissions.clone(),
            link: self.link.clone(),
            directory: self.directory.clone(),
            resources: self.resources.clone(),
            addrs: self.addrs.clone(),
        }
    }

    /// The swarm, built from the config, the identity and the limits.
    pub(crate) fn build_swarm(&self) -> Result<libp2p::Swarm<swarm::Behaviour>, swarm::BuildError> {
        swarm::build(swarm::BuildParts {
            config: &self.config,
            sizing: &self.sizing,
            keypair: &self.keypair,
            admissions: &self.admissions,
            router_set: &self.directory.router_set,
            resources: &self.resources,
        })
    }
}

/// The router's metrics, with every module's label values pre-created.
pub(crate) fn register_metrics(registry: &mut Registry) -> metrics::Metrics {
    let mut m = metrics::Metrics::new(registry);
    m.policy = policy_metrics::PolicyMetrics::register(registry);
    goaway::precreate_labels(&m);
    goaway::pace::precreate_labels(&m);
    trim::precreate_labels(&m);
    catalog::precreate_labels(&m);
    m
}

/// Loads (or creates) the identity key at `key_path` and builds the
/// control-plane client (which connects lazily) from its section.
async fn identity_and_client(
    key_path: &std::path::Path,
    config: &config::ControlPlaneConfig,
) -> Result<(Keypair, Client), SpawnError> {
    let key_path = key_path.to_path_buf();
    let keypair =
        tokio::task::spawn_blocking(move || identity::load_or_create(&key_path)).await??;
    let ca_pem = match &config.ca {
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
    let client = Client::with_dialing(
        ClientConfig {
            url: config.url.clone(),
            ca_pem,
            retry_budget: config.retry_budget,
            rpc_timeout: config.rpc_timeout,
        },
        Dialing {
            connections: Connections::Held,
            endpoints: config.endpoints.clone(),
            keepalive_interval: config.keepalive_interval,
            keepalive_timeout: config.keepalive_timeout,
            // A random replica first, then the next one at each move.
            watch_start: None,
        },
    )?;
    Ok((keypair, client))
}

/// The router's components, sized from the memory budget, with every
/// metric registered in `registry`; the owner of the swarm loop's tables
/// and the runtime's stall probe (binary only) come back apart.
async fn components(
    config: Config,
    keypair: Keypair,
    client: Client,
    registry: &mut Registry,
) -> Result<(Components, tables::Owner, Option<StallMetrics>), SpawnError> {
    let mut metrics = register_metrics(registry);
    let (shared, owner) = Shared::new(&config, &mut metrics, registry, client);
    let (resources, sizing) = resources::start(
        &config.resources,
        |budget| {
            let sizing = config.sizing(budget);
            (sizing, config.budget_watermarks(&sizing))
        },
        registry,
        metrics.refused.clone(),
        shared.resource_deps(&metrics),
    )
    .await?;
    tracing::info!(
        high_watermark = sizing.high_watermark,
        low_watermark = sizing.low_watermark,
        relay_max_reservations = sizing.relay_max_reservations,
        from = if sizing.sized_from_memory {
            "memory budget"
        } else {
            "--high-watermark"
        },
        high_watermark_memory_percent = config.watermarks.high_memory_percent,
        "watermarks"
    );
    let stall_probe = config
        .runtime_watchdog
        .then(|| StallMetrics::register(registry));
    if config.runtime_watchdog {
        // Same process-wide switch: the binary's allocator is jemalloc.
        agentmesh_runtime::allocator::register(registry);
        // Namespace-wide too: whether --listen-backlog-connections bites.
        agentmesh_runtime::listen_queue::register(registry);
        relay::capacity::register(
            registry,
            metrics
                .refused
                .get_or_create(&relay::capacity::RELAY_STOP_REFUSAL)
                .clone(),
        );
    }
    config::check_watermarks(&sizing, resources.budgets());
    metrics::register_sizing(registry, &sizing);
    let c = Components::new(config, sizing, keypair, metrics, shared, resources);
    Ok((c, owner, stall_probe))
}

/// Registers our two accepted protocols (auth, catalog) on `control`.
fn accept_protocols(
    control: &mut agentmesh_streams::Control,
) -> Result<(IncomingStreams, IncomingStreams), SpawnError> {
    let mut accept = |id: &'static str, name: &str| {
        control
            .accept(StreamProtocol::new(id))
            .map_err(|_| SpawnError::Listen {
                addr: Multiaddr::empty(),
                reason: format!("{name} protocol registered twice"),
            })
    };
    let auth = accept(agentmesh_proto::protocols::AUTH, "auth")?;
    let catalog = accept(agentmesh_proto::protocols::CATALOG, "catalog")?;
    Ok((auth, catalog))
}

/// Starts a router: loads (or creates) its key, binds its listeners and the
/// metrics listener, and starts enrollment, leasing, the mesh and the
/// protocols in the background. Returns once every listener is bound.
pub async fn spawn(config: Config) -> Result<RouterHandle, SpawnError> {
    let (keypair, client) = identity_and_client(&config.key_path, &config.control_plane).await?;
    let mut registry = Registry::default();
    let p2p_metrics = libp2p::metrics::Metrics::new(&mut registry);
    let (c, owner, stall_probe) = components(config, keypair, client, &mut registry).await?;
    let peer_id = c.peer_id;
    let ready = c.readiness.watch();

    let mut swarm = c.build_swarm()?;
    swarm.behaviour().stream.register_metrics(&mut registry);
    let registry = Arc::new(registry);
    let mut control = swarm.behaviour().stream.new_control();
    let (auth_in, catalog_in) = accept_protocols(&mut control)?;

    // Bind every listener and wait for its first address.
    let listeners = addrs::bind(
        &mut swarm,
        &c.config.listen,
        &c.config.external_addr,
        &c.addrs,
    )
    .await?;
    let has_external = !c.addrs.external.read().is_empty();
    if !has_external {
        tracing::warn!(
            "no external address: the relay stays off and the router is not ready (set --external-addr)"
        );
    }
    c.readiness.update(|r| {
        r.listening = true;
        r.external_addr = has_external;
    });

    let cancel = CancellationToken::new();
    let mut tasks = supervisor::Tasks::default();
    let mut s = start::Start {
        c: &c,
        control: &control,
        cancel: &cancel,
        tasks: &mut tasks,
    };
    let metrics_addr = start::http(&mut s, registry.clone()).await?;

    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let (query_tx, query_rx) = mpsc::channel(COMMAND_QUEUE);
    let event_loop = swarm::event_loop::EventLoop::new(
        swarm,
        c.swarm_parts(),
        swarm::event_loop::Inputs {
            owner,
            commands: cmd_rx,
            provider_queries: query_rx,
        },
        p2p_metrics,
        control.clone(),
        listeners,
    );
    if let Some(stalls) = stall_probe {
        let probe = agentmesh_runtime::watchdog::spawn(stalls);
        let cancel = cancel.clone();
        s.tasks.spawn("stall_watchdog", async move {
            cancel.cancelled().await;
            probe.abort();
        });
    }
    s.tasks.spawn("event_loop", event_loop.run(cancel.clone()));
    let commands = swarm::Commands::new(cmd_tx, c.config.state_command_deadline);
    start::trim_and_drain(&mut s, commands);
    s.tasks.spawn("cp", cp::run(c.cp(), cancel.clone()));
    let refusals = start::auth(&mut s, auth_in);
    start::policy(&mut s);
    start::catalog(&mut s, catalog_in, query_tx, refusals);

    let failed = watch::channel(None).0;
    let failed_rx = failed.subscribe();
    let aborts = tasks.aborts();
    let mut supervisor = JoinSet::new();
    supervisor.spawn(supervisor::supervise(
        tasks,
        supervisor::Supervisor {
            cancel: cancel.clone(),
            drain_requested: c.drain.requested(),
            readiness: c.readiness.clone(),
            failed,
        },
    ));

    tracing::info!(%peer_id, listen = ?c.addrs.listen.read(), "router started");
    Ok(RouterHandle {
        peer_id,
        addrs: c.addrs.clone(),
        sizing: c.sizing,
        drain: c.drain.clone(),
        metrics_addr,
        ready,
        registry,
        cancel,
        supervisor,
        failed: failed_rx,
        aborts,
    })
}
