//! `agentmesh-one`: a control plane and N routers in one process, with
//! optional demo members, for laptops and CI.
//!
//! It only composes the program crates through their `spawn` handles; the
//! pieces of its own are the demo traffic ([`demo`]) that shows calls
//! flowing and the stop signals ([`signals`]) that drain it.

pub mod demo;
mod mesh;
pub mod signals;

pub use mesh::{Config, DRAIN_LIMIT, OneHandle, SpawnError, spawn};
