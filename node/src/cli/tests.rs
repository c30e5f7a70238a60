use std::path::Path;

use clap::{CommandFactory as _, Parser as _};

use super::*;

fn run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
    let argv = ["agentmesh-node", "run"]
        .into_iter()
        .chain(args.iter().copied());
    match Cli::try_parse_from(argv)?.command {
        Command::Run(args) => Ok(*args),
        other => panic!("not run: {other:?}"),
    }
}

fn config(args: &[&str]) -> Config {
    run_args(args)
        .expect("parse")
        .into_config()
        .expect("config")
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
    assert_eq!(
        Cli::command().get_version(),
        Some(agentmesh_runtime::cli::VERSION)
    );
}

#[test]
fn no_flags_is_the_default_config() {
    assert_eq!(config(&[]), Config::default());
}

#[test]
fn shared_flags_map_one_to_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, " amt_member\n").expect("write token");
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
        "--retry-budget-secs=7",
    ]);
    assert_eq!(c.control_plane.url, "https://cp.example:7400");
    assert_eq!(c.control_plane.ca, Some(PathBuf::from("/ca.pem")));
    assert_eq!(
        c.control_plane.endpoints,
        ["https://cp-0.example:7400", "https://cp-1.example:7400"]
    );
    assert_eq!(c.control_plane.token, "amt_member");
    assert_eq!(
        c.metrics_addr,
        Some("127.0.0.1:9100".parse().expect("addr"))
    );
    assert_eq!(c.control_plane.retry_budget, Duration::from_secs(7));
    let missing = dir.path().join("missing").display().to_string();
    let err = run_args(&["--token-file", &missing])
        .expect("parse")
        .into_config()
        .expect_err("no such file");
    assert!(err.to_string().contains("--token-file"), "{err}");
}

#[test]
fn seconds_flags_become_durations_of_that_many_seconds() {
    let c = config(&[
        "--rpc-timeout-secs=1",
        "--retry-budget-secs=2",
        "--directory-interval-secs=3",
        "--connect-timeout-secs=4",
        "--call-timeout-secs=5",
        "--idle-connection-secs=6",
        "--relayed-idle-secs=0",
        "--record-ttl-secs=8",
        "--shutdown-grace-secs=9",
        "--credential-skew-secs=10",
    ]);
    let s = Duration::from_secs;
    assert_eq!(
        [
            c.control_plane.rpc_timeout,
            c.control_plane.retry_budget,
            c.control_plane.directory_interval,
            c.connect_timeout,
            c.call_timeout,
            c.connections.idle,
            c.connections.relayed_idle,
            c.services.record_ttl,
            c.shutdown_grace,
            c.control_plane.credential_skew,
        ],
        [s(1), s(2), s(3), s(4), s(5), s(6), s(0), s(8), s(9), s(10)]
    );
    // Zero timeouts act as 1 s where they always have.
    let c = config(&["--connect-timeout-secs=0", "--call-timeout-secs=0"]);
    assert_eq!(c.connect_timeout(), s(1));
    assert_eq!(c.call_timeout(), s(1));
    assert_eq!(c.call_budget(), s(2));
    // The call idle deadline: seconds, and zero turns it off.
    let c = config(&["--call-idle-timeout-secs=7"]);
    assert_eq!(c.calls.idle_deadline(), Some(s(7)));
    let c = config(&["--call-idle-timeout-secs=0"]);
    assert_eq!(c.calls.idle_deadline(), None);
    assert_eq!(config(&[]).calls.idle_deadline(), Some(s(900)));
}

#[test]
fn repeatable_flags_parse() {
    let c = config(&[
        "--router-selector",
        "region=eu",
        "--expose",
        "echo=127.0.0.1:7",
        "--allow",
        "echo=label:team=a",
        "--forward",
        "127.0.0.1:0=echo",
        "--dial-source-ip",
        "127.0.0.2",
    ]);
    assert_eq!(
        c.routers.selector.get("region").map(String::as_str),
        Some("eu")
    );
    assert_eq!(c.services.expose.len(), 1);
    assert_eq!(c.services.allow.len(), 1);
    assert_eq!(c.local.forward[0].1, "echo");
    assert!(c.connections.dial_source_ip.is_some());
    assert!(run_args(&["--expose", "bad"]).is_err());
}

#[test]
fn stream_inbound_queue_flag_maps_and_refuses_zero() {
    let c = config(&["--stream-inbound-queue-per-protocol", "3"]);
    assert_eq!(c.connections.stream_inbound_queue_per_protocol, 3);
    assert!(run_args(&["--stream-inbound-queue-per-protocol", "0"]).is_err());
}

#[test]
fn pending_open_flags_map_and_refuse_zero() {
    let c = config(&["--stream-max-pending-opens-per-peer", "5"]);
    assert_eq!(c.connections.stream_max_pending_opens_per_peer, 5);
    let c = config(&["--stream-max-pending-opens-total", "7"]);
    assert_eq!(c.connections.stream_max_pending_opens_total, 7);
    assert!(run_args(&["--stream-max-pending-opens-per-peer", "0"]).is_err());
    assert!(run_args(&["--stream-max-pending-opens-total", "0"]).is_err());
}

#[test]
fn call_finds_the_socket_in_the_data_dir_unless_told() {
    let Command::Call(c) =
        Cli::try_parse_from(["agentmesh-node", "call", "echo", "--data-dir", "/d"])
            .expect("parse")
            .command
    else {
        panic!("not call");
    };
    assert_eq!(c.name, "echo");
    assert_eq!(c.socket_path(), PathBuf::from("/d/agentmesh.sock"));
    let Command::Call(c) =
        Cli::try_parse_from(["agentmesh-node", "call", "echo", "--socket-path", "/s.sock"])
            .expect("parse")
            .command
    else {
        panic!("not call");
    };
    assert_eq!(c.socket_path(), PathBuf::from("/s.sock"));
}

#[test]
fn yamux_and_splice_flags_map_to_the_config() {
    let c = config(&[
        "--yamux-max-streams",
        "4",
        "--yamux-connection-window-kib",
        "2048",
        "--splice-buffer-kib",
        "64",
    ]);
    assert_eq!(
        crate::transport::window_limits(&c.connections),
        crate::transport::WindowLimits {
            max_streams: 4,
            connection_window_bytes: 2048 * 1024,
        }
    );
    assert_eq!(c.calls.splice_buffer_bytes(), 64 * 1024);
    // The default bounds the window far below libp2p-yamux's 1 GiB and
    // still gives every stream yamux's 256 KiB.
    let d = crate::transport::window_limits(&Config::default().connections);
    assert!(d.connection_window_bytes < 1 << 30);
    assert!(d.connection_window_bytes >= d.max_streams as u64 * 256 * 1024);
    assert!(run_args(&["--splice-buffer-kib", "0"]).is_err());
}

#[test]
fn the_member_tools_parse_their_flags() {
    let parse = |args: &[&str]| {
        Cli::try_parse_from(["agentmesh-node"].into_iter().chain(args.iter().copied()))
            .expect("parse")
            .command
    };
    for flag in ["--wait-ready-secs", "--wait-ready"] {
        match parse(&["call", "upper", flag, "30"]) {
            Command::Call(c) => assert_eq!(c.wait_ready_secs, Some(30), "{flag}"),
            other => panic!("not call: {other:?}"),
        }
    }
    match parse(&["call", "upper"]) {
        Command::Call(c) => assert_eq!(c.wait_ready_secs, None),
        other => panic!("not call: {other:?}"),
    }
    match parse(&["ping", "upper"]) {
        Command::Ping(p) => {
            assert_eq!(
                (p.count, p.interval_ms, p.timeout_ms, p.json),
                (3, 1000, 25_000, false)
            );
            assert_eq!(
                p.socket_path(),
                Path::new(config::DEFAULT_DATA_DIR).join(config::SOCKET_FILE)
            );
        }
        other => panic!("not ping: {other:?}"),
    }
    match parse(&[
        "ping",
        "upper",
        "--count",
        "1",
        "--interval-ms",
        "5",
        "--timeout-ms",
        "70",
        "--json",
    ]) {
        Command::Ping(p) => assert_eq!(
            (p.count, p.interval_ms, p.timeout_ms, p.json),
            (1, 5, 70, true)
        ),
        other => panic!("not ping: {other:?}"),
    }
    match parse(&["wait"]) {
        Command::Wait(w) => assert_eq!(w.timeout_secs, 30),
        other => panic!("not wait: {other:?}"),
    }
    assert_eq!(
        config(&["--max-call-metric-services", "3"])
            .calls
            .max_metric_services,
        3
    );
}

#[test]
fn direct_connections_are_on_by_default_and_false_turns_them_off() {
    assert!(config(&[]).direct.enabled);
    assert!(!config(&["--direct=false"]).direct.enabled);
}

#[test]
fn loopback_punch_targets_are_off_by_default_and_refused_without_direct() {
    assert!(!config(&[]).direct.allow_loopback_targets);
    let on = config(&["--direct-allow-loopback-targets=true"]);
    assert!(on.direct.allow_loopback_targets);
    assert!(crate::validate(&on).is_ok());
    let alone = config(&["--direct=false", "--direct-allow-loopback-targets=true"]);
    let err = crate::validate(&alone).expect_err("refused without --direct");
    assert!(err.to_string().contains("needs --direct=true"), "{err}");
}

#[test]
fn the_direct_transport_is_tcp_by_default_and_quic_needs_direct_on() {
    use crate::config::DirectTransport;
    assert_eq!(config(&[]).direct.transport, DirectTransport::Tcp);
    let quic = config(&["--direct-transport=quic"]);
    assert_eq!(quic.direct.transport, DirectTransport::Quic);
    assert!(crate::validate(&quic).is_ok());
    let alone = config(&["--direct=false", "--direct-transport=quic"]);
    let err = crate::validate(&alone).expect_err("refused without --direct");
    assert!(err.to_string().contains("needs --direct=true"), "{err}");
}
