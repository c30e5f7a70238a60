//! What the allocator holds, for operators: jemalloc's own accounting read
//! at every scrape, so a router whose RSS stays high after members left shows
//! whether the bytes are still allocated (state we keep) or only resident
//! (pages jemalloc has not returned yet).
//!
//! `agentmesh_runtime_allocator_{allocated,active,resident,mapped,retained,metadata}_bytes`
//! and `agentmesh_runtime_allocator_background_threads` (1 when jemalloc's
//! background purging threads run). Meaningful only in a process whose
//! global allocator is [`crate::Allocator`]; register them from `main`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tikv_jemalloc_ctl::{background_thread, epoch, stats};

/// Why jemalloc's statistics could not be read.
#[derive(Debug, thiserror::Error)]
#[error("jemalloc control {what}: {cause}")]
pub struct AllocatorError {
    what: &'static str,
    // Not `#[source]`: the ctl error implements `std::error::Error` only
    // with that crate's `use_std` feature.
    cause: tikv_jemalloc_ctl::Error,
}

fn ctl<T>(what: &'static str, r: tikv_jemalloc_ctl::Result<T>) -> Result<T, AllocatorError> {
    r.map_err(|cause| AllocatorError { what, cause })
}

/// jemalloc's totals, bytes (see `man jemalloc`, `stats.*`): the gap between
/// `resident` and `allocated` is what the allocator holds that the program
/// does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes the program has allocated and not freed.
    pub allocated: u64,
    /// Bytes in pages holding at least one allocation.
    pub active: u64,
    /// Bytes in physically resident pages the allocator maps (≈ its RSS share).
    pub resident: u64,
    /// Bytes in extents mapped by the allocator.
    pub mapped: u64,
    /// Bytes kept as virtual address space only (returned to the OS, not RSS).
    pub retained: u64,
    /// Bytes of the allocator's own metadata.
    pub metadata: u64,
}

/// Reads jemalloc's totals (advancing its statistics epoch first so they
/// are current).
pub fn stats() -> Result<AllocatorStats, AllocatorError> {
    ctl("epoch", epoch::advance())?;
    let b = |v: usize| v as u64;
    Ok(AllocatorStats {
        allocated: b(ctl("stats.allocated", stats::allocated::read())?),
        active: b(ctl("stats.active", stats::active::read())?),
        resident: b(ctl("stats.resident", stats::resident::read())?),
        mapped: b(ctl("stats.mapped", stats::mapped::read())?),
        retained: b(ctl("stats.retained", stats::retained::read())?),
        metadata: b(ctl("stats.metadata", stats::metadata::read())?),
    })
}

/// Whether jemalloc's background threads run (they purge freed pages on
/// their decay schedule even when no thread allocates).
pub fn background_threads() -> Result<bool, AllocatorError> {
    ctl("background_thread", background_thread::read())
}

/// jemalloc's full statistics report (`malloc_stats_print`: options, merged
/// and per-arena totals, per size class), for an operator asking where the
/// resident bytes are. Takes the allocator's locks briefly: call it off the
/// async runtime.
pub fn report() -> Result<String, std::io::Error> {
    let mut out = Vec::new();
    let opts = tikv_jemalloc_ctl::stats_print::Options::default();
    tikv_jemalloc_ctl::stats_print::stats_print(&mut out, opts)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Reads [`stats`] at each scrape.
#[derive(Debug, Default)]
pub struct AllocatorCollector;

impl Collector for AllocatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A failed read leaves the gauges out of this scrape (and says why
        // in the log) rather than failing the whole scrape.
        let s = match stats() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "allocator statistics unavailable");
                return Ok(());
            }
        };
        let gauges: [(&str, &str, u64); 6] = [
            (
                "agentmesh_runtime_allocator_allocated_bytes",
                "Bytes allocated by the program and not freed (jemalloc stats.allocated)",
                s.allocated,
            ),
            (
                "agentmesh_runtime_allocator_active_bytes",
                "Bytes in pages holding allocations (jemalloc stats.active)",
                s.active,
            ),
            (
                "agentmesh_runtime_allocator_resident_bytes",
                "Bytes of physically resident pages mapped by the allocator (jemalloc stats.resident)",
                s.resident,
            ),
            (
                "agentmesh_runtime_allocator_mapped_bytes",
                "Bytes in extents mapped by the allocator (jemalloc stats.mapped)",
                s.mapped,
            ),
            (
                "agentmesh_runtime_allocator_retained_bytes",
                "Bytes of address space kept but returned to the OS, not resident (jemalloc stats.retained)",
                s.retained,
            ),
            (
                "agentmesh_runtime_allocator_metadata_bytes",
                "Bytes of allocator metadata (jemalloc stats.metadata)",
                s.metadata,
            ),
        ];
        for (name, help, v) in gauges {
            let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let bg = ConstGauge::new(i64::from(background_threads().unwrap_or(false)));
        bg.encode(encoder.encode_descriptor(
            "agentmesh_runtime_allocator_background_threads",
            "1 when jemalloc's background purging threads are on",
            None,
            bg.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Registers the allocator gauges in `registry` (once per process, from the
/// binary whose global allocator is [`crate::Allocator`]).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(AllocatorCollector));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_threads_are_on() {
        // Compiled in by tikv-jemallocator's `background_threads` feature
        // (`--with-malloc-conf=background_thread:true`); started with the
        // first allocation.
        assert!(
            background_threads().expect("read"),
            "background threads off"
        );
    }

    #[test]
    fn a_large_allocation_shows_in_allocated_and_in_the_scrape() {
        const SIZE: usize = 64 << 20;
        let before = stats().expect("stats");
        let block = vec![1u8; SIZE];
        let during = stats().expect("stats");
        assert!(
            during.allocated >= before.allocated + SIZE as u64 / 2,
            "{before:?} -> {during:?}"
        );
        assert!(during.resident >= during.allocated / 2, "{during:?}");
        drop(block);
        let mut reg = Registry::default();
        register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        for name in [
            "agentmesh_runtime_allocator_allocated_bytes ",
            "agentmesh_runtime_allocator_resident_bytes ",
            "agentmesh_runtime_allocator_retained_bytes ",
            "agentmesh_runtime_allocator_background_threads 1",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
        let r = report().expect("report");
        assert!(r.contains("Allocated:"), "{r}");
    }
}
