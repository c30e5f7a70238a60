//! Router-test harness. The shared parts (control plane, in-process
//! routers, the raw libp2p [`TestPeer`], waiting and metric helpers) live in
//! `agentmesh-testkit`; they are re-exported here so every test file reaches
//! them as `support::…`. Only what is router-specific stays below.

#![allow(dead_code, unused_imports)]

pub(crate) mod cp;

pub(crate) use agentmesh_testkit::{
    DEADLINE, Ev, PeerBehaviour, TestPeer, TestRouter, eventually, http_get, metric, scan_stderr,
    spawn_ready,
};

/// Installs the test log subscriber once, with the router's debug logs on
/// by default (`RUST_LOG` filters it).
pub(crate) fn init_tracing() {
    agentmesh_testkit::init_tracing("warn,all::integration=info,agentmesh_router=debug");
}

/// The router binary on loopback TCP port 0 with its key in `dir`, its
/// token in `token_file` and `--control-plane url`: the flags every
/// binary test starts from (more are added by the test), info logs without
/// colour on a piped stderr, killed when dropped.
pub(crate) fn router_binary(
    url: &str,
    token_file: &std::path::Path,
    dir: &std::path::Path,
) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentmesh-router"));
    c.args(["--control-plane", url])
        .arg("--token-file")
        .arg(token_file)
        .arg("--key-path")
        .arg(dir.join("router.key"))
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    c
}
