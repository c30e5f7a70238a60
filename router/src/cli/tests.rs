use std::time::Duration;

use clap::{CommandFactory as _, Parser as _};

use super::*;

fn config(args: &[&str]) -> Config {
    let argv = std::iter::once("agentmesh-router").chain(args.iter().copied());
    Cli::try_parse_from(argv)
        .expect("parse")
        .args
        .into_config()
        .expect("config")
}

fn refused(args: &[&str]) -> String {
    let argv = std::iter::once("agentmesh-router").chain(args.iter().copied());
    Cli::try_parse_from(argv).expect_err("refused").to_string()
}

#[test]
fn every_flag_has_a_one_line_help_with_unit_and_default() {
    let problems = agentmesh_runtime::cli::help_problems(&Cli::command());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_flag_is_in_the_readme() {
    let missing = agentmesh_runtime::cli::flags_missing_from(
        &Cli::command(),
        include_str!("../../README.md"),
    );
    assert!(missing.is_empty(), "not in the README: {missing:?}");
}

#[test]
fn the_version_names_the_commit() {
    let cmd = Cli::command();
    assert_eq!(cmd.get_version(), Some(agentmesh_runtime::cli::VERSION));
}

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
    assert_eq!(config(&[]), Config::default());
}

#[test]
fn shared_flags_map_one_to_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "amt_router\n").expect("write token");
    let token = token.display().to_string();
    let c = config(&[
        "--control-plane=https://cp.example:7400",
        "--control-plane-ca=/ca.pem",
        "--control-plane-endpoint=https://cp-0.example:7400",
        "--control-plane-endpoint",
        "https://cp-1.example:7400",
        "--token-file",
        &token,
        "--metrics-addr=127.0.0.1:9100",
        "--catalog-remote-lookup-budget-ms=250",
        "--memory-limit-bytes=1000",
    ]);
    assert_eq!(c.control_plane.url, "https://cp.example:7400");
    assert_eq!(c.control_plane.ca, Some(PathBuf::from("/ca.pem")));
    assert_eq!(
        c.control_plane.endpoints,
        ["https://cp-0.example:7400", "https://cp-1.example:7400"]
    );
    assert_eq!(c.control_plane.token, "amt_router");
    assert_eq!(
        c.metrics_addr,
        Some("127.0.0.1:9100".parse().expect("addr"))
    );
    assert_eq!(c.catalog.remote_lookup_budget, Duration::from_millis(250));
    assert_eq!(c.resources.memory_limit_bytes, Some(1000));
    let missing = dir.path().join("missing").display().to_string();
    let err = Cli::try_parse_from(["agentmesh-router", "--token-file", &missing])
        .expect("parse")
        .args
        .into_config()
        .expect_err("no such file");
    assert!(err.to_string().contains("--token-file"), "{err}");
}

#[test]
fn pending_open_flags_map_one_to_one_and_refuse_zero() {
    let c = config(&[
        "--stream-max-pending-opens-per-peer=5",
        "--stream-max-pending-opens-total=7",
    ]);
    assert_eq!(
        (
            c.connections.stream_max_pending_opens_per_peer,
            c.connections.stream_max_pending_opens_total
        ),
        (5, 7)
    );
    for flag in [
        "--stream-max-pending-opens-per-peer=0",
        "--stream-max-pending-opens-total=0",
    ] {
        refused(&[flag]);
    }
}

#[test]
fn stream_inbound_queue_flag_maps_one_to_one_and_refuses_zero() {
    let c = config(&["--stream-inbound-queue-per-protocol=3"]);
    assert_eq!(c.connections.stream_inbound_queue_per_protocol, 3);
    let err = refused(&["--stream-inbound-queue-per-protocol=0"]);
    assert!(err.contains("stream-inbound-queue-per-protocol"), "{err}");
}

#[test]
fn relay_reservations_per_peer_flag_maps_one_to_one_and_refuses_zero() {
    let c = config(&["--relay-max-reservations-per-peer=2"]);
    assert_eq!(c.relay.max_reservations_per_peer, 2);
    let err = refused(&["--relay-max-reservations-per-peer=0"]);
    assert!(err.contains("relay-max-reservations-per-peer"), "{err}");
}

#[test]
fn watermark_goaway_and_drain_flags_map_one_to_one() {
    let c = config(&[
        "--high-watermark=200",
        "--low-watermark=150",
        "--drain-grace-secs=5",
        "--goaway-max-concurrent-streams=8",
        "--goaway-retry-after-secs=60",
        "--trim-close-grace-secs=3",
        "--drain-http-allow-remote",
    ]);
    let s = c.sizing(1 << 30);
    assert_eq!((s.high_watermark, s.low_watermark), (200, 150));
    assert!(!s.sized_from_memory);
    assert_eq!(c.drain.grace, Duration::from_secs(5));
    assert_eq!(c.drain.goaway_max_concurrent_streams, 8);
    assert_eq!(c.drain.goaway_retry_after, Duration::from_secs(60));
    assert_eq!(c.watermarks.trim_close_grace, Duration::from_secs(3));
    assert!(c.drain.http_allow_remote);
    let c = config(&["--high-watermark-memory-percent=25"]);
    assert_eq!(c.watermarks.high, None);
    assert_eq!(c.watermarks.high_memory_percent, 25);
    refused(&["--high-watermark-memory-percent=0"]);
}
