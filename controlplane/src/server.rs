//! The control plane as a value: [`spawn`] binds, opens the database, starts
//! every task and returns a [`Handle`]. Every task lives in the handle's
//! `JoinSet`, so dropping the handle aborts them; [`Handle::shutdown`] stops
//! them gracefully within `--shutdown-grace-secs`.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use agentmesh_proto::{
    pb::{
        FILE_DESCRIPTOR_SET,
        controlplane::control_plane_server::ControlPlaneServer,
        credential::{Role, TokenKind},
    },
    unix_now,
};
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, sync::watch, task::JoinSet};
use tonic::{
    service::Routes,
    transport::{Identity, Server, ServerTlsConfig},
};

use crate::{
    admin::TokenSpec,
    clock::{SharedClock, TokioClock},
    config::{Config, MIN_ADMIN_TOKEN_LEN},
    grpc_limits::{BoundedIncoming, Handshakes, StreamLimit},
    http::{HttpState, router},
    keys::{Keys, RotationPolicy},
    malformed::Malformed,
    metrics::Metrics,
    policy::{Origin, PolicyStartError, StartPolicy, watch::run_policy_check},
    reaper::{run_key_check, run_reaper},
    service::Service,
    signed_policy::PolicyInForce,
    state::State,
    status::ServiceError,
    store::{AppliedPolicy, Db, Deleted, StoreError},
};

/// Why the control plane did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A file (TLS, admin token) could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// TLS setup failed.
    #[error("tls: {0}")]
    Tls(String),
    /// The profiling listener could not start.
    #[error("profiling: {0}")]
    Profiling(#[from] agentmesh_runtime::profiling::ProfilingError),
    /// The database could not be opened or initialised.
    #[error("database: {0}")]
    Store(#[from] StoreError),
    /// The policy stopped the start (a `--policy` file that does not pass,
    /// or a database with members and no policy and no flag choosing one).
    #[error("policy: {0}")]
    Policy(#[from] PolicyStartError),
}

/// A running control plane.
pub struct Handle {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    state: Arc<State>,
    registry: Arc<Registry>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

async fn read_file(path: &std::path::Path) -> Result<Vec<u8>, SpawnError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| SpawnError::Read {
            path: path.display().to_string(),
            source,
        })
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, SpawnError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| SpawnError::Bind { addr, source })
}

/// Largest gRPC answer sent: tonic clients (ours among them) refuse to decode
/// more than 4 MiB by default, so a larger answer could never be read.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Descriptors kept aside for the database, the HTTP listener and the rest.
const FD_HEADROOM: u64 = 256;

/// Warns when the open-files limit cannot hold `--grpc-max-connections`:
/// accepting then fails with `EMFILE` first (counted and survived, but
/// clients see refused connections below the configured bound). Reads the
/// soft limit from `/proc/self/limits` (Linux; elsewhere it says nothing).
async fn warn_if_fd_limit_below(max_connections: usize) {
    let Ok(limits) = tokio::fs::read_to_string("/proc/self/limits").await else {
        return;
    };
    let soft: Option<u64> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    let need = (max_connections as u64).saturating_add(FD_HEADROOM);
    if let Some(soft) = soft.filter(|s| *s < need) {
        tracing::warn!(
            open_files_limit = soft,
            grpc_max_connections = max_connections,
            "the open-files limit is below --grpc-max-connections + {FD_HEADROOM}: raise it \
             (ulimit -n) or lower the flag; accept errors show in grpc_accept_errors_total"
        );
    }
}

/// Starts a control plane with the real clock and its own metrics registry.
pub async fn spawn(config: Config) -> Result<Handle, SpawnError> {
    spawn_with(config, TokioClock::shared(), Registry::default()).await
}

/// Starts a control plane whose limiters read `clock` (tests share a
/// simulated clock with their clients).
pub async fn spawn_with_clock(config: Config, clock: SharedClock) -> Result<Handle, SpawnError> {
    spawn_with(config, clock, Registry::default()).await
}

/// Starts a control plane with a clock and a registry that may already hold
/// other metrics (the binary adds the runtime watchdog's); `/metrics` serves
/// all of it.
pub async fn spawn_with(
    config: Config,
    clock: SharedClock,
    mut registry: Registry,
) -> Result<Handle, SpawnError> {
    config.validate().map_err(SpawnError::Config)?;
    // A `--policy` file is checked before the database is opened: a bad
    // one stops the start with nothing changed.
    let start_policy = StartPolicy::read(&config).await?;
    // Both paths hold the token to MIN_ADMIN_TOKEN_LEN: the embedded one in
    // `Config::validate` above, the file here once it is read.
    let admin_token = match (&config.admin_token, &config.admin_token_file) {
        (Some(t), _) => Some(t.trim().to_string()),
        (None, Some(path)) => {
            let raw = read_file(path).await?;
            let t = String::from_utf8_lossy(&raw).trim().to_string();
            if t.len() < MIN_ADMIN_TOKEN_LEN {
                return Err(SpawnError::Config(format!(
                    "--admin-token-file {}: token must be at least {MIN_ADMIN_TOKEN_LEN} characters",
                    path.display()
                )));
            }
            Some(t)
        }
        (None, None) => None,
    };
    let store_config = config.clone();
    let options = tokio::task::spawn_blocking(move || store_config.store_options())
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    let store = crate::store::open(&options).await?;
    let metrics = Metrics::new(&mut registry);
    let db = Db::new(
        store,
        config.db_max_inflight,
        Duration::from_secs(config.db_wait_timeout_secs),
        metrics.clone(),
    );
    let policy = RotationPolicy {
        interval_secs: config.key_rotation_interval_secs as i64,
        publish_ahead_secs: config.key_publish_ahead_secs as i64,
        grace_secs: config.key_grace_secs as i64,
    };
    let keys = Keys::open(&db, policy, unix_now()).await?;

    let grpc_listener = bind(config.grpc_addr).await?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| SpawnError::Bind {
            addr: config.grpc_addr,
            source,
        })?;
    let http_listener = bind(config.http_addr).await?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| SpawnError::Bind {
            addr: config.http_addr,
            source,
        })?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(c), Some(k)) => Some(Identity::from_pem(read_file(c).await?, read_file(k).await?)),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let public_url = config
        .public_url
        .clone()
        .map(|u| agentmesh_proto::proof::normalize_url(&u).to_string())
        .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));

    let registry = Arc::new(registry);
    let state = State::new(
        config.clone(),
        public_url.clone(),
        db,
        keys,
        metrics,
        clock,
        admin_token,
    );
    // A control plane restarted past the deadline rotates now, not a tick later.
    state.check_keys_once().await?;
    state.reap_once().await?;
    state.start_policy(start_policy).await?;

    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();

    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_serving::<ControlPlaneServer<Service>>().await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| SpawnError::Config(format!("reflection: {e}")))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| SpawnError::Config(format!("reflection: {e}")))?;
    let max_streams = config.grpc_max_concurrent_streams_per_connection;
    let handshake_timeout = Duration::from_secs(config.grpc_handshake_timeout_secs);
    // HTTP/2 keepalive closes a connection whose peer stopped answering
    // PINGs (vanished laptop, dropped NAT mapping), freeing its slot. TCP
    // keepalive is not set: tonic applies it only to listeners it binds
    // itself, and the PINGs find the same dead peers sooner, through TLS.
    let mut builder = Server::builder()
        .max_concurrent_streams(Some(
            u32::try_from(max_streams.saturating_mul(2)).unwrap_or(u32::MAX),
        ))
        .http2_keepalive_interval(Some(Duration::from_secs(
            config.grpc_keepalive_interval_secs,
        )))
        .http2_keepalive_timeout(Some(Duration::from_secs(
            config.grpc_keepalive_timeout_secs,
        )));
    // Idle members' connections are what the control plane holds per
    // member (see DEFAULT_GRPC_MAX_CONNECTION_AGE_SECS); no grace: a
    // connection with a call in flight (a router's Watch) stays until the
    // call ends, which a Watch does at its credential's expiry.
    if config.grpc_max_connection_age_secs > 0 {
        builder =
            builder.max_connection_age(Duration::from_secs(config.grpc_max_connection_age_secs));
    }
    if let Some(identity) = tls {
        crate::tls::ensure_crypto_provider();
        builder = builder
            .tls_config(
                ServerTlsConfig::new()
                    .identity(identity)
                    .timeout(handshake_timeout),
            )
            .map_err(|e| SpawnError::Tls(e.to_string()))?;
    }
    // Requests are refused past --grpc-max-message-bytes before they are
    // read (OUT_OF_RANGE); answers are held to what tonic clients decode by
    // default, so an oversized answer fails here with a clear status.
    let max_request = config.grpc_max_message_bytes;
    let control_plane = ControlPlaneServer::new(Service::new(state.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    // Requests tonic refuses before a handler (undecodable, too large) are
    // answered, counted and charged to their source there.
    let control_plane = Malformed::new(control_plane, state.clone());
    let health_svc = health_svc
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let reflection_v1 = reflection_v1
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let reflection_v1alpha = reflection_v1alpha
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let routes = Routes::new(control_plane)
        .add_service(health_svc)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .prepare();
    let handshakes = Arc::new(Handshakes::default());
    let grpc = StreamLimit::new(
        routes,
        max_streams,
        handshakes.clone(),
        state.metrics.clone(),
    );
    warn_if_fd_limit_below(config.grpc_max_connections).await;
    let incoming = BoundedIncoming::new(
        grpc_listener,
        state.limits.connection_slots(),
        handshake_timeout,
        handshakes,
        state.metrics.clone(),
        state.limits.refusal_log(),
    );
    let mut grpc_stop = stop_rx.clone();
    tasks.spawn(async move {
        let shutdown = async move {
            let _ = grpc_stop.changed().await;
        };
        if let Err(e) = builder
            .serve_with_incoming_shutdown(grpc, incoming, shutdown)
            .await
        {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });

    let app = router(HttpState {
        state: state.clone(),
        registry: registry.clone(),
    });
    let mut http_stop = stop_rx.clone();
    tasks.spawn(async move {
        let shutdown = async move {
            let _ = http_stop.changed().await;
        };
        if let Err(e) = axum::serve(http_listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    tasks.spawn(run_reaper(state.clone(), stop_rx.clone()));
    tasks.spawn(run_policy_check(state.clone(), stop_rx.clone()));
    tasks.spawn(crate::watch::run_watch_publisher(
        state.clone(),
        stop_rx.clone(),
    ));
    tasks.spawn(run_key_check(state.clone(), stop_rx));
    if let Some(addr) = config.pprof_addr {
        let bound = agentmesh_runtime::profiling::serve(addr).await?;
        tracing::info!(%bound, "profiling endpoint listening");
    }
    tracing::info!(%grpc_addr, %http_addr, %public_url, "control plane started");
    Ok(Handle {
        grpc_addr,
        http_addr,
        state,
        registry,
        stop,
        tasks,
    })
}

impl Handle {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The endpoint string members sign (and the URL clients should use).
    pub fn public_url(&self) -> &str {
        &self.state.public_url
    }

    /// The admin bearer token, if admin RPCs are enabled.
    pub fn admin_token(&self) -> Option<&str> {
        self.state.admin_token.as_deref()
    }

    /// The metrics registry (to serve it elsewhere or read it in tests).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Mints a token (shown once) without going through gRPC.
    pub async fn create_token(
        &self,
        kind: TokenKind,
        role: Role,
        labels: BTreeMap<String, String>,
        max_uses: u32,
        ttl: Duration,
    ) -> Result<String, ServiceError> {
        let spec = TokenSpec {
            kind,
            role,
            labels,
            max_uses,
            ttl_secs: ttl.as_secs(),
        };
        Ok(self.state.mint_token(spec).await?.0)
    }

    /// Writes a consistent copy of the database to the new file `to` (`VACUUM INTO`).
    pub async fn backup_to(&self, to: &std::path::Path) -> Result<(), StoreError> {
        let to = to.to_path_buf();
        self.state
            .db
            .run(self.state.db.store().backup_to(&to))
            .await
    }

    /// The policy in force.
    pub fn policy(&self) -> std::sync::Arc<PolicyInForce> {
        self.state.policy_in_force()
    }

    /// Checks `text` and applies it as the next policy version (unless it
    /// is the text in force), as an admin call would, without gRPC.
    pub async fn apply_policy(&self, text: &str) -> Result<AppliedPolicy, ServiceError> {
        let origin = Origin {
            by: "embedding program".into(),
            from: "in-process".into(),
        };
        Ok(self.state.apply_policy(text, origin).await?.0)
    }

    /// Runs one reaper pass now; returns what it deleted.
    pub async fn reap_now(&self) -> Result<Deleted, StoreError> {
        self.state.reap_once().await
    }

    /// Runs one key-rotation check now; returns the new key id if it rotated.
    pub async fn check_keys_now(&self) -> Result<Option<String>, StoreError> {
        self.state.check_keys_once().await
    }

    /// Stops serving: in-flight calls get `--shutdown-grace-secs`, then
    /// every task is aborted.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let grace = Duration::from_secs(self.state.config.shutdown_grace_secs);
        let drained = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("control plane tasks did not stop within the grace; aborting");
            self.tasks.abort_all();
        }
    }
}
