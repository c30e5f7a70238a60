//! Tests that start routers and nodes together: a real control plane, real
//! routers (in-process through `agentmesh_router::spawn`, or the real
//! binary), real nodes (in-process through `agentmesh_node::spawn`, or the
//! real binary). One test binary; nextest runs every test in its own
//! process.
//!
//! - [`node`]: what a node does against real routers (calls, drains,
//!   go-aways, failover, refusals, transports, storms, its control plane
//!   moved from SQLite to PostgreSQL);
//! - [`pprof`]: each program's CPU and heap profiles (`--pprof-addr`);
//! - [`replicas`]: control-plane replicas on one PostgreSQL database,
//!   killed in turn under a router and members;
//! - [`router`]: what a router does to real nodes (go-away, drain of the
//!   router binary under a fleet);
//! - [`logging`]: the programs' log on a pipe (no colour codes, JSON
//!   lines that parse);
//! - [`netns`]: the binaries on hosts of their own, members behind NATs
//!   (network namespaces; skipped without root);
//! - [`walkthrough`]: README.md's first walk through, run as written.

mod logging;
mod netns;
mod node;
mod pprof;
mod replicas;
mod router;
mod walkthrough;
