//! The configuration as sections, one per subsystem, converted once from
//! the flat command line ([`Config`]: one clap flag per field, which tests
//! and embedding programs also fill). Each subsystem's `spawn` takes its own
//! section, so what it reads is visible in its signature and units are
//! typed (`Duration`, not a count of seconds).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::Config;

/// The gRPC server: listener, TLS and transport bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcServerConfig {
    /// `--grpc-addr`.
    pub addr: SocketAddr,
    /// `--tls-cert` and `--tls-key`: serve TLS when both are given.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `--grpc-max-connections`.
    pub max_connections: usize,
    /// `--grpc-max-concurrent-streams-per-connection`.
    pub max_streams_per_connection: usize,
    /// `--grpc-keepalive-interval-secs`.
    pub keepalive_interval: Duration,
    /// `--grpc-keepalive-timeout-secs`.
    pub keepalive_timeout: Duration,
    /// `--grpc-max-connection-age-secs` (0: none).
    pub max_connection_age: Option<Duration>,
    /// `--grpc-handshake-timeout-secs`.
    pub handshake_timeout: Duration,
    /// `--grpc-max-message-bytes`.
    pub max_message_bytes: usize,
}

/// The periodic tasks' schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// `--reap-interval-secs`.
    pub reap_interval: Duration,
    /// `--key-check-interval-secs`.
    pub key_check_interval: Duration,
}

/// The HTTP server: `/info`, `/policy`, `/metrics`, `/healthz`, `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpConfig {
    /// `--http-addr`.
    pub addr: SocketAddr,
    /// `--db-unready-after-secs`: how long the database must fail every
    /// ping before `/readyz` says not ready.
    pub db_unready_after: Duration,
}

/// Every section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sections {
    /// The gRPC server.
    pub grpc: GrpcServerConfig,
    /// The HTTP server.
    pub http: HttpConfig,
    /// The reaper and the key check.
    pub schedule: ScheduleConfig,
    /// `--fault-end-task-after-ms` (testing only).
    pub fault_end_task_after: Option<Duration>,
}

impl Config {
    /// The sections of this configuration (call after [`Config::validate`]).
    pub fn sections(&self) -> Sections {
        let secs = Duration::from_secs;
        Sections {
            grpc: GrpcServerConfig {
                addr: self.grpc_addr,
                tls: self.tls_cert.clone().zip(self.tls_key.clone()),
                max_connections: self.grpc_max_connections,
                max_streams_per_connection: self.grpc_max_concurrent_streams_per_connection,
                keepalive_interval: secs(self.grpc_keepalive_interval_secs),
                keepalive_timeout: secs(self.grpc_keepalive_timeout_secs),
                max_connection_age: (self.grpc_max_connection_age_secs > 0)
                    .then(|| secs(self.grpc_max_connection_age_secs)),
                handshake_timeout: secs(self.grpc_handshake_timeout_secs),
                max_message_bytes: self.grpc_max_message_bytes,
            },
            http: HttpConfig {
                addr: self.http_addr,
                db_unready_after: secs(self.db_unready_after_secs),
            },
            schedule: ScheduleConfig {
                reap_interval: secs(self.reap_interval_secs),
                key_check_interval: secs(self.key_check_interval_secs),
            },
            fault_end_task_after: self.fault_end_task_after_ms.map(Duration::from_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_carry_the_flags_in_their_units() {
        let c = Config {
            grpc_max_connection_age_secs: 0,
            reap_interval_secs: 7,
            fault_end_task_after_ms: Some(250),
            ..Config::default()
        };
        let s = c.sections();
        assert_eq!(s.grpc.addr, c.grpc_addr);
        assert_eq!(s.grpc.max_connection_age, None);
        assert_eq!(s.grpc.tls, None);
        assert_eq!(s.schedule.reap_interval, Duration::from_secs(7));
        assert_eq!(s.fault_end_task_after, Some(Duration::from_millis(250)));
        let c = Config {
            grpc_max_connection_age_secs: 30,
            ..Config::default()
        };
        assert_eq!(
            c.sections().grpc.max_connection_age,
            Some(Duration::from_secs(30))
        );
    }
}
