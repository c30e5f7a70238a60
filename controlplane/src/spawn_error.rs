//! Why the control plane did not start, and reading the files it needs
//! at start with that error.

use std::net::SocketAddr;

use crate::{policy::PolicyStartError, store::StoreError};

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

/// Reads a file named by a flag (TLS, admin token).
pub(crate) async fn read_file(path: &std::path::Path) -> Result<Vec<u8>, SpawnError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| SpawnError::Read {
            path: path.display().to_string(),
            source,
        })
}
