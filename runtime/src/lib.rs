//! What every agentmesh binary shares at run time.
//!
//! - [`Allocator`]: jemalloc with background threads, so memory freed after
//!   members leave goes back to the OS instead of staying resident. Each
//!   binary declares `#[global_allocator] static A: Allocator = Allocator;`.
//! - [`allocator`]: jemalloc's allocated / resident / retained bytes as
//!   `agentmesh_runtime_allocator_*` gauges, read at each scrape.
//! - [`watchdog`]: warns when the async runtime stalls for a second or more
//!   and counts it in `agentmesh_runtime_stalls_total`.
//! - [`profiling`] (cargo feature `pprof`): CPU and heap profiles over HTTP
//!   on `--pprof-addr`.

pub mod allocator;
pub mod profiling;
pub mod watchdog;

/// The allocator of the agentmesh binaries (jemalloc, background threads on).
pub use tikv_jemallocator::Jemalloc as Allocator;

// Unit tests read jemalloc's statistics: make it this test binary's
// allocator too.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOC: Allocator = Allocator;
