//! The direct path's results: the agentmesh direct row of each round
//! against the bare libp2p direct floor with the same TCP ends and the
//! member's muxer of the same round, the targets checked on the
//! medians over the rounds, and the time from the first relayed call to
//! the first direct one.

use serde::Serialize;

use super::row::{Row, quantile};

/// Time from the first relayed call to the first direct one, over fresh
/// punches: the direct pair's caller restarted for each sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TimeToDirect {
    /// How each sample was made and what it measures.
    pub method: String,
    /// Each sample that went direct, milliseconds.
    pub samples_ms: Vec<f64>,
    /// Samples whose first successful call already went direct (not in
    /// `samples_ms`).
    pub direct_at_first_call: u32,
    /// Samples that failed, and why.
    pub failed: Vec<String>,
    /// p50, p95 and max of `samples_ms`, milliseconds.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p95_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
}

/// The agentmesh direct path's name.
pub const AGENTMESH_DIRECT: &str = "agentmesh, direct (punched)";
/// The like-for-like floor of [`AGENTMESH_DIRECT`]: client → TCP → bare
/// forwarder → direct libp2p connection (the member's muxer) → bare
/// listener splicing to TCP → backend.
pub const BARE_DIRECT_TCP_ENDS: &str = "bare libp2p, direct with TCP ends and the member's yamux";
/// Target: the direct call's single-stream throughput at least this share of the floor's.
pub const TARGET_THROUGHPUT_SHARE: f64 = 0.9;
/// Target: its p50 round trip at most this many times the floor's.
pub const TARGET_RTT_FACTOR: f64 = 1.2;
/// Target: CPU per GiB of the caller and of the provider at most this many
/// times the floor's forwarder and splicing listener.
pub const TARGET_CPU_FACTOR: f64 = 1.2;
/// Target: p95 time from the first relayed call to the first direct one, ms.
pub const TARGET_TIME_TO_DIRECT_P95_MS: f64 = 1000.0;

/// agentmesh direct over the floor: one round's, or the medians'.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// The round (`None`: the median of each quantity over the rounds,
    /// then their ratio).
    pub round: Option<u32>,
    /// Single-stream throughput share.
    pub throughput_share: f64,
    /// N-stream throughput share.
    pub concurrent_share: f64,
    /// RTT p50 factor.
    pub rtt_p50_factor: f64,
    /// CPU per GiB factor, caller node over the bare forwarder.
    pub cpu_caller_factor: Option<f64>,
    /// CPU per GiB factor, provider node over the bare splicing listener.
    pub cpu_provider_factor: Option<f64>,
}

/// The direct targets of a run.
#[derive(Debug, Clone, Serialize)]
pub struct DirectTargets {
    /// Each round's ratios.
    pub rounds: Vec<Ratios>,
    /// The medians' ratios: what the targets are checked on.
    pub medians: Ratios,
    /// Throughput share ≥ [`TARGET_THROUGHPUT_SHARE`].
    pub throughput_met: bool,
    /// RTT p50 factor ≤ [`TARGET_RTT_FACTOR`].
    pub rtt_met: bool,
    /// Both CPU factors ≤ [`TARGET_CPU_FACTOR`].
    pub cpu_met: bool,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The quantities a ratio is taken of, for one row or the medians of rows.
#[derive(Debug, Clone, Copy)]
struct Q {
    single: f64,
    concurrent: f64,
    rtt: f64,
    caller: Option<f64>,
    provider: Option<f64>,
}

impl Q {
    fn of(r: &Row) -> Self {
        Self {
            single: r.single_mib_per_sec,
            concurrent: r.concurrent_mib_per_sec,
            rtt: r.rtt_p50_ms,
            caller: r.cpu_secs_per_gib.caller,
            provider: r.cpu_secs_per_gib.provider,
        }
    }

    fn median(rows: &[&Row]) -> Self {
        let m = |f: fn(&Row) -> f64| quantile(&rows.iter().map(|r| f(r)).collect::<Vec<_>>(), 0.5);
        let mo = |f: fn(&Row) -> Option<f64>| {
            let v: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
            (!v.is_empty()).then(|| quantile(&v, 0.5))
        };
        Self {
            single: m(|r| r.single_mib_per_sec),
            concurrent: m(|r| r.concurrent_mib_per_sec),
            rtt: m(|r| r.rtt_p50_ms),
            caller: mo(|r| r.cpu_secs_per_gib.caller),
            provider: mo(|r| r.cpu_secs_per_gib.provider),
        }
    }

    fn over(self, f: Self, round: Option<u32>) -> Ratios {
        Ratios {
            round,
            throughput_share: self.single / f.single,
            concurrent_share: self.concurrent / f.concurrent,
            rtt_p50_factor: self.rtt / f.rtt,
            cpu_caller_factor: ratio(self.caller, f.caller),
            cpu_provider_factor: ratio(self.provider, f.provider),
        }
    }
}

/// The direct targets of `rows` (`None` when either path has no row).
/// The median is the lower middle value for an even count of rounds.
pub fn direct_targets(rows: &[Row]) -> Option<DirectTargets> {
    let of = |p: &str| rows.iter().filter(|r| r.path == p).collect::<Vec<_>>();
    let (mesh, floor) = (of(AGENTMESH_DIRECT), of(BARE_DIRECT_TCP_ENDS));
    if mesh.is_empty() || floor.is_empty() {
        return None;
    }
    let rounds = mesh
        .iter()
        .filter_map(|m| {
            let f = floor.iter().find(|f| f.round == m.round)?;
            Some(Q::of(m).over(Q::of(f), Some(m.round)))
        })
        .collect();
    let medians = Q::median(&mesh).over(Q::median(&floor), None);
    let cpu_ok = |c: Option<f64>| c.is_some_and(|c| c <= TARGET_CPU_FACTOR);
    Some(DirectTargets {
        rounds,
        throughput_met: medians.throughput_share >= TARGET_THROUGHPUT_SHARE,
        rtt_met: medians.rtt_p50_factor <= TARGET_RTT_FACTOR,
        cpu_met: cpu_ok(medians.cpu_caller_factor) && cpu_ok(medians.cpu_provider_factor),
        medians,
    })
}

fn mark(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"))
}

/// The markdown of the direct targets and the time to direct.
pub fn markdown(t: Option<&DirectTargets>, time: Option<&TimeToDirect>) -> String {
    let mut out = String::new();
    if let Some(t) = t {
        out.push_str(&format!(
            "\nDirect: {AGENTMESH_DIRECT} against {BARE_DIRECT_TCP_ENDS}, each round and the medians over the rounds (the targets):\n\n\
             | round | throughput share, 1 stream (≥ {TARGET_THROUGHPUT_SHARE}) | N streams | RTT p50 factor (≤ {TARGET_RTT_FACTOR}) | CPU/GiB factor caller (≤ {TARGET_CPU_FACTOR}) | provider (≤ {TARGET_CPU_FACTOR}) |\n\
             |---|---|---|---|---|---|\n"
        ));
        for r in &t.rounds {
            out.push_str(&row(r, None));
        }
        out.push_str(&row(&t.medians, Some(t)));
    }
    if let Some(d) = time {
        let met = d.failed.is_empty() && d.p95_ms <= TARGET_TIME_TO_DIRECT_P95_MS;
        out.push_str(&format!(
            "\nTime from the first relayed call to the first direct one (p95 ≤ {TARGET_TIME_TO_DIRECT_P95_MS:.0} ms): \
             {} samples, p50 {:.0} ms, p95 {:.0} ms {}, max {:.0} ms; {} direct at the first call, {} failed.\n",
            d.samples_ms.len(),
            d.p50_ms,
            d.p95_ms,
            mark(met),
            d.max_ms,
            d.direct_at_first_call,
            d.failed.len(),
        ));
        for f in &d.failed {
            out.push_str(&format!("- {f}\n"));
        }
    }
    out
}

/// One line of the direct table; the medians' carry the marks.
fn row(r: &Ratios, marks: Option<&DirectTargets>) -> String {
    let m = |ok: fn(&DirectTargets) -> bool| {
        marks.map_or(String::new(), |t| format!(" {}", mark(ok(t))))
    };
    let cpu_mark = |c: Option<f64>| match marks {
        Some(_) => format!(" {}", mark(c.is_some_and(|c| c <= TARGET_CPU_FACTOR))),
        None => String::new(),
    };
    format!(
        "| {} | {:.2}{} | {:.2} | {:.2}{} | {}{} | {}{} |\n",
        r.round
            .map_or_else(|| "median".to_string(), |n| n.to_string()),
        r.throughput_share,
        m(|t| t.throughput_met),
        r.concurrent_share,
        r.rtt_p50_factor,
        m(|t| t.rtt_met),
        cell(r.cpu_caller_factor),
        cpu_mark(r.cpu_caller_factor),
        cell(r.cpu_provider_factor),
        cpu_mark(r.cpu_provider_factor),
    )
}

#[cfg(test)]
mod tests {
    use super::super::row::{CpuPerGib, PeakRss};
    use super::*;

    fn row(path: &str, round: u32, mib: f64, rtt: f64, caller: f64, provider: f64) -> Row {
        Row {
            path: path.to_string(),
            round,
            single_bytes: 1,
            single_mib_per_sec: mib,
            round_trips: 1,
            rtt_p50_ms: rtt,
            rtt_p99_ms: rtt,
            streams: 16,
            concurrent_bytes: 1,
            concurrent_mib_per_sec: mib,
            cpu_secs_per_gib: CpuPerGib {
                caller: Some(caller),
                provider: Some(provider),
                ..CpuPerGib::default()
            },
            peak_rss_mib: PeakRss::default(),
            path_bytes: None,
        }
    }

    #[test]
    fn targets_are_checked_on_the_medians_over_the_rounds() {
        let rows = vec![
            row(BARE_DIRECT_TCP_ENDS, 1, 100.0, 0.10, 2.0, 2.0),
            row(AGENTMESH_DIRECT, 1, 50.0, 0.30, 9.0, 9.0),
            row(BARE_DIRECT_TCP_ENDS, 2, 100.0, 0.10, 2.0, 2.0),
            row(AGENTMESH_DIRECT, 2, 95.0, 0.11, 2.2, 2.6),
            row(BARE_DIRECT_TCP_ENDS, 3, 100.0, 0.10, 2.0, 2.0),
            row(AGENTMESH_DIRECT, 3, 92.0, 0.12, 2.2, 2.6),
        ];
        let t = direct_targets(&rows).expect("both paths");
        assert_eq!(t.rounds.len(), 3);
        assert!((t.rounds[0].throughput_share - 0.5).abs() < 1e-9);
        // Medians: 92 MiB/s, 0.12 ms, 2.2 and 2.6 s/GiB against the floor's.
        assert!((t.medians.throughput_share - 0.92).abs() < 1e-9);
        assert!(t.throughput_met && t.rtt_met);
        assert!(!t.cpu_met, "the provider's 1.3 misses");
        let md = markdown(Some(&t), None);
        assert!(
            md.contains("| median | 0.92 met | 0.92 | 1.20 met | 1.10 met | 1.30 missed |"),
            "{md}"
        );
        assert!(direct_targets(&rows[..1]).is_none());
    }

    #[test]
    fn the_time_to_direct_is_marked_against_its_target() {
        let t = TimeToDirect {
            samples_ms: vec![100.0, 900.0],
            p50_ms: 100.0,
            p95_ms: 900.0,
            max_ms: 900.0,
            ..TimeToDirect::default()
        };
        assert!(markdown(None, Some(&t)).contains("p95 900 ms met"));
        let failed = TimeToDirect {
            failed: vec!["sample 1: x".to_string()],
            ..t
        };
        assert!(markdown(None, Some(&failed)).contains("p95 900 ms missed"));
    }
}
