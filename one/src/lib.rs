//! `agentmesh-one`: a control plane and N routers in one process, with
//! optional demo members, for laptops and CI.
//!
//! It only composes the program crates through their `spawn` handles; the
//! piece of its own is the demo traffic ([`demo`]) that shows calls
//! flowing.

pub mod demo;
mod mesh;

pub use mesh::{Config, DRAIN_LIMIT, OneHandle, SpawnError, spawn};
