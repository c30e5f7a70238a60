//! Snapshots of the mesh's programs: router connections, memory, CPU and
//! refusals; control-plane RPC latency, codes and storage rows. Read from
//! their `/metrics` and (for local children) `/proc`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::http;
use crate::procstat;
use crate::prom::{self, Metrics};

/// Deadline of one `/metrics` read.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Router metric names (see router/src/metrics.rs).
mod names {
    pub(super) const ATTACHED: &str = "agentmesh_router_attached_members";
    pub(super) const TRANSIT: &str = "agentmesh_router_transit_connections";
    pub(super) const CONNECTIONS: &str = "agentmesh_router_connections";
    pub(super) const REFUSED: &str = "agentmesh_router_refused_total";
    pub(super) const AUTH: &str = "agentmesh_router_auth_total";
    pub(super) const RELAYED_BYTES: &str = "agentmesh_router_relayed_bytes_total";
    pub(super) const CIRCUIT_REQUESTS: &str = "agentmesh_router_circuit_requests_total";
    pub(super) const CIRCUITS_UPGRADED: &str = "agentmesh_router_circuits_upgraded_total";
    pub(super) const ALLOC_ALLOCATED: &str = "agentmesh_runtime_allocator_allocated_bytes";
    pub(super) const ALLOC_ACTIVE: &str = "agentmesh_runtime_allocator_active_bytes";
    pub(super) const ALLOC_RESIDENT: &str = "agentmesh_runtime_allocator_resident_bytes";
    pub(super) const ALLOC_METADATA: &str = "agentmesh_runtime_allocator_metadata_bytes";
    pub(super) const CP_RPC_SECONDS: &str = "agentmesh_control_plane_rpc_duration_seconds";
    pub(super) const CP_RPCS: &str = "agentmesh_control_plane_rpc_total";
    pub(super) const CP_STORAGE_ROWS: &str = "agentmesh_control_plane_storage_rows";
    pub(super) const CP_LIMITER_REFUSALS: &str = "agentmesh_control_plane_limiter_refusals_total";
}

/// One router at one instant.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouterSnapshot {
    /// Router name (`r0`, `r1`…).
    pub name: String,
    /// Whether its `/metrics` answered.
    pub up: bool,
    /// Members attached (admitted with purpose attach).
    pub attached: u64,
    /// Transit connections.
    pub transit: u64,
    /// Open connections of every kind.
    pub connections: u64,
    /// Connections that are neither attached members nor transit (routers, unauthenticated).
    pub other: u64,
    /// Resident memory, bytes (local children only).
    pub rss_bytes: Option<u64>,
    /// Of `rss_bytes`, anonymous pages (heap, stacks), bytes (local children only).
    pub rss_anon_bytes: Option<u64>,
    /// Of `rss_bytes`, file-backed and shared pages (the binary), bytes (local children only).
    pub rss_file_bytes: Option<u64>,
    /// CPU time used since start, seconds (local children only).
    pub cpu_secs: Option<f64>,
    /// Open file descriptors (local children only).
    pub open_fds: Option<usize>,
    /// Refusals so far by `resource/scope/protocol` (non-zero only).
    pub refusals: BTreeMap<String, u64>,
    /// Auth failures so far by `purpose/result` (non-zero, not admitted).
    pub auth_failures: BTreeMap<String, u64>,
    /// What the router relayed so far: `relayed_bytes` (both directions),
    /// `circuits_accepted`, `circuits_upgraded` (circuits a member said a
    /// direct connection replaced). Counters, so a window shows their
    /// increase (`hold::delta`); absent when the router does not serve them.
    pub relay: BTreeMap<String, u64>,
    /// What the router's allocator holds (None each for a binary without the gauges).
    #[serde(flatten)]
    pub allocator: AllocatorBytes,
}

/// A router's jemalloc totals from `agentmesh_runtime_allocator_*_bytes`:
/// beside RSS they tell memory still allocated (state the router keeps)
/// from pages the allocator holds but the router no longer uses. Each is
/// `None` (JSON null) when the router does not serve that gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AllocatorBytes {
    /// `agentmesh_runtime_allocator_allocated_bytes`: allocated, not freed.
    pub allocator_allocated_bytes: Option<u64>,
    /// `agentmesh_runtime_allocator_active_bytes`: in pages holding allocations.
    pub allocator_active_bytes: Option<u64>,
    /// `agentmesh_runtime_allocator_resident_bytes`: resident pages the allocator maps.
    pub allocator_resident_bytes: Option<u64>,
    /// `agentmesh_runtime_allocator_metadata_bytes`: the allocator's own metadata.
    pub allocator_metadata_bytes: Option<u64>,
}

impl AllocatorBytes {
    /// Reads the gauges from a parsed `/metrics` page.
    pub fn from_metrics(m: &Metrics) -> Self {
        let gauge = |name: &str| m.has(name).then(|| m.sum(name, &[]).max(0.0) as u64);
        Self {
            allocator_allocated_bytes: gauge(names::ALLOC_ALLOCATED),
            allocator_active_bytes: gauge(names::ALLOC_ACTIVE),
            allocator_resident_bytes: gauge(names::ALLOC_RESIDENT),
            allocator_metadata_bytes: gauge(names::ALLOC_METADATA),
        }
    }
}

/// Reads one router: `/metrics` at `metrics`, memory and CPU from `pid`.
pub async fn router(name: &str, metrics: SocketAddr, pid: Option<u32>) -> RouterSnapshot {
    let rss = pid.and_then(procstat::rss_with_split);
    let split = rss.and_then(|(_, split)| split);
    let mut s = RouterSnapshot {
        name: name.to_string(),
        rss_bytes: rss.map(|(total, _)| total),
        rss_anon_bytes: split.map(|s| s.anon),
        rss_file_bytes: split.map(|s| s.file),
        cpu_secs: pid.and_then(procstat::cpu_secs),
        open_fds: pid.and_then(procstat::open_fds),
        ..RouterSnapshot::default()
    };
    let Ok(page) = http::get(metrics, "/metrics", SCRAPE_TIMEOUT).await else {
        return s;
    };
    if page.status != 200 {
        return s;
    }
    read_router_metrics(&mut s, &Metrics::parse(&page.body));
    s
}

/// Fills `s` from a router's parsed `/metrics`.
fn read_router_metrics(s: &mut RouterSnapshot, m: &Metrics) {
    s.up = true;
    s.allocator = AllocatorBytes::from_metrics(m);
    s.attached = m.sum(names::ATTACHED, &[]) as u64;
    s.transit = m.sum(names::TRANSIT, &[]) as u64;
    s.connections = m.sum(names::CONNECTIONS, &[]) as u64;
    s.other = s.connections.saturating_sub(s.attached + s.transit);
    for sample in m.select(names::REFUSED, &[]) {
        if sample.value > 0.0 {
            let key = ["resource", "scope", "protocol"]
                .iter()
                .map(|l| sample.labels.get(*l).map(String::as_str).unwrap_or("-"))
                .collect::<Vec<_>>()
                .join("/");
            *s.refusals.entry(key).or_insert(0) += sample.value as u64;
        }
    }
    for (key, name, filter) in [
        ("relayed_bytes", names::RELAYED_BYTES, &[][..]),
        (
            "circuits_accepted",
            names::CIRCUIT_REQUESTS,
            &[("result", "accepted")][..],
        ),
        ("circuits_upgraded", names::CIRCUITS_UPGRADED, &[][..]),
    ] {
        if m.has(name) {
            s.relay.insert(key.to_string(), m.sum(name, filter) as u64);
        }
    }
    for sample in m.select(names::AUTH, &[]) {
        let result = sample
            .labels
            .get("result")
            .map(String::as_str)
            .unwrap_or("-");
        if sample.value > 0.0 && result != "admitted" {
            let purpose = sample
                .labels
                .get("purpose")
                .map(String::as_str)
                .unwrap_or("-");
            *s.auth_failures
                .entry(format!("{purpose}/{result}"))
                .or_insert(0) += sample.value as u64;
        }
    }
}

/// The control plane at one instant (raw, for differences between two instants).
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneRaw {
    /// Whether `/metrics` answered.
    pub up: bool,
    /// RPC latency histogram buckets (all methods).
    pub rpc_buckets: Vec<(f64, f64)>,
    /// RPCs by gRPC code.
    pub codes: BTreeMap<String, f64>,
    /// RPCs by `method/code`.
    pub rpcs: BTreeMap<String, f64>,
    /// Rows per table.
    pub storage_rows: BTreeMap<String, f64>,
    /// Enrollments refused by the rate limiter, so far.
    pub enroll_limited: f64,
    /// Resident memory, bytes.
    pub rss_bytes: Option<u64>,
    /// Refresh latency histogram buckets.
    pub refresh_buckets: Vec<(f64, f64)>,
    /// Refresh RPCs by gRPC code.
    pub refresh_codes: BTreeMap<String, f64>,
    /// The control plane's CPU time so far, seconds.
    pub cpu_secs: Option<f64>,
    /// The database server the ladder started (PostgreSQL: the postmaster
    /// and its backends), read at the same instant.
    pub store_server: Option<procstat::TreeUsage>,
}

/// The gRPC method members and routers refresh their credentials with.
const REFRESH: &[(&str, &str)] = &[("method", "Refresh")];

/// Reads the control plane's `/metrics` at `http_addr` (and `/proc` for `pid`).
/// `store_pid` is the database server's, when the ladder started one.
/// `http_addr` None: `/proc` only, not `up` (a SIGSTOPped replica, whose
/// listener would hold the read until its deadline).
pub async fn control_plane(
    http_addr: Option<SocketAddr>,
    pid: Option<u32>,
    store_pid: Option<u32>,
) -> ControlPlaneRaw {
    let mut raw = ControlPlaneRaw {
        rss_bytes: pid.and_then(procstat::rss_bytes),
        cpu_secs: pid.and_then(procstat::cpu_secs),
        store_server: store_pid.and_then(procstat::tree_usage),
        ..ControlPlaneRaw::default()
    };
    let Some(http_addr) = http_addr else {
        return raw;
    };
    let Ok(page) = http::get(http_addr, "/metrics", SCRAPE_TIMEOUT).await else {
        return raw;
    };
    if page.status != 200 {
        return raw;
    }
    read_control_plane_metrics(&mut raw, &Metrics::parse(&page.body));
    raw
}

/// Fills `raw` from the control plane's parsed `/metrics`.
fn read_control_plane_metrics(raw: &mut ControlPlaneRaw, m: &Metrics) {
    raw.up = true;
    raw.rpc_buckets = m.buckets(names::CP_RPC_SECONDS);
    raw.codes = m.group_by(names::CP_RPCS, "code");
    raw.rpcs = m.group_by_labels(names::CP_RPCS, &["method", "code"]);
    raw.storage_rows = m.group_by(names::CP_STORAGE_ROWS, "table");
    raw.enroll_limited = m.sum(names::CP_LIMITER_REFUSALS, &[("limiter", "enroll")]);
    raw.refresh_buckets = m.buckets_where(names::CP_RPC_SECONDS, REFRESH);
    raw.refresh_codes = m.group_by_where(names::CP_RPCS, "code", REFRESH);
}

/// Several replicas' readings at one instant as one control plane's:
/// counters and histograms added up (every replica runs the same binary,
/// so the buckets match), memory and CPU added up, table rows the largest
/// reading (only the replica holding the reaper's lease counts them), up
/// only if every replica answered. One reading is returned as it is.
pub fn merge_control_planes(parts: Vec<ControlPlaneRaw>) -> ControlPlaneRaw {
    let mut it = parts.into_iter();
    let Some(mut out) = it.next() else {
        return ControlPlaneRaw::default();
    };
    for p in it {
        out.up &= p.up;
        add_buckets(&mut out.rpc_buckets, &p.rpc_buckets);
        add_buckets(&mut out.refresh_buckets, &p.refresh_buckets);
        for (mine, theirs) in [
            (&mut out.codes, &p.codes),
            (&mut out.rpcs, &p.rpcs),
            (&mut out.refresh_codes, &p.refresh_codes),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        for (k, v) in &p.storage_rows {
            let e = out.storage_rows.entry(k.clone()).or_insert(0.0);
            *e = e.max(*v);
        }
        out.enroll_limited += p.enroll_limited;
        out.rss_bytes = add(out.rss_bytes, p.rss_bytes);
        out.cpu_secs = add(out.cpu_secs, p.cpu_secs);
        out.store_server = out.store_server.or(p.store_server);
    }
    out
}

/// Both added, or None when either is unknown.
fn add<T: std::ops::Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
    Some(a? + b?)
}

/// Adds `more`'s cumulative bucket counts to `into`'s, bound by bound.
fn add_buckets(into: &mut Vec<(f64, f64)>, more: &[(f64, f64)]) {
    for (bound, n) in more {
        match into.iter_mut().find(|(b, _)| b == bound) {
            Some((_, m)) => *m += n,
            None => into.push((*bound, *n)),
        }
    }
    into.sort_by(|a, b| a.0.total_cmp(&b.0));
}

/// What the control plane did between two instants.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ControlPlaneStep {
    /// RPC latency p50 over the interval, ms (bucket upper bound, as p99).
    pub rpc_p50_ms: Option<f64>,
    /// RPC latency p99 over the interval, ms (bucket upper bound; None if no RPC or no histogram).
    pub rpc_p99_ms: Option<f64>,
    /// Refresh RPCs answered over the interval, every code.
    pub refreshes: u64,
    /// RPCs over the interval by gRPC code (non-zero only).
    pub codes: BTreeMap<String, u64>,
    /// Rows per table at the end.
    pub storage_rows: BTreeMap<String, u64>,
    /// Resident memory at the end, bytes.
    pub rss_bytes: Option<u64>,
    /// The database server's CPU over the interval, seconds (a server the
    /// ladder started).
    pub store_server_cpu_secs: Option<f64>,
    /// The database server's PSS at the end, bytes.
    pub store_server_pss_bytes: Option<u64>,
}

/// The interval between `before` and `after`.
pub fn control_plane_between(
    before: &ControlPlaneRaw,
    after: &ControlPlaneRaw,
) -> ControlPlaneStep {
    let codes = differences(&before.codes, &after.codes);
    ControlPlaneStep {
        rpc_p50_ms: quantile_ms(&before.rpc_buckets, &after.rpc_buckets, 0.5),
        rpc_p99_ms: quantile_ms(&before.rpc_buckets, &after.rpc_buckets, 0.99),
        refreshes: differences(&before.refresh_codes, &after.refresh_codes)
            .values()
            .sum(),
        codes,
        storage_rows: after
            .storage_rows
            .iter()
            .map(|(t, n)| (t.clone(), *n as u64))
            .collect(),
        rss_bytes: after.rss_bytes,
        store_server_cpu_secs: cpu_between(
            before.store_server.map(|u| u.cpu_secs),
            after.store_server.map(|u| u.cpu_secs),
        ),
        store_server_pss_bytes: after.store_server.map(|u| u.pss_bytes),
    }
}

/// CPU seconds between two readings of one process (tree).
fn cpu_between(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some((after? - before?).max(0.0))
}

/// The `q` quantile of the observations between two bucket snapshots, ms.
fn quantile_ms(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    prom::quantile_between(before, after, q).map(|s| if s.is_finite() { s * 1000.0 } else { s })
}

/// `after − before` per key (non-zero only).
fn differences(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), d as u64))
        })
        .collect()
}

/// The requests the control plane answered between two instants, by
/// method and code, and what serving them cost: the load a whole fleet
/// puts on it when it comes back (`--restart-all-routers-at`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ControlPlaneLoad {
    /// Length of the interval, seconds.
    pub secs: f64,
    /// RPCs answered, every method and code.
    pub requests: u64,
    /// `requests` per second over the interval.
    pub per_sec: f64,
    /// RPCs by `method/code` (`GetDirectory/Ok`, `Enroll/ResourceExhausted`;
    /// non-zero only): refusals show here.
    pub by_method: BTreeMap<String, u64>,
    /// RPC latency p99 over the interval, ms (bucket upper bound).
    pub p99_ms: Option<f64>,
    /// The control plane's CPU over the interval, seconds.
    pub cpu_secs: Option<f64>,
}

/// The control plane's load between `before` and `after`, `secs` apart
/// (`None` unless both answered: a restarted control plane's counters
/// would not subtract).
pub fn control_plane_load(
    before: &ControlPlaneRaw,
    after: &ControlPlaneRaw,
    secs: f64,
) -> Option<ControlPlaneLoad> {
    if !(before.up && after.up) {
        return None;
    }
    let by_method = differences(&before.rpcs, &after.rpcs);
    let requests = by_method.values().sum();
    Some(ControlPlaneLoad {
        secs,
        requests,
        per_sec: if secs > 0.0 {
            requests as f64 / secs
        } else {
            0.0
        },
        by_method,
        p99_ms: quantile_ms(&before.rpc_buckets, &after.rpc_buckets, 0.99),
        cpu_secs: cpu_between(before.cpu_secs, after.cpu_secs),
    })
}

impl ControlPlaneLoad {
    /// `N requests (R/s; p99 P ms; CPU C s): method/code=n, …`.
    pub fn summary(&self) -> String {
        let by = self
            .by_method
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{} requests in {:.1} s ({:.1}/s; p99 {} ms; CPU {}): {}",
            self.requests,
            self.secs,
            self.per_sec,
            crate::stats::ms_cell(self.p99_ms),
            self.cpu_secs
                .map_or_else(|| "-".into(), |c| format!("{c:.1} s")),
            if by.is_empty() { "-".into() } else { by }
        )
    }
}

/// Credential refreshes the control plane answered over a window (the
/// hold), from its `rpc_total{method="Refresh"}` and
/// `rpc_duration_seconds{method="Refresh"}`: members' and routers' own
/// refreshes, due about two thirds into each credential's lifetime
/// (`--credential-ttl-secs`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RefreshRecord {
    /// Length of the window, seconds.
    pub secs: f64,
    /// Refreshes answered OK.
    pub refreshes: u64,
    /// OK refreshes per second over the window.
    pub per_sec: f64,
    /// Refresh RPCs by gRPC code (non-zero only; refusals show here).
    pub codes: BTreeMap<String, u64>,
    /// Refresh latency p50, ms (bucket upper bound; None: no refresh).
    pub p50_ms: Option<f64>,
    /// Refresh latency p95, ms.
    pub p95_ms: Option<f64>,
    /// Refresh latency p99, ms.
    pub p99_ms: Option<f64>,
    /// The control plane's CPU over the window, seconds.
    pub control_plane_cpu_secs: Option<f64>,
    /// The database server's CPU over the window, seconds (a server the
    /// ladder started: PostgreSQL's postmaster and backends; None for
    /// SQLite, which runs inside the control plane).
    pub store_server_cpu_secs: Option<f64>,
    /// The database server's PSS at the window's end, bytes.
    pub store_server_pss_bytes: Option<u64>,
}

/// The refreshes between `before` and `after`, `secs` apart.
pub fn refresh_between(
    before: &ControlPlaneRaw,
    after: &ControlPlaneRaw,
    secs: f64,
) -> RefreshRecord {
    let codes = differences(&before.refresh_codes, &after.refresh_codes);
    let refreshes = codes.get("Ok").copied().unwrap_or(0);
    let q = |q| quantile_ms(&before.refresh_buckets, &after.refresh_buckets, q);
    RefreshRecord {
        secs,
        refreshes,
        per_sec: if secs > 0.0 {
            refreshes as f64 / secs
        } else {
            0.0
        },
        codes,
        p50_ms: q(0.5),
        p95_ms: q(0.95),
        p99_ms: q(0.99),
        control_plane_cpu_secs: cpu_between(before.cpu_secs, after.cpu_secs),
        store_server_cpu_secs: cpu_between(
            before.store_server.map(|u| u.cpu_secs),
            after.store_server.map(|u| u.cpu_secs),
        ),
        store_server_pss_bytes: after.store_server.map(|u| u.pss_bytes),
    }
}

impl RefreshRecord {
    /// One line for the markdown report.
    pub fn summary(&self) -> String {
        let ms = crate::stats::ms_cell;
        let codes = self
            .codes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "Refresh over the hold ({:.0} s): {} refreshes, {:.1}/s; Refresh RPC p50/p95/p99 {}/{}/{} ms; codes {}.",
            self.secs,
            self.refreshes,
            self.per_sec,
            ms(self.p50_ms),
            ms(self.p95_ms),
            ms(self.p99_ms),
            if codes.is_empty() { "-".into() } else { codes }
        )
    }

    /// One line on what serving the window cost: the control plane's CPU
    /// and the database server's CPU and memory.
    pub fn cost(&self) -> String {
        let secs = |c: Option<f64>| c.map_or_else(|| "-".into(), |c| format!("{c:.1} s"));
        let server = match (self.store_server_cpu_secs, self.store_server_pss_bytes) {
            (None, None) => {
                "no database server of the ladder's (SQLite runs inside the control plane)"
                    .to_string()
            }
            (cpu, pss) => format!(
                "database server CPU {}, PSS {}",
                secs(cpu),
                pss.map_or_else(
                    || "-".into(),
                    |b| format!("{:.1} MiB", b as f64 / 1_048_576.0)
                )
            ),
        };
        format!(
            "Cost over the hold: control-plane CPU {}; {server}.",
            secs(self.control_plane_cpu_secs)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real release router's `/metrics` after a ladder's fleet left.
    const ROUTER_PAGE: &str = include_str!("../testdata/router-after-ladder.metrics");

    #[test]
    fn router_snapshot_sums_relayed_bytes_over_both_directions() {
        let page = "agentmesh_router_relayed_bytes_total{direction=\"in\"} 100\n\
                    agentmesh_router_relayed_bytes_total{direction=\"out\"} 23\n\
                    agentmesh_router_circuits_upgraded_total 4\n";
        let mut s = RouterSnapshot::default();
        read_router_metrics(&mut s, &Metrics::parse(page));
        assert_eq!(
            s.relay,
            [
                ("relayed_bytes".to_string(), 123),
                ("circuits_upgraded".to_string(), 4)
            ]
            .into()
        );
    }

    #[test]
    fn router_snapshot_reads_allocator_gauges_or_null() {
        let mut s = RouterSnapshot::default();
        read_router_metrics(&mut s, &Metrics::parse(ROUTER_PAGE));
        assert!(s.up);
        // That binary served circuit requests, not relayed bytes or upgrades.
        assert_eq!(
            s.relay,
            [("circuits_accepted".to_string(), 1198)].into(),
            "{:?}",
            s.relay
        );
        assert_eq!(s.attached, 0);
        assert_eq!(s.auth_failures.len(), 0, "{:?}", s.auth_failures);
        assert_eq!(
            s.refusals.get("circuit/peer/relay_stop"),
            Some(&10675),
            "{:?}",
            s.refusals
        );
        assert_eq!(
            s.allocator,
            AllocatorBytes {
                allocator_allocated_bytes: Some(6_963_312),
                allocator_active_bytes: Some(11_993_088),
                allocator_resident_bytes: Some(16_478_208),
                allocator_metadata_bytes: Some(4_093_504),
            }
        );
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["allocator_resident_bytes"], 16_478_208);

        // An older router without the gauges: the snapshot still reads, values null.
        let old: String = ROUTER_PAGE
            .lines()
            .filter(|l| !l.contains("agentmesh_runtime_allocator_"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut s = RouterSnapshot::default();
        read_router_metrics(&mut s, &Metrics::parse(&old));
        assert!(s.up);
        assert_eq!(s.allocator, AllocatorBytes::default());
        let json = serde_json::to_value(&s).expect("json");
        for key in [
            "allocator_allocated_bytes",
            "allocator_active_bytes",
            "allocator_resident_bytes",
            "allocator_metadata_bytes",
        ] {
            assert!(json[key].is_null(), "{key}: {json}");
            assert!(json.as_object().expect("object").contains_key(key));
        }
    }

    #[test]
    fn replicas_add_up_as_one_control_plane() {
        let one = |ok: f64, rows: f64, up: bool| ControlPlaneRaw {
            up,
            rpc_buckets: vec![(0.001, ok), (f64::INFINITY, ok)],
            codes: [("Ok".to_string(), ok)].into(),
            storage_rows: [("nodes".to_string(), rows)].into(),
            rss_bytes: Some(100),
            cpu_secs: Some(1.5),
            ..ControlPlaneRaw::default()
        };
        let m = merge_control_planes(vec![one(10.0, 0.0, true), one(5.0, 42.0, true)]);
        assert!(m.up);
        assert_eq!(m.codes["Ok"], 15.0);
        assert_eq!(m.rpc_buckets, vec![(0.001, 15.0), (f64::INFINITY, 15.0)]);
        assert_eq!(m.storage_rows["nodes"], 42.0);
        assert_eq!((m.rss_bytes, m.cpu_secs), (Some(200), Some(3.0)));
        let down = merge_control_planes(vec![one(1.0, 0.0, true), one(0.0, 0.0, false)]);
        assert!(!down.up);
        let single = merge_control_planes(vec![one(3.0, 7.0, true)]);
        assert_eq!(single.codes["Ok"], 3.0);
        assert!(!merge_control_planes(Vec::new()).up);
    }

    #[test]
    fn control_plane_interval_takes_differences() {
        let before = ControlPlaneRaw {
            up: true,
            rpc_buckets: vec![(0.001, 10.0), (0.1, 10.0), (f64::INFINITY, 10.0)],
            codes: [("Ok".to_string(), 10.0)].into(),
            ..ControlPlaneRaw::default()
        };
        let after = ControlPlaneRaw {
            up: true,
            rpc_buckets: vec![(0.001, 10.0), (0.1, 110.0), (f64::INFINITY, 110.0)],
            codes: [
                ("Ok".to_string(), 100.0),
                ("ResourceExhausted".to_string(), 10.0),
            ]
            .into(),
            storage_rows: [("nodes".to_string(), 42.0)].into(),
            ..ControlPlaneRaw::default()
        };
        let step = control_plane_between(&before, &after);
        assert_eq!(step.rpc_p50_ms, Some(100.0));
        assert_eq!(step.rpc_p99_ms, Some(100.0));
        assert_eq!(step.refreshes, 0);
        assert_eq!(step.codes.get("Ok"), Some(&90));
        assert_eq!(step.codes.get("ResourceExhausted"), Some(&10));
        assert_eq!(step.storage_rows.get("nodes"), Some(&42));
    }

    /// A real control plane's page after a refresh flood (20,000 Refresh
    /// RPCs, all refused): the refresh window counts Refresh only.
    #[test]
    fn refreshes_are_read_from_the_refresh_method_only() {
        let mut after = ControlPlaneRaw::default();
        read_control_plane_metrics(
            &mut after,
            &Metrics::parse(include_str!("../testdata/control-plane-attacked.metrics")),
        );
        let before = ControlPlaneRaw::default();
        let r = refresh_between(&before, &after, 10.0);
        assert_eq!(r.refreshes, 0, "{r:?}");
        assert_eq!(r.per_sec, 0.0);
        assert_eq!(r.codes.get("ResourceExhausted"), Some(&19_967), "{r:?}");
        assert_eq!(r.codes.get("InvalidArgument"), Some(&33), "{r:?}");
        assert_eq!(r.codes.values().sum::<u64>(), 20_000);
        assert_eq!((r.p50_ms, r.p99_ms), (Some(0.5), Some(0.5)));
        let step = control_plane_between(&before, &after);
        assert_eq!(step.refreshes, 20_000);
        // The whole page's RPCs include slower methods than the refused refreshes.
        assert!(step.rpc_p99_ms > r.p99_ms, "{step:?} {r:?}");
        assert!(
            r.summary().contains("ResourceExhausted=19967"),
            "{}",
            r.summary()
        );

        // OK refreshes over a window give a rate.
        let mut later = after.clone();
        *later.refresh_codes.entry("Ok".into()).or_default() += 50.0;
        let r = refresh_between(&after, &later, 10.0);
        assert_eq!((r.refreshes, r.per_sec), (50, 5.0));
    }

    /// The same real page: the load between two readings counts every
    /// request by method and code, refusals included; a control plane
    /// that did not answer gives none.
    #[test]
    fn control_plane_load_is_by_method_and_code() {
        let mut after = ControlPlaneRaw::default();
        read_control_plane_metrics(
            &mut after,
            &Metrics::parse(include_str!("../testdata/control-plane-attacked.metrics")),
        );
        let before = ControlPlaneRaw {
            up: true,
            rpcs: [("GetDirectory/Ok".to_string(), 1_022.0)].into(),
            ..ControlPlaneRaw::default()
        };
        let load = control_plane_load(&before, &after, 10.0).expect("both answered");
        assert_eq!(load.by_method.get("GetDirectory/Ok"), Some(&10_000));
        assert_eq!(load.by_method.get("Enroll/ResourceExhausted"), Some(&9_989));
        assert_eq!(
            load.by_method.get("Refresh/ResourceExhausted"),
            Some(&19_967)
        );
        assert!(!load.by_method.contains_key("RouterLease/AlreadyExists"));
        assert_eq!(load.requests, load.by_method.values().sum::<u64>());
        assert_eq!(load.per_sec, load.requests as f64 / 10.0);
        assert!(
            load.summary().contains("GetDirectory/Ok=10000"),
            "{}",
            load.summary()
        );
        let down = ControlPlaneRaw::default();
        assert_eq!(control_plane_load(&down, &after, 10.0), None);
    }

    #[test]
    fn the_database_servers_cost_is_its_cpu_between_readings() {
        let at = |cp: f64, server: Option<f64>| ControlPlaneRaw {
            cpu_secs: Some(cp),
            store_server: server.map(|cpu_secs| procstat::TreeUsage {
                cpu_secs,
                pss_bytes: 64 << 20,
                processes: 5,
            }),
            ..ControlPlaneRaw::default()
        };
        let r = refresh_between(&at(10.0, Some(3.0)), &at(12.5, Some(7.0)), 60.0);
        assert_eq!(r.control_plane_cpu_secs, Some(2.5));
        assert_eq!(r.store_server_cpu_secs, Some(4.0));
        assert_eq!(
            r.cost(),
            "Cost over the hold: control-plane CPU 2.5 s; database server CPU 4.0 s, PSS 64.0 MiB."
        );
        let step = control_plane_between(&at(10.0, Some(3.0)), &at(12.5, Some(7.0)));
        assert_eq!(step.store_server_cpu_secs, Some(4.0));
        assert_eq!(step.store_server_pss_bytes, Some(64 << 20));
        // SQLite: no server; a restarted server never gives negative CPU.
        let sqlite = refresh_between(&at(1.0, None), &at(2.0, None), 60.0);
        assert!(
            sqlite.cost().contains("no database server"),
            "{}",
            sqlite.cost()
        );
        let restarted = refresh_between(&at(1.0, Some(9.0)), &at(2.0, Some(1.0)), 60.0);
        assert_eq!(restarted.store_server_cpu_secs, Some(0.0));
    }
}
