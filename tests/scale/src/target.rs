//! What the fleet runs against: a local mesh the ladder started, or a remote one.

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
        /// Member token file.
        token_file: PathBuf,
        /// Admin token for RotateKeyNow, if given.
        admin_token: Option<String>,
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

    /// The member token file.
    pub fn token_file(&self) -> PathBuf {
        match self {
            Self::Local(m) => m.member_token_file.clone(),
            Self::Remote { token_file, .. } => token_file.clone(),
        }
    }

    /// Routers in the mesh (local mode; 0 when unknown).
    pub fn router_count(&self) -> usize {
        match self {
            Self::Local(m) => m.routers.len(),
            Self::Remote { .. } => 0,
        }
    }

    /// Every router, now (empty in remote mode).
    pub async fn routers(&self) -> Vec<RouterSnapshot> {
        let Self::Local(m) = self else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, r) in m.routers.iter().enumerate() {
            out.push(observe::router(&r.name, r.metrics, m.router_pid(i)).await);
        }
        out
    }

    /// The control plane, now (None in remote mode).
    pub async fn control_plane(&self) -> Option<ControlPlaneRaw> {
        let Self::Local(m) = self else {
            return None;
        };
        Some(observe::control_plane(m.control_plane.http, m.control_plane_pid()).await)
    }

    /// The local mesh, or an error naming the option that needs one.
    pub fn local(&mut self, what: &str) -> Result<&mut LocalMesh> {
        match self {
            Self::Local(m) => Ok(m),
            Self::Remote { .. } => Err(LadderError::Args(format!("{what} needs local mode"))),
        }
    }

    /// Admin RotateKeyNow; returns the new key id.
    pub async fn rotate_key(&self) -> Result<String> {
        match self {
            Self::Local(m) => m.rotate_key().await,
            Self::Remote {
                url, admin_token, ..
            } => {
                let token = admin_token.as_deref().ok_or_else(|| {
                    LadderError::Args(
                        "--rotate-key-at in remote mode needs --admin-token-file".into(),
                    )
                })?;
                crate::mesh::rotate_key(url, token).await
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
