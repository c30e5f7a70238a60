//! The member ladder: drives fleets of real members in steps against a mesh
//! and reports, step by step, who joined, who is ready, who can call,
//! latencies, refusals and resources (issue 5).
//!
//! The coordinator ([`run`]) starts a control plane and routers as child
//! processes (local mode) or uses an existing mesh (remote mode), then
//! re-executes itself as `worker` processes that each host many members
//! in-process (each the real node from `agentmesh_node`), sized from the
//! open-files limit. Coordinator and workers speak JSON lines ([`wire`]).

pub mod attack;
pub mod bench;
pub mod binaries;
pub mod cgroup;
pub mod children;
pub mod config;
pub mod control_planes;
pub mod error;
pub mod fleet;
pub mod hold;
pub mod hosts;
pub mod http;
pub mod idle_cost;
pub mod member;
pub mod mesh;
pub mod observe;
pub mod placement;
pub mod ports;
pub mod postgres;
pub mod procstat;
pub mod prom;
pub mod propagation;
pub mod replicas;
pub mod report;
pub mod run;
pub mod stats;
pub mod tally;
pub mod target;
pub mod wire;
pub mod workdir;
pub mod worker;

pub use error::{LadderError, Result};
pub use report::Report;
pub use run::{run_local, run_remote};
