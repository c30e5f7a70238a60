//! Starts the control plane, mints the tokens, starts the routers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentmesh_controlplane as cp;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use agentmesh_router as router;

/// How long the member token `agentmesh-one` writes stays valid.
const MEMBER_TOKEN_TTL: Duration = Duration::from_secs(30 * 86_400);
/// How many members may enroll with that token.
const MEMBER_TOKEN_USES: u32 = 100_000;
/// How long a router token stays valid (routers re-enroll with their key
/// without spending a use, so a restart does not need a new one).
const ROUTER_TOKEN_TTL: Duration = Duration::from_secs(30 * 86_400);

/// Longest wait for the routers' drain on stop: their drain grace (the
/// default, which these routers run with) plus time to close.
pub const DRAIN_LIMIT: Duration =
    Duration::from_secs(router::config::DEFAULT_DRAIN_GRACE_SECS + 10);

/// What to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// Folder for the SQLite file, router keys and the member token.
    pub data_dir: PathBuf,
    /// Number of routers.
    pub routers: usize,
    /// Control plane gRPC address (port 0 picks one).
    pub grpc_addr: SocketAddr,
    /// Control plane HTTP address (port 0 picks one).
    pub http_addr: SocketAddr,
    /// First router's TCP port; router i listens on base + i (0: any free port).
    pub router_base_port: u16,
    /// First router's metrics port; router i serves on base + i (0: any free port).
    pub router_metrics_base_port: u16,
    /// Policy file the control plane applies at start; `None`: the
    /// built-in allow-all policy when the database holds none yet.
    pub policy: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./agentmesh-data"),
            routers: 2,
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 7400)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7401)),
            router_base_port: 7410,
            router_metrics_base_port: 7420,
            policy: None,
        }
    }
}

/// Why the mesh could not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The data dir or a token file could not be written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being written.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The control plane did not start.
    #[error("control plane: {0}")]
    ControlPlane(String),
    /// A router did not start.
    #[error("router {index}: {reason}")]
    Router {
        /// Which router.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// The running mesh.
pub struct OneHandle {
    /// The control plane.
    pub control_plane: cp::Handle,
    /// The routers, in order.
    pub routers: Vec<router::RouterHandle>,
    /// URL members use to reach the control plane.
    pub control_plane_url: String,
    /// File holding the member bootstrap token.
    pub token_file: PathBuf,
    /// The member token itself.
    pub member_token: String,
    /// File holding the admin bearer token (policy and revocation
    /// commands, `--admin-token-file`).
    pub admin_token_file: PathBuf,
}

impl OneHandle {
    /// Drains every router at once (go-away DRAINING to its members, a last
    /// lease; each ends once no member is left or after its drain grace)
    /// and waits for all of them, at most `limit`. Returns how many
    /// finished their drain in time.
    pub async fn drain(&self, limit: Duration) -> usize {
        for r in &self.routers {
            r.drain();
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut drained = 0;
        for r in &self.routers {
            let mut done = r.drained();
            if let Ok(Ok(_)) = tokio::time::timeout_at(deadline, done.wait_for(|d| *d)).await {
                drained += 1;
            }
        }
        drained
    }

    /// What runs where and how to join, one line each (what the binary
    /// prints at start).
    pub fn banner(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "control plane  {} (http://{}/info)",
            self.control_plane_url,
            self.control_plane.http_addr()
        );
        for (i, r) in self.routers.iter().enumerate() {
            let metrics = r
                .metrics_addr()
                .map_or("-".into(), |a| format!("http://{a}/metrics"));
            let addrs: Vec<String> = r.listen_addrs().iter().map(|a| a.to_string()).collect();
            let _ = writeln!(
                out,
                "router {i}       {} {} metrics {metrics}",
                r.peer_id(),
                addrs.join(",")
            );
        }
        let p = self.control_plane.policy();
        let s = p.summary();
        let what = if p.is_allow_all() {
            "allow-all: every member may provide and call every service (--policy FILE to enforce one)".to_string()
        } else if p.is_none() {
            "none applied: every call is denied".to_string()
        } else {
            format!(
                "{} groups, {} owner rules, {} grants, applied by {} from {}",
                s.groups, s.owners, s.grants, p.applied_by, p.applied_from
            )
        };
        let _ = writeln!(
            out,
            "policy         version {}: {what} (http://{}/policy)",
            p.version,
            self.control_plane.http_addr()
        );
        let _ = writeln!(out, "member token   {}", self.token_file.display());
        let _ = writeln!(
            out,
            "admin token    {} (e.g. agentmesh-control-plane policy show --control-plane {} --admin-token-file {})",
            self.admin_token_file.display(),
            self.control_plane_url,
            self.admin_token_file.display()
        );
        let _ = writeln!(
            out,
            "join with      agentmesh-node run --control-plane {} --token-file {} --data-dir ./my-node --routers {}",
            self.control_plane_url,
            self.token_file.display(),
            self.routers.len().min(2)
        );
        out
    }

    /// Stops routers, then the control plane.
    pub async fn shutdown(self) {
        for r in self.routers {
            r.shutdown().await;
        }
        self.control_plane.shutdown().await;
    }
}

/// Starts the control plane and `config.routers` routers; returns once every
/// router has bound its listeners (readiness follows, see the handles).
pub async fn spawn(config: Config) -> Result<OneHandle, SpawnError> {
    let data = config.data_dir.clone();
    create_dir(&data).await?;
    let db = data.join("controlplane.db");
    let admin_token_file = data.join("admin-token");
    let admin_token = admin_token(&admin_token_file).await?;
    let cp_config = cp::Config {
        grpc_addr: config.grpc_addr,
        http_addr: config.http_addr,
        db: format!("sqlite://{}", db.display()),
        policy_allow_all: config.policy.is_none(),
        policy: config.policy.clone(),
        admin_token: Some(admin_token),
        ..cp::Config::default()
    };
    let control_plane = cp::spawn(cp_config)
        .await
        .map_err(|e| SpawnError::ControlPlane(e.to_string()))?;
    let control_plane_url = format!("http://{}", control_plane.grpc_addr());

    let router_token = control_plane
        .create_token(
            TokenKind::Bootstrap,
            Role::Router,
            BTreeMap::new(),
            config.routers.max(1) as u32,
            ROUTER_TOKEN_TTL,
        )
        .await
        .map_err(|e| SpawnError::ControlPlane(format!("minting the router token: {e}")))?;
    let member_token = control_plane
        .create_token(
            TokenKind::Bootstrap,
            Role::Member,
            BTreeMap::new(),
            MEMBER_TOKEN_USES,
            MEMBER_TOKEN_TTL,
        )
        .await
        .map_err(|e| SpawnError::ControlPlane(format!("minting the member token: {e}")))?;
    let token_file = data.join("token");
    write_secret(&token_file, &member_token).await?;

    let mut routers = Vec::with_capacity(config.routers);
    for index in 0..config.routers {
        let port = offset_port(config.router_base_port, index);
        let metrics_port = offset_port(config.router_metrics_base_port, index);
        let dir = data.join(format!("router-{index}"));
        create_dir(&dir).await?;
        let rc = router::Config {
            control_plane: router::config::ControlPlaneConfig {
                url: control_plane_url.clone(),
                token: router_token.clone(),
                ..Default::default()
            },
            key_path: dir.join("router.key"),
            listen: vec![format!("/ip4/127.0.0.1/tcp/{port}").parse().map_err(|e| {
                SpawnError::Router {
                    index,
                    reason: format!("listen address: {e}"),
                }
            })?],
            metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], metrics_port))),
            // Process-wide gauges (runtime stalls, jemalloc's totals) once,
            // on the first router's /metrics: every router here shares them.
            runtime_watchdog: index == 0,
            ..router::Config::default()
        };
        let handle = router::spawn(rc).await.map_err(|e| SpawnError::Router {
            index,
            reason: e.to_string(),
        })?;
        routers.push(handle);
    }
    Ok(OneHandle {
        control_plane,
        routers,
        control_plane_url,
        token_file,
        member_token,
        admin_token_file,
    })
}

/// The admin token in `path`, or a new random one (256 bits, hex) written
/// there (mode 0600) when the file does not exist yet: a restart keeps the
/// token the operator already holds.
async fn admin_token(path: &Path) -> Result<String, SpawnError> {
    match tokio::fs::read_to_string(path).await {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SpawnError::Io {
                what: "reading",
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let bytes: [u8; 32] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_secret(path, &token).await?;
    Ok(token)
}

fn offset_port(base: u16, index: usize) -> u16 {
    if base == 0 {
        0
    } else {
        base.saturating_add(index as u16)
    }
}

async fn create_dir(path: &Path) -> Result<(), SpawnError> {
    tokio::fs::create_dir_all(path)
        .await
        .map_err(|source| SpawnError::Io {
            what: "creating",
            path: path.to_path_buf(),
            source,
        })
}

/// Writes a secret file readable by its owner only (0600).
async fn write_secret(path: &Path, contents: &str) -> Result<(), SpawnError> {
    let path_buf = path.to_path_buf();
    let contents = format!("{contents}\n");
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path_buf)?;
        f.write_all(contents.as_bytes())
    })
    .await
    .map_err(|e| SpawnError::Io {
        what: "writing",
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?
    .map_err(|source| SpawnError::Io {
        what: "writing",
        path: path.to_path_buf(),
        source,
    })
}
