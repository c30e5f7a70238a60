//! `agentmesh-router`: flags map 1:1 onto `agentmesh_router::Config`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_router::config::{self as d, Config};
use anyhow::Context;
use clap::Parser;
use libp2p::Multiaddr;

#[global_allocator]
static ALLOC: agentmesh_runtime::Allocator = agentmesh_runtime::Allocator;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "agentmesh router: admits members, relays circuits, hosts the catalog"
)]
struct Args {
    #[arg(long, default_value = d::DEFAULT_CONTROL_PLANE)]
    control_plane: String,
    #[arg(long)]
    control_plane_ca: Option<PathBuf>,
    /// File holding the router-role enrollment token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[arg(long, default_value = d::DEFAULT_KEY_PATH)]
    key_path: PathBuf,
    #[arg(long, default_value = d::DEFAULT_LISTEN)]
    listen: Vec<Multiaddr>,
    #[arg(long)]
    external_addr: Vec<Multiaddr>,
    #[arg(long = "label", value_parser = agentmesh_proto::credential::parse_label)]
    labels: Vec<(String, String)>,
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Serve CPU and heap profiles here (binaries built with `--features pprof`).
    #[arg(long)]
    pprof_addr: Option<SocketAddr>,
    #[arg(long, default_value_t = d::DEFAULT_AUTH_DEADLINE_SECS)]
    auth_deadline_secs: u64,
    /// Admitted members before go-away and trimming (default: sized from the
    /// memory budget, see --high-watermark-memory-percent).
    #[arg(long)]
    high_watermark: Option<u32>,
    /// Share of the memory budget the default high watermark fills with idle
    /// members, percent; the rest is headroom for circuits, calls and transit.
    #[arg(long, default_value_t = d::DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    high_watermark_memory_percent: u8,
    /// Trimming sheds down to this many members (default: 15% below --high-watermark).
    #[arg(long)]
    low_watermark: Option<u32>,
    #[arg(long, default_value_t = d::DEFAULT_DRAIN_GRACE_SECS)]
    drain_grace_secs: u64,
    /// Accept POST /drain on the metrics listener from any address (default:
    /// loopback only, e.g. kubectl port-forward; others get 403). Only where
    /// the listener is protected otherwise.
    #[arg(long)]
    drain_http_allow_remote: bool,
    #[arg(long, default_value_t = d::DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS)]
    goaway_max_concurrent_streams: usize,
    #[arg(long, default_value_t = d::DEFAULT_GOAWAY_RETRY_AFTER_SECS)]
    goaway_retry_after_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_TRIM_CLOSE_GRACE_SECS)]
    trim_close_grace_secs: u64,
    #[arg(long)]
    relay_max_reservations: Option<usize>,
    /// Relay reservations one peer may hold at once (at least 1).
    #[arg(
        long,
        default_value_t = d::DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    relay_max_reservations_per_peer: usize,
    #[arg(long, default_value_t = d::DEFAULT_RELAY_MAX_CIRCUITS)]
    relay_max_circuits: usize,
    #[arg(long, default_value_t = d::DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER)]
    relay_max_circuits_per_peer: usize,
    #[arg(long, default_value_t = d::DEFAULT_RELAY_CIRCUIT_DURATION_SECS)]
    relay_circuit_duration_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_RELAY_CIRCUIT_BYTES)]
    relay_circuit_bytes: u64,
    #[arg(long, default_value_t = d::DEFAULT_RELAY_RESERVATION_DURATION_SECS)]
    relay_reservation_duration_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_LEASE_INTERVAL_SECS)]
    lease_interval_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_CLOCK_SKEW_SECS)]
    clock_skew_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_STREAM_TIMEOUT_SECS)]
    stream_timeout_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_AUTH_MAX_INFLIGHT_STREAMS)]
    auth_max_inflight_streams: usize,
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS)]
    catalog_max_inflight_streams: usize,
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_RECORDS)]
    catalog_max_records: usize,
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_MAX_RESULTS)]
    catalog_max_results: usize,
    /// Time one member lookup may spend asking other routers, ms; the answer
    /// carries what arrived by then (0: this router's own records only).
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS)]
    catalog_remote_lookup_budget_ms: u64,
    /// How long a search's provider routers are reused by later lookups of
    /// the same service, ms (0: never; concurrent lookups share one search).
    #[arg(long, default_value_t = d::DEFAULT_CATALOG_PROVIDER_CACHE_MS)]
    catalog_provider_cache_ms: u64,
    #[arg(long, default_value_t = d::DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS)]
    idle_connection_timeout_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS)]
    control_plane_retry_budget_secs: u64,
    #[arg(long, default_value_t = d::DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS)]
    control_plane_rpc_timeout_secs: u64,
    /// Inbound streams per protocol waiting for its accept loop (at least 1);
    /// more are dropped and counted in agentmesh_streams_inbound_dropped_total.
    #[arg(
        long,
        default_value_t = d::DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_inbound_queue_per_protocol: usize,
    /// Stream opens that may wait for a dial to one peer (at least 1); more
    /// are refused and counted in
    /// agentmesh_streams_pending_opens_refused_total{limit="per_peer"}.
    #[arg(
        long,
        default_value_t = agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together (at least
    /// 1); more are refused and counted with limit="total".
    #[arg(
        long,
        default_value_t = agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    stream_max_pending_opens_total: usize,
    #[command(flatten)]
    resources: agentmesh_router::resource_config::ResourceArgs,
}

impl Args {
    fn into_config(self, token: String) -> Config {
        let s = Duration::from_secs;
        Config {
            control_plane: self.control_plane,
            control_plane_ca: self.control_plane_ca,
            token,
            key_path: self.key_path,
            listen: self.listen,
            external_addr: self.external_addr,
            labels: self.labels.into_iter().collect::<BTreeMap<_, _>>(),
            metrics_addr: self.metrics_addr,
            auth_deadline: s(self.auth_deadline_secs),
            high_watermark: self.high_watermark,
            high_watermark_memory_percent: self.high_watermark_memory_percent,
            low_watermark: self.low_watermark,
            drain_grace: s(self.drain_grace_secs),
            drain_http_allow_remote: self.drain_http_allow_remote,
            goaway_max_concurrent_streams: self.goaway_max_concurrent_streams,
            goaway_retry_after: s(self.goaway_retry_after_secs),
            trim_close_grace: s(self.trim_close_grace_secs),
            relay_max_reservations: self.relay_max_reservations,
            relay_max_reservations_per_peer: self.relay_max_reservations_per_peer,
            relay_max_circuits: self.relay_max_circuits,
            relay_max_circuits_per_peer: self.relay_max_circuits_per_peer,
            relay_circuit_duration: s(self.relay_circuit_duration_secs),
            relay_circuit_bytes: self.relay_circuit_bytes,
            relay_reservation_duration: s(self.relay_reservation_duration_secs),
            lease_interval: s(self.lease_interval_secs),
            clock_skew: s(self.clock_skew_secs),
            stream_timeout: s(self.stream_timeout_secs),
            auth_max_inflight_streams: self.auth_max_inflight_streams,
            catalog_max_inflight_streams: self.catalog_max_inflight_streams,
            catalog_max_records: self.catalog_max_records,
            catalog_max_results: self.catalog_max_results,
            catalog_remote_lookup_budget: Duration::from_millis(
                self.catalog_remote_lookup_budget_ms,
            ),
            catalog_provider_cache: Duration::from_millis(self.catalog_provider_cache_ms),
            idle_connection_timeout: s(self.idle_connection_timeout_secs),
            control_plane_retry_budget: s(self.control_plane_retry_budget_secs),
            control_plane_rpc_timeout: s(self.control_plane_rpc_timeout_secs),
            stream_inbound_queue_per_protocol: self.stream_inbound_queue_per_protocol,
            stream_max_pending_opens_per_peer: self.stream_max_pending_opens_per_peer,
            stream_max_pending_opens_total: self.stream_max_pending_opens_total,
            resources: self.resources.into_config(),
            // Set by `main`, not a flag: one watchdog per process.
            runtime_watchdog: false,
        }
    }
}

/// Log filter when `RUST_LOG` is unset. libp2p-kad warns "Failed to trigger
/// bootstrap: No known peers" when a listen address appears before another
/// router is known, normal for a mesh of one router, so its behaviour
/// module logs errors only.
const DEFAULT_LOG_FILTER: &str = "info,libp2p_kad::behaviour=error";

fn main() -> anyhow::Result<()> {
    agentmesh_runtime::block_on(run()).context("building the async runtime")?
}

async fn run() -> anyhow::Result<()> {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into());
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .log_internal_errors(false)
                .with_filter(filter),
        )
        // Counts libp2p-relay's silent STOP-stream drops (its log is the
        // only trace of them).
        .with(agentmesh_router::relay_capacity_layer())
        .init();
    let mut args = Args::parse();
    let token = match args.token_file.take() {
        Some(p) => std::fs::read_to_string(&p)
            .with_context(|| format!("reading --token-file {}", p.display()))?
            .trim()
            .to_string(),
        None => String::new(),
    };
    if let Some(addr) = args.pprof_addr.take() {
        let bound = agentmesh_runtime::profiling::serve(addr).await?;
        tracing::info!(%bound, "profiles on /debug/pprof/profile and /debug/pprof/heap");
    }
    let mut config = args.into_config(token);
    // The binary runs the process's one stall watchdog.
    config.runtime_watchdog = true;
    let router = agentmesh_router::spawn(config).await?;
    tracing::info!(peer_id = %router.peer_id(), "running");
    if let Some(addr) = router.metrics_addr() {
        tracing::info!("metrics on http://{addr}");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut drained = router.drained();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => router.drain(),
        _ = term.recv() => router.drain(),
        _ = drained.wait_for(|d| *d) => {} // POST /drain
    }
    // Drain (go-away, grace, close); a second signal stops at once.
    tokio::select! {
        _ = drained.wait_for(|d| *d) => {}
        _ = tokio::signal::ctrl_c() => tracing::warn!("second signal: stopping without waiting"),
        _ = term.recv() => tracing::warn!("second signal: stopping without waiting"),
    }
    router.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer collecting everything logged, for the filter test.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_filter_drops_kad_bootstrap_warnings_only() {
        let out = Captured::default();
        let w = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER))
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "libp2p_kad::behaviour", "Failed to trigger bootstrap: No known peers.");
            tracing::error!(target: "libp2p_kad::behaviour", "kad error stays");
            tracing::warn!(target: "libp2p_swarm", "swarm warning stays");
            tracing::info!(target: "agentmesh_router", "router info stays");
            tracing::debug!(target: "agentmesh_router", "router debug goes");
        });
        let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf-8");
        assert!(!text.contains("Failed to trigger bootstrap"), "{text}");
        for kept in [
            "kad error stays",
            "swarm warning stays",
            "router info stays",
        ] {
            assert!(text.contains(kept), "{kept} missing: {text}");
        }
        assert!(!text.contains("router debug goes"), "{text}");
    }

    #[test]
    fn no_flags_give_the_default_config() {
        let args = Args::try_parse_from(["agentmesh-router"]).expect("parse");
        assert_eq!(args.into_config(String::new()), Config::default());
    }

    #[test]
    fn pending_open_flags_map_one_to_one_and_refuse_zero() {
        let c = Args::try_parse_from([
            "agentmesh-router",
            "--stream-max-pending-opens-per-peer=5",
            "--stream-max-pending-opens-total=7",
        ])
        .expect("parse")
        .into_config(String::new());
        assert_eq!(
            (
                c.stream_max_pending_opens_per_peer,
                c.stream_max_pending_opens_total
            ),
            (5, 7)
        );
        for flag in [
            "--stream-max-pending-opens-per-peer=0",
            "--stream-max-pending-opens-total=0",
        ] {
            assert!(
                Args::try_parse_from(["agentmesh-router", flag]).is_err(),
                "{flag}"
            );
        }
    }

    #[test]
    fn stream_inbound_queue_flag_maps_one_to_one_and_refuses_zero() {
        let c = Args::try_parse_from(["agentmesh-router", "--stream-inbound-queue-per-protocol=3"])
            .expect("parse")
            .into_config(String::new());
        assert_eq!(c.stream_inbound_queue_per_protocol, 3);
        let err =
            Args::try_parse_from(["agentmesh-router", "--stream-inbound-queue-per-protocol=0"])
                .expect_err("0 is refused");
        assert!(
            err.to_string()
                .contains("stream-inbound-queue-per-protocol"),
            "{err}"
        );
    }

    #[test]
    fn relay_reservations_per_peer_flag_maps_one_to_one_and_refuses_zero() {
        let c = Args::try_parse_from(["agentmesh-router", "--relay-max-reservations-per-peer=2"])
            .expect("parse")
            .into_config(String::new());
        assert_eq!(c.relay_max_reservations_per_peer, 2);
        let err = Args::try_parse_from(["agentmesh-router", "--relay-max-reservations-per-peer=0"])
            .expect_err("0 is refused");
        assert!(
            err.to_string().contains("relay-max-reservations-per-peer"),
            "{err}"
        );
    }

    #[test]
    fn watermark_goaway_and_drain_flags_map_one_to_one() {
        let args = Args::try_parse_from([
            "agentmesh-router",
            "--high-watermark=200",
            "--low-watermark=150",
            "--drain-grace-secs=5",
            "--goaway-max-concurrent-streams=8",
            "--goaway-retry-after-secs=60",
            "--trim-close-grace-secs=3",
            "--drain-http-allow-remote",
        ])
        .expect("parse");
        let c = args.into_config(String::new());
        let s = c.sizing(1 << 30);
        assert_eq!((s.high_watermark, s.low_watermark), (200, 150));
        assert!(!s.sized_from_memory);
        assert_eq!(c.drain_grace, Duration::from_secs(5));
        assert_eq!(c.goaway_max_concurrent_streams, 8);
        assert_eq!(c.goaway_retry_after, Duration::from_secs(60));
        assert_eq!(c.trim_close_grace, Duration::from_secs(3));
        assert!(c.drain_http_allow_remote);
        let c = Args::try_parse_from(["agentmesh-router", "--high-watermark-memory-percent=25"])
            .expect("parse")
            .into_config(String::new());
        assert_eq!(c.high_watermark, None);
        assert_eq!(c.high_watermark_memory_percent, 25);
        assert!(
            Args::try_parse_from(["agentmesh-router", "--high-watermark-memory-percent=0"])
                .is_err()
        );
    }
}
