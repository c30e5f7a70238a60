//! What the fleet runs against: a local mesh the ladder started, or a remote one.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::{LadderError, Result};
use crate::mesh::LocalMesh;
use crate::observe::{self, ControlPlaneRaw, RouterSnapshot};

/// The mesh under test.
pub enum Target {
    /// Started by the ladder: every event and every snapshot is available.
    Local(Box<LocalMesh>),
    /// An existing mesh: the fleet only (and RotateKeyNow with an admin token).
    Remote {
        /// Control-plane gRPC URL.
        url: String,
        /// PEM CA of an `https://` control plane.
        ca_file: Option<PathBuf>,
        /// Member token file.
        token_file: PathBuf,
        /// Admin token for RotateKeyNow, if given.
        admin_token: Option<String>,
        /// Routers' `/metrics` addresses.
        router_metrics: Vec<SocketAddr>,
        /// The control plane's HTTP address.
        control_plane_http: Option<SocketAddr>,
    },
}

impl Target {
    /// The control plane's gRPC URL.
    pub fn url(&self) -> String {
        match self {
            Self::Local(m) => m.url(),
            Self::Remote { url, .. } => url.clone(),
        }
    }

    /// The control plane's replicas to dial (`--control-plane-endpoint`;
    /// empty: the URL alone).
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Self::Local(m) => m.endpoints(),
            Self::Remote { .. } => Vec::new(),
        }
    }

    /// The PEM CA members and admin calls trust the control plane with, if
    /// it serves TLS with its own CA.
    pub fn ca_file(&self) -> Option<PathBuf> {
        match self {
            Self::Local(m) => m.ca_file(),
            Self::Remote { ca_file, .. } => ca_file.clone(),
        }
    }

    /// The member token file.
    pub fn token_file(&self) -> PathBuf {
        match self {
            Self::Local(m) => m.member_token_file.clone(),
            Self::Remote { token_file, .. } => token_file.clone(),
        }
    }

    /// Routers in the mesh (remote mode: those whose metrics were given).
    pub fn router_count(&self) -> usize {
        match self {
            Self::Local(m) => m.routers.len(),
            Self::Remote { router_metrics, .. } => router_metrics.len(),
        }
    }

    /// Every router, now (remote mode: from their `/metrics` only).
    pub async fn routers(&self) -> Vec<RouterSnapshot> {
        let mut out = Vec::new();
        match self {
            Self::Local(m) => {
                for (i, r) in m.routers.iter().enumerate() {
                    out.push(observe::router(&r.name, r.metrics, m.router_pid(i)).await);
                }
            }
            Self::Remote { router_metrics, .. } => {
                for (i, addr) in router_metrics.iter().enumerate() {
                    out.push(observe::router(&format!("r{i}"), *addr, None).await);
                }
            }
        }
        out
    }

    /// The control plane, now (remote mode: only with its HTTP address;
    /// with replicas, all of them added up).
    pub async fn control_plane(&self) -> Option<ControlPlaneRaw> {
        match self {
            Self::Local(m) => {
                let store = m.store_server_pid();
                let set = &m.control_planes;
                let reads = set.replicas.iter().enumerate().map(|(i, r)| {
                    let http = (!set.is_stopped(i)).then_some(r.http);
                    observe::control_plane(http, r.pid(), store)
                });
                let parts = futures::future::join_all(reads).await;
                Some(observe::merge_control_planes(parts))
            }
            Self::Remote {
                control_plane_http, ..
            } => match control_plane_http {
                Some(a) => Some(observe::control_plane(Some(*a), None, None).await),
                None => None,
            },
        }
    }

    /// The command prefix of each fleet worker's host, when the mesh runs
    /// on hosts of its own (`--hosts`); empty otherwise.
    pub fn worker_prefixes(&self) -> Vec<Vec<std::ffi::OsString>> {
        match self {
            Self::Local(m) => m
                .placement()
                .map(|p| p.workers.iter().map(|w| w.prefix.clone()).collect())
                .unwrap_or_default(),
            Self::Remote { .. } => Vec::new(),
        }
    }

    /// The local mesh, or an error naming the option that needs one.
    pub fn local(&mut self, what: &str) -> Result<&mut LocalMesh> {
        match self {
            Self::Local(m) => Ok(m),
            Self::Remote { .. } => Err(LadderError::Args(format!("{what} needs local mode"))),
        }
    }

    /// The local mesh when it starts stopped routers again
    /// (`--restart-routers`), else `None`.
    pub fn restarting(&mut self) -> Option<&mut LocalMesh> {
        match self {
            Self::Local(m) if m.restarts_routers() => Some(m),
            _ => None,
        }
    }

    /// Admin RotateKeyNow; returns the new key id.
    pub async fn rotate_key(&mut self) -> Result<String> {
        match self {
            Self::Local(m) => m.rotate_key().await,
            Self::Remote {
                url,
                admin_token,
                ca_file,
                ..
            } => {
                let token = admin_token.as_deref().ok_or_else(|| {
                    LadderError::Args(
                        "--rotate-key-at in remote mode needs --admin-token-file".into(),
                    )
                })?;
                let ca = crate::mesh::read_ca(ca_file.as_deref())?;
                crate::mesh::rotate_key(url, ca, token).await
            }
        }
    }

    /// Stops what the ladder started.
    pub async fn shutdown(self) {
        if let Self::Local(m) = self {
            m.shutdown().await;
        }
    }
}
