//! Circuits the relay library drops without telling us.
//!
//! libp2p-relay's connection handler keeps at most 10 STOP handshakes in
//! flight per destination connection; the 11th outbound STOP stream is
//! dropped with only a `WARN` log ("Dropping outbound stream because we are
//! at capacity") and no behaviour event, so the circuit fails at its source
//! after a timeout. A provider called by many members at once loses
//! circuits there (the 10,003-member ladder logged it). This module turns
//! that log event into counts: the binary installs [`capacity_layer`] in
//! its subscriber, and the router registers the counters when it runs in
//! the binary (`Config::runtime_watchdog`, the process-wide switch):
//!
//! - `agentmesh_router_refused_total{resource="circuit",scope="peer",protocol="relay_stop"}`
//!   (with circuits refused by `--circuits-per-destination`), and
//! - `agentmesh_router_relay_stop_dropped_total`: only these drops.

use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tracing::field::{Field, Visit};
use tracing::{Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Context;

/// Where libp2p-relay's handler logs from.
const TARGET: &str = "libp2p_relay::behaviour::handler";
/// Its message when it drops an outbound STOP stream at capacity.
const MESSAGE: &str = "Dropping outbound stream because we are at capacity";

/// The refusal series a drop counts in.
pub(crate) const RELAY_STOP_REFUSAL: [(&str, &str); 3] = [
    ("resource", "circuit"),
    ("scope", "peer"),
    ("protocol", "relay_stop"),
];

/// The counters a drop increments (refusal, drop), once per process.
static COUNTERS: OnceLock<(Counter, Counter)> = OnceLock::new();

/// Registers `agentmesh_router_relay_stop_dropped_total` and makes drops
/// count into it and into `refused` (the relay_stop circuit refusal
/// series). First call per process wins (one binary, one router).
pub(crate) fn register(registry: &mut Registry, refused: Counter) {
    let dropped = Counter::default();
    registry.register(
        "agentmesh_router_relay_stop_dropped",
        "Outbound relay STOP streams libp2p-relay dropped because 10 STOP handshakes \
         to the same destination connection were in flight (circuit lost)",
        dropped.clone(),
    );
    let _ = COUNTERS.set((refused, dropped));
}

/// A tracing layer that counts libp2p-relay's STOP-capacity drops (see the
/// module doc); install it next to the log layer in the binary.
pub fn capacity_layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    CapacityLayer.with_filter(Targets::new().with_target(TARGET, Level::WARN))
}

struct CapacityLayer;

/// Finds the event's message.
struct IsDrop(bool);

impl Visit for IsDrop {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" && value.contains(MESSAGE) {
            self.0 = true;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}").contains(MESSAGE) {
            self.0 = true;
        }
    }
}

impl<S: Subscriber> Layer<S> for CapacityLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut v = IsDrop(false);
        event.record(&mut v);
        if v.0
            && let Some((refused, dropped)) = COUNTERS.get()
        {
            refused.inc();
            dropped.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn the_relay_drop_warning_counts_and_nothing_else_does() {
        let mut reg = Registry::default();
        let refused = Counter::default();
        register(&mut reg, refused.clone());
        let (_, dropped) = COUNTERS.get().expect("registered");
        let base = (refused.get(), dropped.get());
        let sub = tracing_subscriber::registry().with(capacity_layer());
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(target: "libp2p_relay::behaviour::handler", "Dropping outbound stream because we are at capacity");
            // Same handler, other warning; same text, other target.
            tracing::warn!(target: "libp2p_relay::behaviour::handler", "Dropping inbound stream because we are at capacity");
            tracing::warn!(target: "libp2p_relay::behaviour", "Dropping outbound stream because we are at capacity");
            tracing::warn!(target: "libp2p_relay::behaviour::handler", "Dropping outbound stream because we are at capacity");
        });
        assert_eq!(refused.get() - base.0, 2);
        assert_eq!(dropped.get() - base.1, 2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        assert!(
            text.contains("agentmesh_router_relay_stop_dropped_total"),
            "{text}"
        );
    }
}
