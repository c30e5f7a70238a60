//! Local mode: a control plane and N routers as child processes on free
//! loopback ports, with their tokens minted through the admin API. With
//! `--control-plane-tls` the control plane serves gRPC over TLS with a
//! certificate made for the run, and everything that talks to it is given
//! that certificate as its CA. With a [`Placement`] (`--hosts`) each
//! program runs on a host of its own instead, on fixed ports of that host's
//! address.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use tokio::process::Child;

use crate::binaries::Binaries;
use crate::children;
use crate::config::LocalConfig;
use crate::control_planes::ControlPlanes;
use crate::error::{LadderError, Result};
use crate::placement::{self, Placement};
use crate::ports;

/// Grace for a child to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
/// Token lifetime: long enough for any ladder.
pub(crate) const TOKEN_TTL_SECS: u64 = 7 * 24 * 3600;
/// Router token uses: every router start (and restart) may enroll once.
const ROUTER_TOKEN_USES: u32 = 1_000;
/// The control plane's default `--lease-ttl-secs` (the ladder links only
/// its client, not its configuration).
const CONTROL_PLANE_LEASE_TTL_SECS: u64 = 30;

/// What happened to a router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterState {
    /// Running.
    Running,
    /// SIGKILLed by the ladder.
    Killed,
    /// SIGTERMed (draining or gone) by the ladder.
    Drained,
}

/// A router child.
pub struct RouterProc {
    /// `r0`, `r1`…
    pub name: String,
    child: Child,
    /// Its `/metrics` and `/readyz` listener.
    pub metrics: SocketAddr,
    /// Its libp2p TCP port.
    pub listen_port: u16,
    /// Running, killed or drained.
    pub state: RouterState,
}

/// Every router stopped at once ([`LocalMesh::stop_all_routers`]).
#[derive(Debug, Clone, Copy)]
pub struct AllStopped {
    /// SIGTERM → the last router process gone.
    pub exited_after: Duration,
    /// Routers SIGKILLed after the deadline.
    pub killed: u64,
}

/// One router ready again ([`LocalMesh::start_all_routers`]).
#[derive(Debug, Clone)]
pub struct RouterReady {
    /// `r0`, `r1`…
    pub name: String,
    /// From the start of all routers until this one answered `/readyz`.
    pub after: Duration,
    /// When it was ready, Unix ms (the clock the workers share).
    pub unix_ms: u64,
}

/// A running local mesh.
pub struct LocalMesh {
    bins: Binaries,
    cfg: LocalConfig,
    /// The run's directory.
    pub dir: PathBuf,
    /// The control plane's replicas (one unless `--control-planes`).
    pub control_planes: ControlPlanes,
    /// The routers, in start order.
    pub routers: Vec<RouterProc>,
    /// The admin bearer token.
    pub admin_token: String,
    /// A member token file good for `member_uses` members.
    pub member_token_file: PathBuf,
    /// The routers' enrollment token file.
    router_token_file: PathBuf,
    /// `--revoke-token-at`: the file and id of the token some members
    /// enroll with (see `hold::policy`).
    pub revocable_token: Option<(PathBuf, String)>,
    /// The control plane's self-signed certificate (`--control-plane-tls`),
    /// the CA of everything that talks to it.
    ca_file: Option<PathBuf>,
    /// Where each program runs (`None`: here, on loopback).
    place: Option<Placement>,
    /// When the ladder's RotateKeyNow calls were made, Unix seconds.
    pub admin_rotations_unix: Vec<i64>,
}

impl LocalMesh {
    /// Starts the control plane, mints tokens, starts the routers and waits until all are ready.
    pub async fn start(
        bins: Binaries,
        cfg: LocalConfig,
        dir: &Path,
        member_uses: u64,
    ) -> Result<Self> {
        Self::start_placed(bins, cfg, dir, member_uses, None).await
    }

    /// [`LocalMesh::start`] with each program where `place` says (`None`:
    /// here, on loopback). The caller's runtime must reach those hosts.
    pub async fn start_placed(
        bins: Binaries,
        cfg: LocalConfig,
        dir: &Path,
        member_uses: u64,
        place: Option<Placement>,
    ) -> Result<Self> {
        let admin_token = children::random_hex(32);
        let admin_file = children::write_secret(&dir.join("admin.token"), &admin_token)?;
        let (control_planes, ca_file) =
            ControlPlanes::start(&bins, &cfg, dir, place.as_ref(), &admin_file).await?;
        let client = admin_client_at(
            &control_planes.url(),
            &control_planes.endpoints(),
            read_ca(ca_file.as_deref())?,
        )?;
        let router_token = mint(
            &client,
            &admin_token,
            TokenKind::Bootstrap,
            Role::Router,
            ROUTER_TOKEN_USES,
        )
        .await?;
        let router_token_file = children::write_secret(&dir.join("router.token"), &router_token)?;
        let uses = u32::try_from(member_uses)
            .map_err(|_| LadderError::Args(format!("{member_uses} members do not fit a token")))?;
        let member_token = mint(
            &client,
            &admin_token,
            TokenKind::Ephemeral,
            Role::Member,
            uses,
        )
        .await?;
        let member_token_file = children::write_secret(&dir.join("member.token"), &member_token)?;

        let mut mesh = Self {
            bins,
            cfg,
            dir: dir.to_path_buf(),
            control_planes,
            routers: Vec::new(),
            admin_token,
            member_token_file,
            router_token_file,
            revocable_token: None,
            ca_file,
            place,
            admin_rotations_unix: Vec::new(),
        };
        for i in 0..mesh.cfg.routers {
            let (metrics, port) = match &mesh.place {
                Some(p) => (
                    p.router(i).at(placement::ROUTER_METRICS_PORT),
                    placement::ROUTER_PORT,
                ),
                None => (ports::free_addr()?, ports::free_port()?),
            };
            let r = mesh.start_router(i, metrics, port).await?;
            mesh.routers.push(r);
        }
        Ok(mesh)
    }

    /// Starts router `i` on the given ports (its key file is `r{i}.key` in
    /// the run's directory, so a restart keeps its PeerId).
    async fn start_router(
        &self,
        i: usize,
        metrics: SocketAddr,
        listen_port: u16,
    ) -> Result<RouterProc> {
        let name = format!("r{i}");
        let mut args = vec![
            "--control-plane".to_string(),
            self.url(),
            "--token-file".to_string(),
            self.router_token_file.display().to_string(),
            "--key-path".to_string(),
            self.dir.join(format!("{name}.key")).display().to_string(),
            "--listen".to_string(),
            format!("/ip4/{}/tcp/{listen_port}", metrics.ip()),
            "--metrics-addr".to_string(),
            metrics.to_string(),
        ];
        if self.cfg.routers_quic {
            // QUIC members dial routers over QUIC where they offer it (the
            // UDP mapping they observe is the one a QUIC punch uses).
            args.extend([
                "--listen".to_string(),
                format!("/ip4/{}/udp/{listen_port}/quic-v1", metrics.ip()),
            ]);
        }
        if let Some(ca) = &self.ca_file {
            args.extend(["--control-plane-ca".to_string(), ca.display().to_string()]);
        }
        // Every router lists the replicas in the same order: their Watch
        // streams start on the first, so the others hold none (what a
        // change sent through an unwatched replica needs).
        for e in self.control_planes.endpoints() {
            args.extend(["--control-plane-endpoint".to_string(), e]);
        }
        args.extend(self.cfg.router_args.iter().cloned());
        let log = self.dir.join(format!("{name}.log"));
        let at = self
            .place
            .as_ref()
            .map(|p| p.router(i).prefix.clone())
            .unwrap_or_default();
        let mut child = children::spawn_at(&at, &self.bins.router, &args, &log)?;
        let deadline = Duration::from_secs(self.cfg.ready_deadline_secs);
        children::wait_ready(
            &format!("router {name}"),
            &mut child,
            metrics,
            deadline,
            &log,
        )
        .await?;
        Ok(RouterProc {
            name,
            child,
            metrics,
            listen_port,
            state: RouterState::Running,
        })
    }

    /// The control plane's gRPC URL (with replicas, the one URL all serve).
    pub fn url(&self) -> String {
        self.control_planes.url()
    }

    /// The replicas' own addresses to dial (none with one control plane).
    pub fn endpoints(&self) -> Vec<String> {
        self.control_planes.endpoints()
    }

    /// An admin client dialling every replica, starting with replica
    /// `first` (the one the call is meant to go through).
    pub fn admin_client_via(&self, first: usize) -> Result<Client> {
        let mut endpoints = self.endpoints();
        let n = endpoints.len();
        if n > 0 {
            endpoints.rotate_left(first % n);
        }
        admin_client_at(&self.url(), &endpoints, read_ca(self.ca_file.as_deref())?)
    }

    /// An admin client dialling every replica, the first replica first.
    pub fn admin_client(&self) -> Result<Client> {
        self.admin_client_via(0)
    }

    /// What the run's monitor watches: the routers' leases and, on
    /// PostgreSQL, the database.
    pub fn monitor_config(&self) -> crate::replicas::monitor::MonitorConfig {
        use crate::replicas::config::{arg_value, is_postgres_url};
        let ttl = arg_value(&self.cfg.control_plane_args, "--lease-ttl-secs")
            .and_then(|v| v.parse().ok())
            .unwrap_or(CONTROL_PLANE_LEASE_TTL_SECS);
        let psql = self
            .cfg
            .control_plane_db
            .as_deref()
            .filter(|u| is_postgres_url(u))
            .map(|u| {
                crate::postgres::psql::Psql::new(
                    self.cfg.postgres_bin_dir.as_deref(),
                    u,
                    &self.cfg.control_plane_env,
                )
            });
        crate::replicas::monitor::MonitorConfig {
            routers: self
                .routers
                .iter()
                .map(|r| (r.name.clone(), r.metrics))
                .collect(),
            lease_ttl: Duration::from_secs(ttl),
            psql,
        }
    }

    /// Where each program runs, when not all here (`--hosts`).
    pub fn placement(&self) -> Option<&Placement> {
        self.place.as_ref()
    }

    /// The control plane's certificate, when it serves TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.ca_file.clone()
    }

    /// Router names by PeerId, read from their key files (a router writes
    /// its key on first start; one not readable yet is left out).
    pub fn router_names(&self) -> std::collections::BTreeMap<String, String> {
        self.routers
            .iter()
            .filter_map(|r| {
                let bytes = std::fs::read(self.dir.join(format!("{}.key", r.name))).ok()?;
                let key =
                    agentmesh_proto::identity::Keypair::from_protobuf_encoding(&bytes).ok()?;
                Some((key.public().to_peer_id().to_string(), r.name.clone()))
            })
            .collect()
    }

    /// The database server's pid, when the ladder started one.
    pub fn store_server_pid(&self) -> Option<u32> {
        self.cfg.store_server_pid
    }

    /// The first control-plane replica's pid.
    pub fn control_plane_pid(&self) -> Option<u32> {
        self.control_planes.first().pid()
    }

    /// A router's pid (None once it has exited).
    pub fn router_pid(&self, i: usize) -> Option<u32> {
        self.routers.get(i).and_then(|r| r.child.id())
    }

    /// The first program that exited without the ladder stopping it (the
    /// control plane, or a router neither killed nor drained): its name,
    /// pid and log. Reaps it; `shutdown` still works after.
    pub fn exited_unexpectedly(&mut self) -> Option<(String, Option<u32>, PathBuf)> {
        let gone = |child: &mut Child| {
            let pid = child.id();
            (!matches!(child.try_wait(), Ok(None))).then_some(pid)
        };
        if let Some(cp) = self.control_planes.exited_unexpectedly() {
            return Some(cp);
        }
        self.routers
            .iter_mut()
            .filter(|r| r.state == RouterState::Running)
            .find_map(|r| {
                let pid = gone(&mut r.child)?;
                let log = self.dir.join(format!("{}.log", r.name));
                Some((format!("router {}", r.name), pid, log))
            })
    }

    /// SIGKILLs router `i`.
    pub async fn kill_router(&mut self, i: usize) -> Result<()> {
        let r = self.router_mut(i)?;
        r.child
            .start_kill()
            .map_err(|e| LadderError::io(format!("killing {}", r.name), e))?;
        let _ = tokio::time::timeout(STOP_GRACE, r.child.wait()).await;
        r.state = RouterState::Killed;
        Ok(())
    }

    /// SIGTERMs router `i` (it drains, then exits on its own).
    pub fn drain_router(&mut self, i: usize) -> Result<()> {
        let r = self.router_mut(i)?;
        let pid = r
            .child
            .id()
            .ok_or_else(|| LadderError::Process(format!("{} already exited", r.name)))?;
        children::sigterm(pid)?;
        r.state = RouterState::Drained;
        Ok(())
    }

    /// Whether killed or drained routers are started again (`--restart-routers`).
    pub fn restarts_routers(&self) -> bool {
        self.cfg.restart_routers
    }

    /// Starts a killed or drained router `i` again with the same key and
    /// ports, once its old process is gone (a draining router is given its
    /// grace to exit first); returns the time until it was ready again.
    pub async fn restart_router(&mut self, i: usize) -> Result<Duration> {
        let start = tokio::time::Instant::now();
        let (metrics, listen_port) = {
            let r = self.router_mut(i)?;
            if r.state == RouterState::Running {
                return Err(LadderError::Process(format!("{} is running", r.name)));
            }
            children::stop(&mut r.child, STOP_GRACE).await;
            (r.metrics, r.listen_port)
        };
        let fresh = self.start_router(i, metrics, listen_port).await?;
        self.routers[i] = fresh;
        Ok(start.elapsed())
    }

    /// SIGTERMs every running router at once (each drains, as in a
    /// rollout or an `agentmesh-one` restart) and waits until every router
    /// process has exited; one still running after `deadline` is SIGKILLed.
    pub async fn stop_all_routers(&mut self, deadline: Duration) -> Result<AllStopped> {
        let start = tokio::time::Instant::now();
        for r in self
            .routers
            .iter_mut()
            .filter(|r| r.state == RouterState::Running)
        {
            if let Some(pid) = r.child.id() {
                children::sigterm(pid)?;
            }
            r.state = RouterState::Drained;
        }
        let end = start + deadline;
        let mut killed = 0;
        for r in &mut self.routers {
            if tokio::time::timeout_at(end, r.child.wait()).await.is_err() {
                killed += 1;
                let _ = r.child.start_kill();
                let _ = tokio::time::timeout(STOP_GRACE, r.child.wait()).await;
            }
        }
        Ok(AllStopped {
            exited_after: start.elapsed(),
            killed,
        })
    }

    /// Starts every stopped router again at once, each with its key and
    /// ports, and waits until each is ready; returns when each was ready,
    /// in router order. Routers that started are kept (and stopped at
    /// shutdown) even when another failed, whose error is returned.
    pub async fn start_all_routers(&mut self) -> Result<Vec<RouterReady>> {
        let start = tokio::time::Instant::now();
        let stopped: Vec<(usize, SocketAddr, u16)> = self
            .routers
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state != RouterState::Running)
            .map(|(i, r)| (i, r.metrics, r.listen_port))
            .collect();
        let this = &*self;
        let starts = stopped.into_iter().map(|(i, metrics, port)| async move {
            let r = this.start_router(i, metrics, port).await?;
            let ready = RouterReady {
                name: r.name.clone(),
                after: start.elapsed(),
                unix_ms: crate::propagation::unix_ms(),
            };
            Ok::<_, LadderError>((i, r, ready))
        });
        let mut ready = Vec::new();
        let mut failed = None;
        for started in futures::future::join_all(starts).await {
            match started {
                Ok((i, r, at)) => {
                    self.routers[i] = r;
                    ready.push(at);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(ready),
        }
    }

    fn router_mut(&mut self, i: usize) -> Result<&mut RouterProc> {
        self.routers
            .get_mut(i)
            .ok_or_else(|| LadderError::Args(format!("no router {i}")))
    }

    /// Stops the control plane (SIGTERM) and starts it again on the same
    /// ports and database; returns the time until it was ready again.
    pub async fn restart_control_plane(&mut self) -> Result<Duration> {
        self.control_planes.restart(0).await
    }

    /// Admin RotateKeyNow through any replica; returns the new key id.
    pub async fn rotate_key(&mut self) -> Result<String> {
        self.admin_rotations_unix.push(agentmesh_proto::unix_now());
        rotate_key_with(&self.admin_client()?, &self.admin_token).await
    }

    /// Stops every router and the control plane.
    pub async fn shutdown(mut self) {
        for r in &mut self.routers {
            children::stop(&mut r.child, STOP_GRACE).await;
        }
        self.control_planes.shutdown().await;
    }
}

/// Admin RotateKeyNow against `url`; returns the new key id.
/// (`ca_pem`: the CA of an `https://` control plane, if not the system roots).
pub async fn rotate_key(url: &str, ca_pem: Option<Vec<u8>>, admin_token: &str) -> Result<String> {
    rotate_key_with(&admin_client(url, ca_pem)?, admin_token).await
}

/// Admin RotateKeyNow with `client`; returns the new key id.
async fn rotate_key_with(client: &Client, admin_token: &str) -> Result<String> {
    client
        .rotate_key_now(admin_token)
        .await
        .map(|r| r.key_id)
        .map_err(|e| LadderError::Grpc {
            call: "RotateKeyNow",
            status: e.to_string(),
        })
}

pub(crate) fn admin_client(url: &str, ca_pem: Option<Vec<u8>>) -> Result<Client> {
    admin_client_at(url, &[], ca_pem)
}

/// An admin client for the control plane at `url` dialling `endpoints`
/// (its replicas; empty: `url` itself), moving to the next when one does
/// not answer.
pub(crate) fn admin_client_at(
    url: &str,
    endpoints: &[String],
    ca_pem: Option<Vec<u8>>,
) -> Result<Client> {
    Client::with_endpoints(
        ClientConfig {
            url: url.to_string(),
            ca_pem,
            retry_budget: Duration::from_secs(60),
            ..ClientConfig::default()
        },
        agentmesh_controlplane::Connections::Held,
        endpoints,
    )
    .map_err(|e| LadderError::Grpc {
        call: "client",
        status: e.to_string(),
    })
}

async fn mint(
    client: &Client,
    admin: &str,
    kind: TokenKind,
    role: Role,
    max_uses: u32,
) -> Result<String> {
    let req = CreateTokenRequest {
        kind: kind as i32,
        role: role as i32,
        labels: Vec::new(),
        max_uses,
        ttl_secs: TOKEN_TTL_SECS,
    };
    client
        .create_token(admin, req)
        .await
        .map(|r| r.token)
        .map_err(|e| LadderError::Grpc {
            call: "CreateToken",
            status: e.to_string(),
        })
}

/// Reads a PEM CA file, if one is given.
pub(crate) fn read_ca(path: Option<&Path>) -> Result<Option<Vec<u8>>> {
    path.map(|p| {
        std::fs::read(p).map_err(|e| LadderError::io(format!("reading {}", p.display()), e))
    })
    .transpose()
}
