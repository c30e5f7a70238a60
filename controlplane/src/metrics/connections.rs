//! The gRPC listener's metrics: open connections and those closed at
//! accept, preempted, timed out before a call, or failed to accept.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone)]
pub(super) struct ConnectionMetrics {
    pub(super) grpc_connections: Gauge,
    pub(super) grpc_connections_refused: Counter,
    pub(super) grpc_connections_preempted: Counter,
    pub(super) grpc_accept_errors: Counter,
    pub(super) grpc_handshake_timeouts: Counter,
}

impl ConnectionMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            grpc_connections: Gauge::default(),
            grpc_connections_refused: Counter::default(),
            grpc_connections_preempted: Counter::default(),
            grpc_accept_errors: Counter::default(),
            grpc_handshake_timeouts: Counter::default(),
        };
        r.register(
            "grpc_connections",
            "Open gRPC connections (bounded by --grpc-max-connections)",
            m.grpc_connections.clone(),
        );
        r.register(
            "grpc_connections_refused",
            "gRPC connections closed at accept: --grpc-max-connections were open and this \
             source already held its share",
            m.grpc_connections_refused.clone(),
        );
        r.register(
            "grpc_connections_preempted",
            "gRPC connections closed because all --grpc-max-connections were open and a \
             source holding fewer took the busiest source's oldest",
            m.grpc_connections_preempted.clone(),
        );
        r.register(
            "grpc_accept_errors",
            "gRPC accept errors (e.g. out of file descriptors); the listener keeps serving",
            m.grpc_accept_errors.clone(),
        );
        r.register(
            "grpc_handshake_timeouts",
            "gRPC connections closed because no call arrived within \
             --grpc-handshake-timeout-secs of accept (TLS handshake, HTTP/2 preface, first call)",
            m.grpc_handshake_timeouts.clone(),
        );
        m
    }
}
