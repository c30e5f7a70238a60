//! The node's local listeners (`--metrics-addr`, every `--forward`, the
//! Unix socket): bound at start, before any task runs, so a taken port
//! fails [`crate::spawn`] with the listener's name; served by a watched
//! task each once the node is built. Also the registries the node's
//! metrics go to: the embedder's, and the one `--metrics-addr` serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, UnixListener};

use crate::SpawnError;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::supervise::Tasks;

/// The local listeners the config asks for, bound.
pub(crate) struct Listeners {
    metrics: Option<TcpListener>,
    forwards: Vec<(TcpListener, String)>,
    socket: Option<(UnixListener, PathBuf)>,
}

/// Where the listeners ended up bound.
pub(crate) struct Bound {
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) socket: Option<PathBuf>,
    pub(crate) forwards: Vec<SocketAddr>,
}

/// The registry `--metrics-addr` serves and what only it carries.
pub(crate) struct Served {
    registry: Option<Arc<Registry>>,
    /// libp2p's own metrics, recorded by the engine when served.
    pub(crate) p2p: Option<libp2p::metrics::Metrics>,
    /// The process's stall watchdog, when this node runs it.
    watchdog: Option<agentmesh_runtime::watchdog::StallMetrics>,
}

impl Listeners {
    /// Binds every listener `config` asks for.
    pub(crate) async fn bind(config: &Config) -> Result<Self, SpawnError> {
        let metrics = match config.metrics_addr {
            Some(a) => Some(
                TcpListener::bind(a)
                    .await
                    .map_err(|source| SpawnError::Bind {
                        what: format!("--metrics-addr {a}"),
                        source,
                    })?,
            ),
            None => None,
        };
        let mut forwards = Vec::new();
        for (addr, name) in &config.local.forward {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| SpawnError::Bind {
                    what: format!("--forward {addr}={name}"),
                    source,
                })?;
            forwards.push((l, name.clone()));
        }
        let socket = match config.effective_socket_path() {
            Some(p) => Some((
                crate::socket::bind(&p)
                    .await
                    .map_err(|source| SpawnError::Bind {
                        what: format!("--socket-path {}", p.display()),
                        source,
                    })?,
                p,
            )),
            None => None,
        };
        Ok(Self {
            metrics,
            forwards,
            socket,
        })
    }

    /// The `--forward` listeners' bound addresses and services.
    pub(crate) fn forwards(&self) -> Vec<(SocketAddr, String)> {
        self.forwards
            .iter()
            .filter_map(|(l, name)| l.local_addr().ok().map(|a| (a, name.clone())))
            .collect()
    }

    /// Serves every listener, each as a watched task; returns where they
    /// are bound.
    pub(crate) fn spawn(self, node: Arc<Node>, served: Served, tasks: &mut Tasks) -> Bound {
        let bound = Bound {
            metrics: self.metrics.as_ref().and_then(|l| l.local_addr().ok()),
            socket: self.socket.as_ref().map(|(_, p)| p.clone()),
            forwards: self.forwards().into_iter().map(|(a, _)| a).collect(),
        };
        if let Some(stalls) = served.watchdog {
            let probe = agentmesh_runtime::watchdog::spawn(stalls);
            tasks.spawn("watchdog", async move {
                // The probe runs until the node stops; aborting the tasks
                // aborts this waiter, and the guard aborts the probe with it.
                let _guard = AbortOnDrop(probe);
                std::future::pending::<()>().await;
            });
        }
        if let (Some(l), Some(reg)) = (self.metrics, served.registry) {
            tasks.spawn("metrics_http", crate::http::serve(node.clone(), reg, l));
        }
        let max_local = node.config.local.max_forward_connections;
        if let Some((l, _)) = self.socket {
            let limit = crate::local::Limit::new(max_local, "socket", &node.metrics);
            tasks.spawn("socket", crate::socket::serve(node.clone(), l, limit));
        }
        // One total for every --forward listener.
        let forward_limit = crate::local::Limit::new(max_local, "forward", &node.metrics);
        for (l, name) in self.forwards {
            let limit = forward_limit.clone();
            tasks.spawn(
                "forward",
                crate::forward::serve(node.clone(), l, name, limit),
            );
        }
        bound
    }
}

/// Registers the node's metrics (with the swarm's streams behaviour's:
/// `agentmesh_streams_inbound_dropped_total`,
/// `agentmesh_streams_pending_opens_refused_total`) in `registry` when
/// given, and in a registry of its own when `--metrics-addr` serves one,
/// which alone also carries libp2p's own families and (with
/// `runtime_watchdog`) the process's: an embedder running thousands of
/// nodes without `--metrics-addr` (the ladder) allocates none of them per
/// node.
pub(crate) fn register_metrics(
    config: &Config,
    metrics: &Metrics,
    swarm: &libp2p::Swarm<crate::transport::Behaviour>,
    registry: Option<&mut Registry>,
    listeners: &Listeners,
) -> Served {
    if let Some(r) = registry {
        metrics.register(r);
        swarm.behaviour().stream.register_metrics(r);
    }
    let mut served = Served {
        registry: None,
        p2p: None,
        watchdog: None,
    };
    if listeners.metrics.is_some() {
        let mut r = Registry::default();
        metrics.register(&mut r);
        swarm.behaviour().stream.register_metrics(&mut r);
        served.p2p = Some(libp2p::metrics::Metrics::new(&mut r));
        if config.runtime_watchdog {
            served.watchdog = Some(agentmesh_runtime::watchdog::StallMetrics::register(&mut r));
            // Same process-wide switch (the binary, whose allocator is
            // jemalloc): `agentmesh_runtime_allocator_*` gauges.
            agentmesh_runtime::allocator::register(&mut r);
        }
        served.registry = Some(Arc::new(r));
    }
    served
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
