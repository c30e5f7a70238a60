//! What every agentmesh binary shares at run time.
//!
//! - [`Allocator`]: jemalloc with background threads, so memory freed after
//!   members leave goes back to the OS instead of staying resident. Each
//!   binary declares `#[global_allocator] static A: Allocator = Allocator;`.
//! - [`watchdog`]: warns when the async runtime stalls for a second or more
//!   and counts it in `agentmesh_runtime_stalls_total`.
//! - [`profiling`] (cargo feature `pprof`): CPU and heap profiles over HTTP
//!   on `--pprof-addr`.

pub mod profiling;
pub mod watchdog;

/// The allocator of the agentmesh binaries (jemalloc, background threads on).
pub use tikv_jemallocator::Jemalloc as Allocator;
