//! The control plane as a value: [`spawn`] binds, opens the database, has
//! each subsystem (gRPC server, HTTP, reapers and key check, policy check,
//! watch publisher) spawn its own tasks, and returns a [`Handle`]. Every
//! task is named and watched by the [`crate::supervisor`]: one that stops
//! outside a shutdown is reported through [`Handle::failed`] and makes
//! `/readyz` not ready. Dropping the handle aborts them all;
//! [`Handle::shutdown`] stops them gracefully within `--shutdown-grace-secs`.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use agentmesh_proto::{
    pb::credential::{Role, TokenKind},
    unix_now,
};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::{
    admin::TokenSpec,
    clock::{SharedClock, TokioClock},
    config::{Config, MIN_ADMIN_TOKEN_LEN},
    grpc_server,
    keys::{Keys, RotationPolicy},
    metrics::Metrics,
    policy::{Origin, StartPolicy},
    signed_policy::PolicyInForce,
    state::State,
    status::ServiceError,
    store::{AppliedPolicy, Db, Deleted, StoreError},
    supervisor::{SupervisorHandle, TaskFailure, TaskResult, Tasks},
};

pub use crate::spawn_error::SpawnError;
use crate::spawn_error::read_file;

/// A running control plane.
pub struct Handle {
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    state: Arc<State>,
    registry: Arc<Registry>,
    supervisor: SupervisorHandle,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("grpc_addr", &self.grpc_addr)
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, SpawnError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| SpawnError::Bind { addr, source })
}

/// Largest gRPC answer sent (see [`crate::grpc_server::MAX_RESPONSE_BYTES`]).
pub const MAX_RESPONSE_BYTES: usize = crate::grpc_server::MAX_RESPONSE_BYTES;

/// Starts a control plane with the real clock and its own metrics registry.
pub async fn spawn(config: Config) -> Result<Handle, SpawnError> {
    spawn_with(config, TokioClock::shared(), Registry::default()).await
}

/// Starts a control plane whose limiters read `clock` (tests share a
/// simulated clock with their clients).
pub async fn spawn_with_clock(config: Config, clock: SharedClock) -> Result<Handle, SpawnError> {
    spawn_with(config, clock, Registry::default()).await
}

/// The admin token, embedded or read from its file. Both paths hold it to
/// MIN_ADMIN_TOKEN_LEN: the embedded one in `Config::validate`, the file's
/// here once it is read.
async fn admin_token(config: &Config) -> Result<Option<String>, SpawnError> {
    match (&config.admin_token, &config.admin_token_file) {
        (Some(t), _) => Ok(Some(t.trim().to_string())),
        (None, Some(path)) => {
            let raw = read_file(path).await?;
            let t = String::from_utf8_lossy(&raw).trim().to_string();
            if t.len() < MIN_ADMIN_TOKEN_LEN {
                return Err(SpawnError::Config(format!(
                    "--admin-token-file {}: token must be at least {MIN_ADMIN_TOKEN_LEN} characters",
                    path.display()
                )));
            }
            Ok(Some(t))
        }
        (None, None) => Ok(None),
    }
}

/// Opens the database (options resolved off the runtime: they may read a
/// key file) behind the `--db-max-inflight` slots and the wait deadline.
async fn open_db(config: &Config, metrics: Metrics) -> Result<Db, SpawnError> {
    let store_config = config.clone();
    let options = tokio::task::spawn_blocking(move || store_config.store_options())
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    let store = crate::store::open(&options).await?;
    Ok(Db::new(
        store,
        config.db_max_inflight,
        Duration::from_secs(config.db_wait_timeout_secs),
        metrics,
    ))
}

/// Opens the database and the keys, binds both listeners and builds the
/// shared state; brings keys, reaped tables and the policy up to date.
async fn build_state(
    config: &Config,
    clock: SharedClock,
    registry: &mut Registry,
) -> Result<(Arc<State>, grpc_server::Bound, TcpListener), SpawnError> {
    // A `--policy` file is checked before the database is opened: a bad
    // one stops the start with nothing changed.
    let start_policy = StartPolicy::read(config).await?;
    let admin_token = admin_token(config).await?;
    let metrics = Metrics::new(registry);
    let db = open_db(config, metrics.clone()).await?;
    let policy = RotationPolicy {
        interval_secs: config.key_rotation_interval_secs as i64,
        publish_ahead_secs: config.key_publish_ahead_secs as i64,
        grace_secs: config.key_grace_secs as i64,
    };
    let keys = Keys::open(&db, policy, unix_now()).await?;
    let sections = config.sections();
    let grpc = grpc_server::Bound::bind(&sections.grpc).await?;
    let grpc_addr = grpc.local_addr(&sections.grpc)?;
    let http_listener = bind(sections.http.addr).await?;
    let scheme = if grpc.is_tls() { "https" } else { "http" };
    let public_url = config
        .public_url
        .clone()
        .map(|u| agentmesh_proto::proof::normalize_url(&u).to_string())
        .unwrap_or_else(|| format!("{scheme}://{grpc_addr}"));
    let state = State::new(
        config.clone(),
        public_url,
        db,
        keys,
        metrics,
        clock,
        admin_token,
    );
    // A control plane restarted past the deadline rotates now, not a tick later.
    state.check_keys_once().await?;
    // The first pass claims the reaper's duty like every later one: a
    // replica starting beside a holder leaves the work to it.
    let reaper = crate::duty::Duty::new(
        crate::store::REAPER_DUTY,
        Duration::from_secs(config.reap_interval_secs) * 3,
        state.metrics.clone(),
    );
    state.reap_if_duty(&reaper).await?;
    state.start_policy(start_policy).await?;
    Ok((state, grpc, http_listener))
}

/// Starts a control plane with a clock and a registry that may already hold
/// other metrics (the binary adds the runtime watchdog's); `/metrics` serves
/// all of it. Each subsystem spawns its own supervised tasks.
pub async fn spawn_with(
    config: Config,
    clock: SharedClock,
    mut registry: Registry,
) -> Result<Handle, SpawnError> {
    config.validate().map_err(SpawnError::Config)?;
    let sections = config.sections();
    let (state, grpc, http_listener) = build_state(&config, clock, &mut registry).await?;
    let grpc_addr = grpc.local_addr(&sections.grpc)?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|source| SpawnError::Bind {
            addr: sections.http.addr,
            source,
        })?;
    let mut tasks = Tasks::new();
    grpc_server::spawn(&sections.grpc, grpc, &state, &mut tasks).await?;
    crate::reaper::spawn(&sections.schedule, &state, &mut tasks);
    crate::replicas::spawn(&state, &mut tasks);
    crate::changes::spawn(&state, &mut tasks);
    crate::policy::watch::spawn(&state, &mut tasks);
    crate::watch::spawn(&state, &mut tasks);
    let registry = Arc::new(registry);
    crate::http::spawn(
        &sections.http,
        http_listener,
        state.clone(),
        registry.clone(),
        &mut tasks,
    );
    if let Some(after) = sections.fault_end_task_after {
        tasks.spawn("fault_injection", async move {
            tokio::time::sleep(after).await;
            Err(format!(
                "--fault-end-task-after-ms {} elapsed",
                after.as_millis()
            ))
        });
    }
    if let Some(addr) = config.pprof_addr {
        let bound = agentmesh_runtime::profiling::serve(addr).await?;
        tracing::info!(%bound, "profiling endpoint listening");
    }
    let public_url = &state.public_url;
    tracing::info!(%grpc_addr, %http_addr, %public_url, "control plane started");
    Ok(Handle {
        grpc_addr,
        http_addr,
        state,
        registry,
        supervisor: tasks.supervise(),
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

    /// The first long-lived task that stopped outside a shutdown, if any
    /// (then `/readyz` answers not ready).
    pub fn failure(&self) -> Option<TaskFailure> {
        self.supervisor.failure()
    }

    /// Waits until a long-lived task stops outside a shutdown: the
    /// embedding program should then stop (the binary exits non-zero).
    pub async fn failed(&self) -> TaskFailure {
        self.supervisor.failed().await
    }

    /// Supervises `task` beside the control plane's own tasks: when it ends
    /// outside a shutdown, it is reported like them. For an embedding
    /// program's tasks that the control plane's readiness depends on.
    pub async fn supervise<F>(&self, name: &'static str, task: F)
    where
        F: std::future::Future<Output = TaskResult> + Send + 'static,
    {
        self.supervisor.add(name, task).await;
    }

    /// Stops serving. First every Watch ends with a "move" status
    /// ([`crate::client::WatchMove::Stopping`]), so routers watch again on
    /// another replica while this one still answers; then the gRPC server
    /// stops accepting (its listener closes: new connections are refused at
    /// once), sends GOAWAY, and in-flight calls get `--shutdown-grace-secs`
    /// to finish; then every task is aborted.
    pub async fn shutdown(mut self) {
        let watchers = self.state.watch.watchers();
        self.state.watch.stop();
        tracing::info!(
            watchers,
            "stopping: watches sent to other replicas; finishing calls in flight"
        );
        let grace = Duration::from_secs(self.state.config.shutdown_grace_secs);
        if !self.supervisor.stop(grace).await {
            tracing::warn!("control plane tasks did not stop within the grace; aborting");
        }
    }
}
