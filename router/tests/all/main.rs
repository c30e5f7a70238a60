//! The router's integration tests, one module per concern, linked into one
//! test binary (one link instead of one per file; nextest still runs every
//! test in its own process). They need no node: tests that start routers and
//! nodes together live in the `agentmesh-e2e` crate.

mod support;

mod auth_queue;
mod binary;
mod connection_charge;
mod cp_replicas;
mod dns;
mod drain_http;
mod ghost;
mod integration;
mod limits;
mod resources;
mod supervisor;
