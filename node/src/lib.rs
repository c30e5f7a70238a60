//! agentmesh member node: enrolls with the control plane, holds K routers
//! (auth before reserve), publishes its services, calls others' services
//! through relayed circuits, and says truthfully whether it is ready.
//!
//! The node is a value: [`spawn`] starts one and returns a [`NodeHandle`].
//! Nothing is process-global (no registry, logger or listener unless the
//! [`Config`] asks for one), so thousands of nodes can run in one process;
//! each costs a swarm and two tasks (the engine and the inbound-call
//! acceptor) plus one per listener asked for (Unix socket, metrics,
//! forwards) and one per call in progress. No task ends the process:
//! every long-lived one is watched, and one that ends or panics outside
//! shutdown fails the node (not ready, [`NodeHandle::failed`] names it).

#![warn(missing_docs)]

mod call;
pub mod cli;
mod command;
pub mod config;
mod direct;
mod engine;
mod enroll;
mod forward;
mod http;
pub mod identity;
mod labels;
mod listeners;
mod local;
pub mod metrics;
mod node;
mod peer_calls;
pub mod ping;
mod policy;
mod seen;
pub mod select;
mod socket;
pub mod status;
mod supervise;
mod transport;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use agentmesh_controlplane::client::ClientError;
use agentmesh_proto::credential::Trust;
use libp2p::PeerId;
use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
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
    /// The engine, which a graceful stop waits for.
    engine: supervise::Tasks,
    /// Every other long-lived task, aborted once the engine is done.
    tasks: supervise::Tasks,
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

    /// The node's direct-connection counters now: upgrades by result,
    /// inbound direct connections refused by reason, direct connections
    /// open (the same numbers `/metrics` shows).
    pub fn direct_counts(&self) -> metrics::DirectCounts {
        self.node.metrics.direct.counts()
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
        let skew = i64::try_from(self.node.config.control_plane.credential_skew.as_secs())
            .unwrap_or(i64::MAX);
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

    /// Resolves with the failure if one of the node's long-lived tasks (the
    /// engine, the inbound-call acceptor, a local listener's server) ends
    /// or panics outside shutdown, naming the task and why (see
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
        let _ = tokio::time::timeout(limit, self.engine.join_all()).await;
        self.tasks.abort_all().await;
        if let Some(p) = &self.socket_path {
            let _ = tokio::fs::remove_file(p).await;
        }
    }
}

/// The yamux upgrade a member puts on every TCP and relayed connection,
/// with the receive-window limits of `connections` (`--yamux-max-streams`,
/// `--yamux-connection-window-kib`) and the member's bound on inbound
/// streams it buffers. For benches whose bare libp2p floor must mux as a
/// member does (`agentmesh-ladder bench`); an error names the limits yamux
/// cannot take.
pub fn member_yamux(
    connections: &config::ConnectionConfig,
) -> Result<agentmesh_streams::yamux::YamuxUpgrade, String> {
    transport::member_yamux(connections).map_err(|e| e.to_string())
}

fn validate(config: &Config) -> Result<(), SpawnError> {
    if config.routers.count == 0 {
        return Err(SpawnError::Config("--routers must be at least 1".into()));
    }
    if config.direct.allow_loopback_targets && !config.direct.enabled {
        return Err(SpawnError::Config(
            "--direct-allow-loopback-targets needs --direct=true (it is about punches)".into(),
        ));
    }
    if config.direct.transport != config::DirectTransport::Tcp && !config.direct.enabled {
        return Err(SpawnError::Config(
            "--direct-transport needs --direct=true (it is the transport of direct connections)"
                .into(),
        ));
    }
    let mut seen = HashSet::new();
    for (name, _) in &config.services.expose {
        if !seen.insert(name) {
            return Err(SpawnError::Config(format!(
                "service {name:?} exposed twice"
            )));
        }
    }
    for rule in &config.services.allow {
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
/// readiness follows (see [`NodeHandle::wait_ready`]). Metrics are registered in
/// `registry` when given (use a sub-registry with a label per node when
/// embedding many) and are also served on `--metrics-addr` when set; only
/// the served registry adds libp2p's own metrics (`libp2p_*`), so a fleet
/// embedded in one process does not carry those families per node.
///
/// Each subsystem builds itself from the config: the identity and the
/// control-plane client, enrollment, the local listeners (bound before
/// anything runs, so a taken port fails the start), the swarm, then the
/// tasks: the engine, the inbound-call acceptor and the listeners' servers,
/// each watched (`supervise`).
pub async fn spawn(
    config: Config,
    registry: Option<&mut Registry>,
) -> Result<NodeHandle, SpawnError> {
    validate(&config)?;
    // Before the first QUIC handshake could seed it on a runtime thread
    // (once per process: at once for the programs, which seed it before
    // their runtime starts, and for every node after the first embedded).
    agentmesh_runtime::entropy::seeded().await;
    let dir = config.data_dir.clone();
    let stored = tokio::task::spawn_blocking(move || identity::load_or_create(&dir))
        .await
        .map_err(|e| SpawnError::Config(format!("identity task: {e}")))??;
    let peer_id = stored.key.public().to_peer_id();
    let span = tracing::info_span!("node", peer = %peer_id);
    let client = enroll::client(&config.control_plane).await?;
    let mut metrics = metrics::Metrics::new();
    metrics.name_call_services(
        config.calls.max_metric_services,
        config
            .local
            .forward
            .iter()
            .map(|(_, service)| service.as_str()),
    );
    let (credential, keys) = enroll::obtain(&client, &config, &stored, &metrics)
        .instrument(span.clone())
        .await?;
    let listeners = listeners::Listeners::bind(&config).await?;
    let swarm = transport::build(&config, &stored.key, &metrics).await?;
    let mut served = listeners::register_metrics(&config, &metrics, &swarm, registry, &listeners);
    let mut control = swarm.behaviour().stream.new_control();
    let (incoming, streams) = engine::Streams::accept(&mut control)?;

    let (cmd_tx, cmd_rx) = mpsc::channel(command::COMMAND_QUEUE);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (status_tx, _) = watch::channel(NodeStatus::default());
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
        forwards: listeners.forwards(),
        seen: Default::default(),
        policy: member_policy,
    });
    let watched = |node: &node::Node| {
        supervise::Tasks::new(
            node.status.clone(),
            node.shutdown.clone(),
            node.metrics.routers.ready.clone(),
            span.clone(),
        )
    };
    let (mut engine_task, mut tasks) = (watched(&node), watched(&node));
    let p2p = served.p2p.take();
    engine::spawn(node.clone(), swarm, cmd_rx, streams, p2p, &mut engine_task);
    call::inbound::spawn(node.clone(), incoming, &mut tasks);
    let addrs = listeners.spawn(node.clone(), served, &mut tasks);
    Ok(NodeHandle {
        node,
        shutdown_tx,
        engine: engine_task,
        tasks,
        metrics_addr: addrs.metrics,
        socket_path: addrs.socket,
        forward_addrs: addrs.forwards,
    })
}
