//! The bench's results: one [`Row`] per path and round, as JSON and as a
//! markdown table with the three targets checked against the bare
//! relay circuit, then the gap taken apart: what the TCP ends cost the bare
//! circuit, and each agentmesh row against the bare circuit with TCP ends
//! (what is left is agentmesh's own).

use serde::Serialize;

pub use super::row::{CpuPerGib, PeakRss, Row, quantile};

/// The bare relay circuit's path name (the targets' reference).
pub const BARE_RELAY: &str = "bare libp2p, relay v2 circuit";
/// The bare relay circuit with TCP ends' path name: the like-for-like floor
/// of an agentmesh call (same TCP hops and splices, no agentmesh logic).
pub const BARE_RELAY_TCP_ENDS: &str = "bare libp2p, relay v2 circuit with TCP ends";
/// Target: a relayed call's throughput at least this share of the bare circuit's.
pub const TARGET_THROUGHPUT_SHARE: f64 = 0.9;
/// Target: a relayed call's p50 round trip at most this many times the bare circuit's.
pub const TARGET_RTT_FACTOR: f64 = 1.2;
/// Target: the router's CPU per GiB at most this many times the bare relay's.
pub const TARGET_ROUTER_CPU_FACTOR: f64 = 1.2;

/// The whole bench.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The command line.
    pub command: String,
    /// Every row, rounds in order.
    pub rows: Vec<Row>,
    /// The agentmesh direct path against its floor
    /// ([`super::report_direct`]).
    pub direct: Option<super::report_direct::DirectTargets>,
    /// Time from the first relayed call to the first direct one.
    pub time_to_direct: Option<super::report_direct::TimeToDirect>,
}

/// An agentmesh path through a router (the direct one has its own floor).
fn relayed_agentmesh(r: &Row) -> bool {
    r.path.starts_with("agentmesh") && r.path != super::report_direct::AGENTMESH_DIRECT
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"))
}

/// `a / b` when both are there and `b` is not 0.
fn factor(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

impl BenchReport {
    /// The markdown table; then each agentmesh row of each round against
    /// the same round's bare relay circuit (the targets); the bare circuit
    /// with TCP ends against the bare circuit (what the TCP ends cost); and
    /// each agentmesh row against the bare circuit with TCP ends (what is
    /// agentmesh's own).
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| round | path | MiB/s, 1 stream | RTT p50 ms | RTT p99 ms | MiB/s, N streams | CPU s/GiB caller | router | provider | peak RSS MiB caller | provider |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            let c = &r.cpu_secs_per_gib;
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.3} | {:.3} | {:.0} ({}) | {} | {} | {} | {} | {} |\n",
                r.round,
                r.path,
                r.single_mib_per_sec,
                r.rtt_p50_ms,
                r.rtt_p99_ms,
                r.concurrent_mib_per_sec,
                r.streams,
                cell(c.caller),
                cell(c.router),
                cell(c.provider),
                cell(r.peak_rss_mib.caller),
                cell(r.peak_rss_mib.provider),
            ));
        }
        out.push_str("\nTargets against the bare relay circuit of the same round:\n\n");
        out.push_str(&format!(
            "| round | path | throughput share (≥ {TARGET_THROUGHPUT_SHARE}) | RTT p50 factor (≤ {TARGET_RTT_FACTOR}) | router CPU/GiB factor (≤ {TARGET_ROUTER_CPU_FACTOR}) |\n|---|---|---|---|---|\n"
        ));
        for r in self.rows.iter().filter(|r| relayed_agentmesh(r)) {
            let Some(bare) = self.find(r.round, BARE_RELAY) else {
                continue;
            };
            let share = r.single_mib_per_sec / bare.single_mib_per_sec;
            let rtt = r.rtt_p50_ms / bare.rtt_p50_ms;
            let cpu = factor(r.cpu_secs_per_gib.router, bare.cpu_secs_per_gib.router);
            let mark = |ok: bool| if ok { "met" } else { "missed" };
            out.push_str(&format!(
                "| {} | {} | {share:.2} {} | {rtt:.2} {} | {} {} |\n",
                r.round,
                r.path,
                mark(share >= TARGET_THROUGHPUT_SHARE),
                mark(rtt <= TARGET_RTT_FACTOR),
                cell(cpu),
                mark(cpu.is_some_and(|c| c <= TARGET_ROUTER_CPU_FACTOR)),
            ));
        }
        self.push_tcp_ends(&mut out);
        out.push_str(&super::report_direct::markdown(
            self.direct.as_ref(),
            self.time_to_direct.as_ref(),
        ));
        out
    }

    /// The row of `path` in `round`.
    fn find(&self, round: u32, path: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|b| b.round == round && b.path == path)
    }

    /// The two tables that take the gap apart with the floor with TCP ends.
    fn push_tcp_ends(&self, out: &mut String) {
        let shares = |r: &Row, f: &Row| {
            (
                r.single_mib_per_sec / f.single_mib_per_sec,
                r.concurrent_mib_per_sec / f.concurrent_mib_per_sec,
                r.rtt_p50_ms / f.rtt_p50_ms,
            )
        };
        out.push_str(
            "\nThe TCP ends alone: the bare relay circuit with TCP ends against the bare relay circuit of the same round:\n\n\
             | round | throughput share, 1 stream | N streams | RTT p50 factor | router CPU/GiB factor |\n\
             |---|---|---|---|---|\n",
        );
        for f in self.rows.iter().filter(|r| r.path == BARE_RELAY_TCP_ENDS) {
            let Some(bare) = self.find(f.round, BARE_RELAY) else {
                continue;
            };
            let (one, many, rtt) = shares(f, bare);
            out.push_str(&format!(
                "| {} | {one:.2} | {many:.2} | {rtt:.2} | {} |\n",
                f.round,
                cell(factor(
                    f.cpu_secs_per_gib.router,
                    bare.cpu_secs_per_gib.router
                )),
            ));
        }
        out.push_str(
            "\nagentmesh's own: each agentmesh row against the bare relay circuit with TCP ends of the same round:\n\n\
             | round | path | throughput share, 1 stream | N streams | RTT p50 factor | CPU/GiB factor caller | router | provider |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for r in self.rows.iter().filter(|r| relayed_agentmesh(r)) {
            let Some(f) = self.find(r.round, BARE_RELAY_TCP_ENDS) else {
                continue;
            };
            let (one, many, rtt) = shares(r, f);
            let (c, fc) = (&r.cpu_secs_per_gib, &f.cpu_secs_per_gib);
            out.push_str(&format!(
                "| {} | {} | {one:.2} | {many:.2} | {rtt:.2} | {} | {} | {} |\n",
                r.round,
                r.path,
                cell(factor(c.caller, fc.caller)),
                cell(factor(c.router, fc.router)),
                cell(factor(c.provider, fc.provider)),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, mib: f64, rtt: f64, router: Option<f64>) -> Row {
        cpu_row(
            path,
            mib,
            rtt,
            CpuPerGib {
                router,
                ..CpuPerGib::default()
            },
        )
    }

    fn cpu_row(path: &str, mib: f64, rtt: f64, cpu: CpuPerGib) -> Row {
        Row {
            path: path.to_string(),
            round: 1,
            single_bytes: 1,
            single_mib_per_sec: mib,
            round_trips: 1,
            rtt_p50_ms: rtt,
            rtt_p99_ms: rtt,
            streams: 16,
            concurrent_bytes: 1,
            concurrent_mib_per_sec: mib,
            cpu_secs_per_gib: cpu,
            peak_rss_mib: PeakRss::default(),
            path_bytes: None,
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn targets_compare_with_the_bare_relay_of_the_round() {
        let report = BenchReport {
            command: String::new(),
            direct: None,
            time_to_direct: None,
            rows: vec![
                row(BARE_RELAY, 100.0, 0.2, Some(2.0)),
                row("agentmesh, same router", 95.0, 0.3, Some(2.2)),
            ],
        };
        let md = report.markdown();
        assert!(
            md.contains("| 1 | agentmesh, same router | 0.95 met | 1.50 missed | 1.10 met |"),
            "{md}"
        );
    }

    #[test]
    fn the_gap_is_taken_apart_with_the_floor_with_tcp_ends() {
        let cpu = |caller, router, provider| CpuPerGib {
            caller: Some(caller),
            router: Some(router),
            provider: Some(provider),
            ..CpuPerGib::default()
        };
        let report = BenchReport {
            command: String::new(),
            direct: None,
            time_to_direct: None,
            rows: vec![
                row(BARE_RELAY, 200.0, 0.2, Some(2.0)),
                cpu_row(BARE_RELAY_TCP_ENDS, 180.0, 0.24, cpu(2.0, 2.5, 4.0)),
                cpu_row("agentmesh, same router", 162.0, 0.36, cpu(3.0, 2.5, 5.0)),
            ],
        };
        let md = report.markdown();
        // The targets still compare with the bare circuit.
        assert!(
            md.contains("| 1 | agentmesh, same router | 0.81 missed | 1.80 missed | 1.25 missed |"),
            "{md}"
        );
        assert!(md.contains("| 1 | 0.90 | 0.90 | 1.20 | 1.25 |"), "{md}");
        assert!(
            md.contains("| 1 | agentmesh, same router | 0.90 | 0.90 | 1.50 | 1.50 | 1.00 | 1.25 |"),
            "{md}"
        );
    }
}
