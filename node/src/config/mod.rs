//! The node's configuration: data only, one section per subsystem, each
//! field one flag of `agentmesh-node run` (the command line converts its
//! flat flags once, `crate::cli::RunArgs::into_config`); defaults defined
//! once in each section's `Default`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod calls;
mod connections;
mod mesh;
mod services;

pub use calls::*;
pub use connections::*;
pub use mesh::*;
pub use services::*;

/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "agentmesh-node-data";
/// File name of the Unix socket inside the data dir.
pub const SOCKET_FILE: &str = "agentmesh.sock";
/// Least connect, exchange, RPC and idle timeout in force, whatever the
/// configuration says (a zero would fail every exchange at once).
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything `agentmesh-node run` can be told; every limit has a safe
/// default. Durations are `Duration`s: the command line converts its
/// `--*-secs` flags once (`crate::cli::RunArgs::into_config`). What every
/// subsystem shares is a field (the data dir, the deadlines of an
/// exchange); the rest is in the section of the subsystem that reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The control plane: URL, CA, token, RPC budgets, directory poll, credential skew.
    pub control_plane: ControlPlaneConfig,
    /// Data directory: key, credential, key set, Unix socket (`--data-dir`).
    pub data_dir: PathBuf,
    /// The routers held: K, selector, preference, replacement, policy pushes.
    pub routers: RoutersConfig,
    /// The services exposed, who may call them, their records' lifetime.
    pub services: ServicesConfig,
    /// The `--forward` listeners and the Unix socket.
    pub local: LocalConfig,
    /// HTTP listener for `/metrics` and `/readyz` (`--metrics-addr`); `None`: off.
    pub metrics_addr: Option<SocketAddr>,
    /// Deadline to connect to a router or a provider (`--connect-timeout-secs`,
    /// default 10 s). Read through [`Config::connect_timeout()`], which
    /// floors it at 1 s.
    pub connect_timeout: Duration,
    /// Deadline for a request/response exchange: auth, catalog, call set-up
    /// (`--call-timeout-secs`, default 10 s). Read through
    /// [`Config::call_timeout()`], which floors it at 1 s. An outbound call
    /// as a whole returns within connect + call timeout
    /// ([`Config::call_budget`]).
    pub call_timeout: Duration,
    /// Calls both ways: attempts, inbound bounds and shares, idle deadline, splice.
    pub calls: CallsConfig,
    /// Grace for in-flight calls on shutdown (`--shutdown-grace-secs`, default 10 s).
    pub shutdown_grace: Duration,
    /// Dials, idle and dead connections, stream and yamux bounds.
    pub connections: ConnectionConfig,
    /// Direct connections between members (`--direct`, `--listen-port`,
    /// `--listen-ip`): see [`DirectConfig`].
    pub direct: DirectConfig,
    /// Run the runtime stall watchdog and serve `agentmesh_runtime_stalls_total`
    /// on `metrics_addr`. One per process: the binary sets it; embedders
    /// running many nodes leave it off (default) and run their own.
    pub runtime_watchdog: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: ControlPlaneConfig::default(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            routers: RoutersConfig::default(),
            services: ServicesConfig::default(),
            local: LocalConfig::default(),
            metrics_addr: None,
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(10),
            calls: CallsConfig::default(),
            shutdown_grace: Duration::from_secs(10),
            connections: ConnectionConfig::default(),
            direct: DirectConfig::default(),
            runtime_watchdog: false,
        }
    }
}

impl Config {
    /// The Unix socket path in force, `None` when the socket is off.
    pub fn effective_socket_path(&self) -> Option<PathBuf> {
        if self.local.no_socket {
            return None;
        }
        Some(
            self.local
                .socket_path
                .clone()
                .unwrap_or_else(|| self.data_dir.join(SOCKET_FILE)),
        )
    }

    /// The connect timeout in force: [`Config::connect_timeout`], at least 1 s.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.max(MIN_TIMEOUT)
    }

    /// The exchange timeout in force: [`Config::call_timeout`], at least 1 s.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout.max(MIN_TIMEOUT)
    }

    /// The most one outbound call's set-up takes, from `call()` to its
    /// stream or error: connect timeout + call timeout. The lookup, every
    /// connect, every provider attempt and every retry (up to 3 route
    /// retries, plus one lookup retry after an empty lookup) share it; each
    /// step's own timeout is cut to what is left of it.
    pub fn call_budget(&self) -> Duration {
        self.connect_timeout() + self.call_timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_path_defaults_into_the_data_dir() {
        let mut c = Config {
            data_dir: PathBuf::from("/d"),
            ..Config::default()
        };
        assert_eq!(
            c.effective_socket_path(),
            Some(PathBuf::from("/d/agentmesh.sock"))
        );
        c.local.no_socket = true;
        assert_eq!(c.effective_socket_path(), None);
    }
}
