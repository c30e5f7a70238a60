//! agentmesh member node: enrolls with the control plane, holds K routers
//! (auth before reserve), publishes its services, calls others' services
//! through relayed circuits, and says truthfully whether it is ready.
//!
//! The node is a value: [`spawn`] starts one and returns a [`NodeHandle`].
//! Nothing is process-global (no registry, logger or listener unless the
//! [`Config`] asks for one), so thousands of nodes can run in one process;
//! each costs a swarm and two tasks (the engine and the inbound-call
//! acceptor) plus one per listener asked for (Unix socket, metrics,
//! forwards) and one per call in progress.

#![warn(missing_docs)]

mod call;
pub mod cli;
mod command;
pub mod config;
mod engine;
mod enroll;
mod forward;
mod http;
pub mod identity;
mod labels;
mod local;
pub mod metrics;
mod node;
mod peer_calls;
mod policy;
mod seen;
pub mod select;
mod socket;
pub mod status;
mod transport;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig, ClientError, Connections};
use agentmesh_proto::credential::Trust;
use agentmesh_proto::protocols::{CALL, GOAWAY, POLICY};
use libp2p::{PeerId, StreamProtocol};
use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument as _;

pub use call::{CallError, CallRoute, CallStream};
pub use config::{AllowMatcher, AllowRule, Config};
pub use status::NodeStatus;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The data dir could not be read or written.
    #[error("identity: {0}")]
    Identity(#[from] identity::IdentityError),
    /// The control-plane CA file could not be read.
    #[error("control-plane CA {path}: {source}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Enrollment (or the client set-up) failed.
    #[error("enrollment: {0}")]
    Enroll(#[from] ClientError),
    /// The control plane answered without a credential.
    #[error("enrollment answer carries no credential")]
    NoCredential,
    /// A listener could not be bound.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// Which listener and address.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The swarm could not be built.
    #[error("swarm: {0}")]
    Swarm(String),
}

/// A running node. Dropping it aborts every task; [`NodeHandle::shutdown`]
/// stops gracefully.
pub struct NodeHandle {
    node: Arc<node::Node>,
    shutdown_tx: watch::Sender<bool>,
    core: JoinSet<()>,
    tasks: JoinSet<()>,
    metrics_addr: Option<SocketAddr>,
    socket_path: Option<PathBuf>,
    forward_addrs: Vec<SocketAddr>,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("peer_id", &self.node.peer_id)
            .finish()
    }
}

impl NodeHandle {
    /// This node's PeerId.
    pub fn peer_id(&self) -> PeerId {
        self.node.peer_id
    }

    /// Whether the node is ready now (see [`NodeStatus::ready`]).
    pub fn is_ready(&self) -> bool {
        self.node.status.borrow().ready
    }

    /// The node's status as it changes, readiness included.
    pub fn status(&self) -> watch::Receiver<NodeStatus> {
        self.node.status.subscribe()
    }

    /// Waits until ready, up to `deadline`; returns whether it became ready.
    pub async fn wait_ready(&self, deadline: Duration) -> bool {
        let mut s = self.status();
        tokio::time::timeout(deadline, s.wait_for(|s| s.ready))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Calls `service` on some provider; the stream is returned once the
    /// provider accepted. Returns, with the stream or an error, within the
    /// call budget ([`Config::call_budget`]: connect + call timeout), which
    /// the lookup, every provider attempt and every retry share: up to 3
    /// route retries on a fresh lookup after a route failed, and one more
    /// lookup after one that found no provider.
    pub async fn call(&self, service: &str) -> Result<CallStream, CallError> {
        call::outbound::call(&self.node, service).await
    }

    /// The `(epoch, version)` of the access policy this node holds; `(0, 0)`
    /// before one arrived (every call denied). What a member acknowledges
    /// when a router pushes it a policy.
    pub fn policy_version(&self) -> (u64, u64) {
        self.node.policy.epoch_version()
    }

    /// The `(epoch, generation)` of the signed revocation list this node
    /// enforces; `(0, 0)` before one arrived.
    pub fn revocations_generation(&self) -> (u64, u64) {
        self.node.policy.revocations_generation()
    }

    /// Whether this node refuses `credential` as revoked now, by the
    /// revocation list it enforces: what it would answer a call from its
    /// holder (`CALL_REFUSAL_REVOKED`). The credential is verified against
    /// the node's own trust first; any other refusal is not "revoked".
    pub fn refuses_as_revoked(
        &self,
        credential: &agentmesh_proto::pb::credential::Credential,
    ) -> bool {
        let skew = i64::try_from(self.node.config.credential_skew.as_secs()).unwrap_or(i64::MAX);
        matches!(
            agentmesh_proto::credential::verify(
                credential,
                &self.node.trust(),
                agentmesh_proto::unix_now(),
                None,
                skew,
            ),
            Err(agentmesh_proto::credential::CredentialError::Revoked)
        )
    }

    /// Changes of the policy or of the revocations this node holds, as a
    /// counter that moves on every change: a harness that wants to know
    /// *when* a change reached this node waits on it instead of polling.
    pub fn policy_changes(&self) -> watch::Receiver<u64> {
        self.node.policy.subscribe()
    }

    /// Resolves with the panic message if the node's engine fails (see
    /// [`NodeStatus::failed`]); pending while it runs or stops normally.
    pub async fn failed(&self) -> String {
        let mut s = self.status();
        match s.wait_for(|s| s.failed.is_some()).await {
            Ok(s) => s.failed.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// The bound `/metrics` + `/readyz` address, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The Unix socket path, if served.
    pub fn socket_path(&self) -> Option<&std::path::Path> {
        self.socket_path.as_deref()
    }

    /// Bound addresses of the `--forward` listeners, in config order.
    pub fn forward_addrs(&self) -> &[SocketAddr] {
        &self.forward_addrs
    }

    /// Graceful stop: withdraw records, refuse new calls, let calls in
    /// flight finish within `--shutdown-grace-secs`, then stop everything.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        let c = &self.node.config;
        let limit = c.shutdown_grace + c.call_timeout + Duration::from_secs(5);
        let _ = tokio::time::timeout(limit, async {
            while self.core.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        if let Some(p) = &self.socket_path {
            let _ = tokio::fs::remove_file(p).await;
        }
    }
}

fn validate(config: &Config) -> Result<(), SpawnError> {
    if config.routers == 0 {
        return Err(SpawnError::Config("--routers must be at least 1".into()));
    }
    let mut seen = HashSet::new();
    for (name, _) in &config.expose {
        if !seen.insert(name) {
            return Err(SpawnError::Config(format!(
                "service {name:?} exposed twice"
            )));
        }
    }
    for rule in &config.allow {
        if !seen.contains(&rule.service) {
            return Err(SpawnError::Config(format!(
                "--allow names {:?}, which is not exposed",
                rule.service
            )));
        }
    }
    Ok(())
}

/// Starts a node: loads or creates its identity, enrolls unless the data
/// dir holds a credential that is still valid, binds the listeners the
/// config asks for and starts attaching to routers. Returns once running;
/// readiness follows (see [`NodeHandle::ready`]). Metrics are registered in
/// `registry` when given (use a sub-registry with a label per node when
/// embedding many) and are also served on `--metrics-addr` when set; only
/// the served registry adds libp2p's own metrics (`libp2p_*`), so a fleet
/// embedded in one process does not carry those families per node.
pub async fn spawn(
    config: Config,
    registry: Option<&mut Registry>,
) -> Result<NodeHandle, SpawnError> {
    validate(&config)?;
    let dir = config.data_dir.clone();
    let stored = tokio::task::spawn_blocking(move || identity::load_or_create(&dir))
        .await
        .map_err(|e| SpawnError::Config(format!("identity task: {e}")))??;
    let peer_id = stored.key.public().to_peer_id();
    let span = tracing::info_span!("node", peer = %peer_id);

    let ca_pem = match &config.control_plane_ca {
        Some(p) => Some(tokio::fs::read(p).await.map_err(|source| SpawnError::Ca {
            path: p.clone(),
            source,
        })?),
        None => None,
    };
    // A member talks to the control plane a few times an hour: a
    // connection per call, so that it holds none at rest.
    let client = Client::with_connections(
        ClientConfig {
            url: config.control_plane.clone(),
            ca_pem,
            retry_budget: config.retry_budget,
            rpc_timeout: config.rpc_timeout.max(config::MIN_TIMEOUT),
        },
        Connections::PerCall,
    )?;

    let metrics = metrics::Metrics::new();
    let (credential, keys) = enroll::obtain(&client, &config, &stored, &metrics)
        .instrument(span.clone())
        .await?;

    // Listeners the config asks for.
    let metrics_listener = match config.metrics_addr {
        Some(a) => {
            Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|source| SpawnError::Bind {
                        what: format!("--metrics-addr {a}"),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
    let mut forward_listeners = Vec::new();
    for (addr, name) in &config.forward {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| SpawnError::Bind {
                what: format!("--forward {addr}={name}"),
                source,
            })?;
        forward_listeners.push((l, name.clone()));
    }
    let forwards: Vec<(SocketAddr, String)> = forward_listeners
        .iter()
        .filter_map(|(l, name)| l.local_addr().ok().map(|a| (a, name.clone())))
        .collect();
    let forward_addrs = forwards.iter().map(|(a, _)| *a).collect();
    let socket_path = config.effective_socket_path();
    let socket_listener = match &socket_path {
        Some(p) => Some(socket::bind(p).await.map_err(|source| SpawnError::Bind {
            what: format!("--socket-path {}", p.display()),
            source,
        })?),
        None => None,
    };

    // A let of its own: the family's guard must not live across the await.
    let yamux_dropped = metrics
        .yamux_inbound_streams_dropped
        .get_or_create(&crate::metrics::ReasonLabel {
            reason: "buffer_full",
        })
        .clone();
    let swarm = transport::build_swarm(
        &stored.key,
        config.dial_source_ip,
        config.connect_timeout(),
        config.idle_connection.max(config::MIN_TIMEOUT),
        libp2p::ping::Config::new()
            .with_interval(config.ping_interval.max(config::MIN_TIMEOUT))
            .with_timeout(config.ping_timeout.max(config::MIN_TIMEOUT)),
        agentmesh_streams::Config {
            inbound_queue_per_protocol: config.stream_inbound_queue_per_protocol,
        },
        config.pending_open_limits(),
        config.yamux_limits(),
        yamux_dropped,
    )
    .await
    .map_err(|e| SpawnError::Swarm(e.to_string()))?;

    // After the swarm: its streams behaviour owns
    // `agentmesh_streams_inbound_dropped_total` and
    // `agentmesh_streams_pending_opens_refused_total`, registered next to the
    // node's own metrics (so per node when embedders pass sub-registries).
    if let Some(r) = registry {
        metrics.register(r);
        swarm.behaviour().stream.register_metrics(r);
    }
    let mut watchdog = None;
    let mut p2p_metrics = None;
    let own_registry = metrics_listener.as_ref().map(|_| {
        let mut r = Registry::default();
        metrics.register(&mut r);
        swarm.behaviour().stream.register_metrics(&mut r);
        // libp2p's own families (`libp2p_swarm_*`, `libp2p_ping_*`: one
        // registry for everything a program serves), recorded by the engine. Only in the registry
        // this node serves: an embedder running thousands of nodes without
        // `--metrics-addr` (the ladder) allocates none of them per node.
        p2p_metrics = Some(libp2p::metrics::Metrics::new(&mut r));
        if config.runtime_watchdog {
            watchdog = Some(agentmesh_runtime::watchdog::StallMetrics::register(&mut r));
            // Same process-wide switch (the binary, whose allocator is
            // jemalloc): `agentmesh_runtime_allocator_*` gauges.
            agentmesh_runtime::allocator::register(&mut r);
        }
        Arc::new(r)
    });
    let mut control = swarm.behaviour().stream.new_control();
    let incoming = control
        .accept(StreamProtocol::new(CALL))
        .map_err(|e| SpawnError::Swarm(e.to_string()))?;
    let goaways = control
        .accept(StreamProtocol::new(GOAWAY))
        .map_err(|e| SpawnError::Swarm(e.to_string()))?;

    let policy_pushes = control
        .accept(StreamProtocol::new(POLICY))
        .map_err(|e| SpawnError::Swarm(e.to_string()))?;

    let (cmd_tx, cmd_rx) = mpsc::channel(command::COMMAND_QUEUE);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (status_tx, _) = watch::channel(NodeStatus::default());
    let inbound = Arc::new(call::inbound::Inbound::new(
        &config.expose,
        &config.allow,
        config.max_inbound_calls,
        config.max_inbound_calls_per_caller,
    ));
    let member_policy = policy::MemberPolicy::new(metrics.policy.clone());
    let node = Arc::new(node::Node {
        config,
        key: stored.key,
        peer_id,
        client,
        control,
        metrics,
        credential: RwLock::new(credential),
        trust: RwLock::new(Arc::new(Trust::new(&keys))),
        keys_fetched_at: Mutex::new(None),
        cmd: cmd_tx,
        shutdown: shutdown_rx,
        status: status_tx,
        in_flight: Arc::new(AtomicUsize::new(0)),
        peer_calls: Default::default(),
        forwards,
        seen: Default::default(),
        policy: member_policy,
    });

    let mut core_set = JoinSet::new();
    let engine = engine::Engine::new(
        node.clone(),
        swarm,
        cmd_rx,
        goaways,
        policy_pushes,
        p2p_metrics,
    );
    core_set.spawn(supervised(node.clone(), engine.run()).instrument(span.clone()));
    let mut tasks = JoinSet::new();
    tasks.spawn(
        call::inbound::accept_loop(node.clone(), inbound, incoming).instrument(span.clone()),
    );
    if let Some(stalls) = watchdog {
        let probe = agentmesh_runtime::watchdog::spawn(stalls);
        tasks.spawn(async move {
            // The probe runs until the node stops; aborting `tasks` aborts this
            // waiter, and the guard aborts the probe with it.
            let _guard = AbortOnDrop(probe);
            std::future::pending::<()>().await;
        });
    }
    if let (Some(l), Some(reg)) = (metrics_listener, own_registry) {
        tasks.spawn(http::serve(node.clone(), reg, l).instrument(span.clone()));
    }
    let max_local = node.config.max_forward_connections;
    if let Some(l) = socket_listener {
        let limit = local::Limit::new(max_local, "socket", &node.metrics);
        tasks.spawn(socket::serve(node.clone(), l, limit).instrument(span.clone()));
    }
    // One total for every --forward listener.
    let forward_limit = local::Limit::new(max_local, "forward", &node.metrics);
    for (l, name) in forward_listeners {
        let limit = forward_limit.clone();
        tasks.spawn(forward::serve(node.clone(), l, name, limit).instrument(span.clone()));
    }
    Ok(NodeHandle {
        node,
        shutdown_tx,
        core: core_set,
        tasks,
        metrics_addr,
        socket_path,
        forward_addrs,
    })
}

/// Runs the node's engine; if it panics (a bug here or in libp2p), the node
/// says so instead of looking alive: not ready, `failed` and `stopping` in
/// its status (`/readyz` names the panic), an error in the log. Without
/// this a member whose swarm task died kept its last status for good.
async fn supervised(node: Arc<node::Node>, core: impl std::future::Future<Output = ()>) {
    if let Err(why) = catch_panic(core).await {
        tracing::error!(%why, "node engine panicked: no router is held any more");
        node.status.send_modify(|s| {
            s.ready = false;
            s.stopping = true;
            s.failed = Some(why.chars().take(240).collect());
        });
    }
}

/// Runs `fut`; a panic comes back as its message.
async fn catch_panic(fut: impl std::future::Future<Output = ()>) -> Result<(), String> {
    use futures::FutureExt as _;
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|panic| {
            panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-text panic payload".to_string())
        })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::catch_panic;

    #[tokio::test]
    async fn a_panicking_core_comes_back_as_its_message() {
        assert_eq!(catch_panic(async {}).await, Ok(()));
        let text = catch_panic(async { panic!("Relay connection exist") }).await;
        assert_eq!(text, Err("Relay connection exist".to_string()));
        let n = 3;
        let formatted = catch_panic(async move { panic!("slot {n} gone") }).await;
        assert_eq!(formatted, Err("slot 3 gone".to_string()));
    }

    #[test]
    fn a_failed_node_is_not_ready_and_readyz_names_the_panic() {
        let s = super::NodeStatus {
            failed: Some("Relay connection exist".into()),
            stopping: true,
            ..Default::default()
        };
        assert_eq!(
            s.readyz_line(),
            "not ready: failed: Relay connection exist\n"
        );
    }
}
