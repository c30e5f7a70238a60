//! One measured path and round ([`Row`]), and the quantile every table
//! uses: the data the reports are made of, apart from how they read.

use serde::Serialize;

/// CPU seconds per GiB moved, per process of a path (`None`: the path has
/// no such process).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuPerGib {
    /// The calling side: the bench client for the raw-stream floors, the
    /// bare forwarder for the floor with TCP ends, the `--forward` node for
    /// agentmesh.
    pub caller: Option<f64>,
    /// The relay: the bare relay, or the routers (summed).
    pub router: Option<f64>,
    /// The serving side: the libp2p listener or backend for the raw-stream
    /// floors, the splicing listener for the floor with TCP ends, the
    /// `--expose` node for agentmesh.
    pub provider: Option<f64>,
    /// Paths with TCP ends: the bench client talking to the forward.
    pub client: Option<f64>,
    /// Paths with TCP ends: the backend behind the expose.
    pub backend: Option<f64>,
}

/// Peak RSS so far (`VmHWM`) of a path's processes after its round, MiB
/// (`None`: the path has no such process). A process shared by paths (the
/// `--forward` node of both agentmesh paths) keeps its peak across them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeakRss {
    /// The calling side, as in [`CpuPerGib::caller`].
    pub caller: Option<f64>,
    /// The serving side, as in [`CpuPerGib::provider`].
    pub provider: Option<f64>,
}

/// One path, one round.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What carried the bytes.
    pub path: String,
    /// Round number, from 1.
    pub round: u32,
    /// Bytes of the single-stream run.
    pub single_bytes: u64,
    /// Single-stream throughput, MiB/s.
    pub single_mib_per_sec: f64,
    /// Recorded one-byte round trips.
    pub round_trips: usize,
    /// Round trip p50, milliseconds.
    pub rtt_p50_ms: f64,
    /// Round trip p99, milliseconds.
    pub rtt_p99_ms: f64,
    /// Streams of the concurrent run.
    pub streams: u32,
    /// Bytes of the concurrent run, all streams.
    pub concurrent_bytes: u64,
    /// Concurrent throughput, all streams, MiB/s.
    pub concurrent_mib_per_sec: f64,
    /// CPU per GiB over the single and concurrent runs.
    pub cpu_secs_per_gib: CpuPerGib,
    /// Peak RSS of the caller and provider processes after the round.
    pub peak_rss_mib: PeakRss,
    /// The agentmesh direct path: the call bytes its caller counted by
    /// path over the run (the proof it went direct).
    pub path_bytes: Option<PathBytes>,
}

/// What the agentmesh direct path's caller counted by path over one
/// measured run (the proof the run went direct).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PathBytes {
    /// Call bytes sent over direct connections during the run.
    pub direct_sent: u64,
    /// Call bytes over relayed connections during the run (must be 0).
    pub relayed: u64,
}

/// The `q` quantile (0..=1) of samples, nearest rank; 0 for none.
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}
