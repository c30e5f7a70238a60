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
