//! What the local listeners (the Unix socket, every `--forward`) count.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::*;

/// What the local listeners (the Unix socket, every `--forward`) count.
#[derive(Clone, Debug, Default)]
pub struct LocalMetrics {
    /// Failed `accept()`s of local listeners (e.g. out of file
    /// descriptors), each followed by a growing pause, by listener.
    pub accept_errors: Family<ListenerLabel, Counter>,
    /// Local connections open (each holds a slot of its listener's bound),
    /// by listener.
    pub local_connections_active: Family<ListenerLabel, Gauge>,
    /// Local connections that waited for a slot because their listener's
    /// bound (`--max-forward-connections`) was reached, by listener.
    pub local_connection_waits: Family<ListenerLabel, Counter>,
}

impl LocalMetrics {
    /// Registers each metric in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "accept_errors",
            "Failed accepts of local listeners (e.g. out of file descriptors), each followed by a growing pause, by listener",
            self.accept_errors.clone(),
        );
        r.register(
            "local_connections_active",
            "Local connections open (Unix socket, or all --forward listeners together), by listener",
            self.local_connections_active.clone(),
        );
        r.register(
            "local_connection_waits",
            "Local connections that waited for a slot because --max-forward-connections was reached, by listener",
            self.local_connection_waits.clone(),
        );
    }
}
