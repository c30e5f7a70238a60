//! Flags the router and the node take alike.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Default `--control-plane`: `agentmesh-one`'s gRPC port on loopback.
pub const DEFAULT_CONTROL_PLANE: &str = "http://127.0.0.1:7400";

/// How a program reaches the control plane and proves who may enroll.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ControlPlaneArgs {
    /// Control-plane gRPC URL, http:// or https://.
    #[arg(long, default_value = DEFAULT_CONTROL_PLANE)]
    pub control_plane: String,
    /// PEM file of the CA that signs an https:// control plane's certificate (default: none, the system roots).
    #[arg(long)]
    pub control_plane_ca: Option<PathBuf>,
    /// A control-plane replica to dial, http:// or https://HOST:PORT, or dns+http(s)://NAME:PORT for every address NAME resolves to (a headless Service; resolved again every 30 s) (repeatable; default: none, --control-plane alone). Calls go to one replica and move to the next when it does not answer; --control-plane stays the one name proofs are bound to and TLS checks.
    #[arg(long = "control-plane-endpoint", value_name = "URL")]
    pub control_plane_endpoints: Vec<String>,
    /// File holding the enrollment token, router-role for a router; a node with a valid credential in its data dir needs none (default: none).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
}

/// `--token-file` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading --token-file {}: {source}", path.display())]
pub struct TokenFileError {
    /// The file named by the flag.
    pub path: PathBuf,
    /// Why it could not be read.
    pub source: std::io::Error,
}

impl ControlPlaneArgs {
    /// The token in `--token-file`, surrounding whitespace trimmed; empty
    /// without the flag.
    pub fn read_token(&self) -> Result<String, TokenFileError> {
        let Some(path) = &self.token_file else {
            return Ok(String::new());
        };
        std::fs::read_to_string(path)
            .map(|t| t.trim().to_string())
            .map_err(|source| TokenFileError {
                path: path.clone(),
                source,
            })
    }
}

/// The HTTP listeners beside a program's own traffic.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ListenerArgs {
    /// Address (IP:PORT) of the HTTP listener serving /metrics and the readiness probe /readyz (default: none, off).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Address (IP:PORT) serving CPU and heap profiles, binaries built with `--features pprof` only (default: none, off).
    #[arg(long)]
    pub pprof_addr: Option<SocketAddr>,
}

impl ListenerArgs {
    /// Starts the profiling listener if `--pprof-addr` was given; returns
    /// the bound address.
    pub async fn serve_pprof(
        &self,
    ) -> Result<Option<SocketAddr>, crate::profiling::ProfilingError> {
        match self.pprof_addr {
            Some(addr) => crate::profiling::serve(addr).await.map(Some),
            None => Ok(None),
        }
    }
}

/// How the program logs (every program takes it, before or after a
/// subcommand). The level is `RUST_LOG`'s, not a flag: one way to set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct LogArgs {
    /// Log line format on stderr: text or json, one JSON object per line (default: text; colours only on a terminal; level from RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
}

impl LogArgs {
    /// Installs the program's log ([`crate::logging::init`]).
    pub fn init(&self, default_filter: &str) {
        crate::logging::init(self.log_format, default_filter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_file_is_read_and_trimmed_and_a_missing_one_is_named() {
        let none = ControlPlaneArgs {
            control_plane: DEFAULT_CONTROL_PLANE.into(),
            control_plane_ca: None,
            control_plane_endpoints: Vec::new(),
            token_file: None,
        };
        assert_eq!(none.read_token().expect("no flag"), "");
        let path = std::env::temp_dir().join(format!("agentmesh-token-{}", std::process::id()));
        std::fs::write(&path, "  amt_secret\n").expect("write");
        let with = ControlPlaneArgs {
            token_file: Some(path.clone()),
            ..none.clone()
        };
        assert_eq!(with.read_token().expect("read"), "amt_secret");
        std::fs::remove_file(&path).expect("remove");
        let err = with.read_token().expect_err("gone");
        assert!(err.to_string().contains("--token-file"), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
