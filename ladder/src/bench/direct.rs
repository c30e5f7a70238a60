//! The agentmesh direct path of the bench: knowing that a call went
//! direct, waiting until calls do, checking that a measured run did, and
//! timing how long after the first relayed call the first direct one
//! comes.
//!
//! How a call's path is known: the caller node counts every outbound
//! call by the path its stream took
//! (`agentmesh_node_calls_by_path_total{path}`) and every call byte by
//! path and direction (`agentmesh_node_call_bytes_by_path_total`). Only
//! the bench calls through the direct pair's caller, one call at a time
//! while probing, so the counter that moved across a probe is its path;
//! across a measured run the relayed bytes must not move at all and the
//! direct bytes sent must cover the run's payload, or the row fails.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::time::Instant;

use super::agentmesh::{self, Mesh};
use super::report_direct::TimeToDirect;
use super::row::PathBytes;
use crate::http;
use crate::prom::Metrics;

/// Deadline of one `/metrics` read.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time budget for calls to go direct once the first succeeded.
const UNTIL_DIRECT_BUDGET: Duration = Duration::from_secs(30);
/// Pause between probe calls while waiting for the direct path.
const PROBE_PAUSE: Duration = Duration::from_millis(10);
/// Time budget for the first call after a restart (the provider's record
/// is looked up again).
const FIRST_CALL_BUDGET: Duration = Duration::from_secs(60);

/// What the caller node has counted by path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PathCounts {
    /// Outbound calls whose stream went direct.
    pub calls_direct: u64,
    /// Outbound calls whose stream went through a router.
    pub calls_relayed: u64,
    /// Call bytes sent over direct connections.
    pub bytes_direct_sent: u64,
    /// Call bytes, both directions, over relayed connections.
    pub bytes_relayed: u64,
}

impl PathCounts {
    /// Reads them from the `/metrics` page at `addr`.
    pub async fn read(addr: SocketAddr) -> anyhow::Result<Self> {
        let page = http::get(addr, "/metrics", SCRAPE_TIMEOUT)
            .await
            .with_context(|| format!("reading {addr}/metrics"))?;
        if page.status != 200 {
            bail!("{addr}/metrics answered {}", page.status);
        }
        Ok(Self::parse(&Metrics::parse(&page.body)))
    }

    fn parse(m: &Metrics) -> Self {
        let calls = "agentmesh_node_calls_by_path_total";
        let bytes = "agentmesh_node_call_bytes_by_path_total";
        let n = |v: f64| v.max(0.0) as u64;
        Self {
            calls_direct: n(m.sum(calls, &[("path", "direct")])),
            calls_relayed: n(m.sum(calls, &[("path", "relayed")])),
            bytes_direct_sent: n(m.sum(bytes, &[("path", "direct"), ("direction", "sent")])),
            bytes_relayed: n(m.sum(bytes, &[("path", "relayed")])),
        }
    }
}

/// The path one call took, from the counts before and after it.
fn path_of(before: PathCounts, after: PathCounts) -> Option<bool> {
    let direct = after.calls_direct > before.calls_direct;
    let relayed = after.calls_relayed > before.calls_relayed;
    match (direct, relayed) {
        (true, false) => Some(true),
        (false, true) => Some(false),
        _ => None,
    }
}

/// One probe call through `forward`; `Ok(Some(direct))` when it succeeded
/// and one path counted it.
async fn probe_path(forward: SocketAddr, metrics: SocketAddr) -> anyhow::Result<Option<bool>> {
    let before = PathCounts::read(metrics).await?;
    agentmesh::probe(forward).await?;
    let after = PathCounts::read(metrics).await?;
    Ok(path_of(before, after))
}

/// Calls through `forward` until one goes direct, within
/// [`UNTIL_DIRECT_BUDGET`]; returns the caller's counts after it.
pub(super) async fn until_direct(
    forward: SocketAddr,
    metrics: SocketAddr,
) -> anyhow::Result<PathCounts> {
    let start = Instant::now();
    let mut last = String::from("no call went direct");
    while start.elapsed() < UNTIL_DIRECT_BUDGET {
        match probe_path(forward, metrics).await {
            Ok(Some(true)) => return PathCounts::read(metrics).await,
            Ok(_) => {}
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    bail!("calls through {forward} did not go direct within {UNTIL_DIRECT_BUDGET:?}: {last}")
}

/// Fails unless every byte of the run between `before` and `after` went
/// direct: no relayed byte, and at least `payload` bytes sent direct.
pub(super) fn check_direct(
    before: PathCounts,
    after: PathCounts,
    payload: u64,
) -> anyhow::Result<PathBytes> {
    let b = PathBytes {
        direct_sent: after
            .bytes_direct_sent
            .saturating_sub(before.bytes_direct_sent),
        relayed: after.bytes_relayed.saturating_sub(before.bytes_relayed),
    };
    if b.relayed > 0 || b.direct_sent < payload {
        bail!(
            "the run did not go direct: {} call bytes relayed, {} sent direct of {payload} sent",
            b.relayed,
            b.direct_sent
        );
    }
    Ok(b)
}

/// What [`TimeToDirect::method`] says.
const METHOD: &str = "for each sample the direct pair's caller node is stopped (SIGTERM) and started again \
     (same key and credential, a new listening and --forward port; the provider keeps running): \
     it holds no connection to the provider, so its next call opens a new circuit and the provider \
     starts a new punch. Probe calls (1 KiB sink each, one at a time, 10 ms apart) go through the \
     --forward; a probe's path is the caller's calls_by_path_total counter that moved across it. \
     A sample is the time from the completion of the first successful probe (relayed) to the \
     completion of the first probe that went direct; the 10 ms pause and each probe's own \
     duration bound its resolution.";

/// Takes `n` samples (see [`METHOD`]).
pub(super) async fn time_to_direct(mesh: &mut Mesh, n: u32) -> TimeToDirect {
    let mut t = TimeToDirect {
        method: METHOD.to_string(),
        ..TimeToDirect::default()
    };
    for i in 0..n {
        match sample(mesh).await {
            Ok(Some(d)) => t.samples_ms.push(d.as_secs_f64() * 1000.0),
            Ok(None) => t.direct_at_first_call += 1,
            Err(e) => t.failed.push(format!("sample {}: {e:#}", i + 1)),
        }
    }
    let q = |p| super::row::quantile(&t.samples_ms, p);
    (t.p50_ms, t.p95_ms, t.max_ms) = (q(0.5), q(0.95), q(1.0));
    t
}

/// One sample; `None` when the first successful call already went direct.
async fn sample(mesh: &mut Mesh) -> anyhow::Result<Option<Duration>> {
    mesh.restart_direct_caller().await?;
    let (forward, metrics) = (mesh.forward_direct, mesh.direct_caller_metrics());
    let start = Instant::now();
    let mut last = String::new();
    let first = loop {
        if start.elapsed() > FIRST_CALL_BUDGET {
            bail!("no call succeeded within {FIRST_CALL_BUDGET:?}: {last}");
        }
        match probe_path(forward, metrics).await {
            Ok(Some(direct)) => break (Instant::now(), direct),
            Ok(None) => last = "a call no path counted".to_string(),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    };
    let (relayed_done, direct) = first;
    if direct {
        return Ok(None);
    }
    while relayed_done.elapsed() < UNTIL_DIRECT_BUDGET {
        tokio::time::sleep(PROBE_PAUSE).await;
        if let Ok(Some(true)) = probe_path(forward, metrics).await {
            return Ok(Some(relayed_done.elapsed()));
        }
    }
    bail!("no call went direct within {UNTIL_DIRECT_BUDGET:?} of the first relayed one")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"agentmesh_node_calls_by_path_total{path="direct"} 3
agentmesh_node_calls_by_path_total{path="relayed"} 2
agentmesh_node_call_bytes_by_path_total{path="direct",direction="sent"} 5000
agentmesh_node_call_bytes_by_path_total{path="direct",direction="received"} 70
agentmesh_node_call_bytes_by_path_total{path="relayed",direction="sent"} 40
agentmesh_node_call_bytes_by_path_total{path="relayed",direction="received"} 2
"#;

    #[test]
    fn counts_are_read_by_path_and_a_call_has_the_path_whose_counter_moved() {
        let c = PathCounts::parse(&Metrics::parse(PAGE));
        assert_eq!(
            c,
            PathCounts {
                calls_direct: 3,
                calls_relayed: 2,
                bytes_direct_sent: 5000,
                bytes_relayed: 42,
            }
        );
        let mut direct = c;
        direct.calls_direct += 1;
        let mut relayed = c;
        relayed.calls_relayed += 1;
        assert_eq!(path_of(c, direct), Some(true));
        assert_eq!(path_of(c, relayed), Some(false));
        assert_eq!(path_of(c, c), None);
    }

    #[test]
    fn a_run_fails_unless_every_byte_went_direct() {
        let before = PathCounts::default();
        let mut after = before;
        after.bytes_direct_sent = 1000;
        assert_eq!(
            check_direct(before, after, 1000)
                .expect("direct")
                .direct_sent,
            1000
        );
        assert!(
            check_direct(before, after, 1001).is_err(),
            "short of the payload"
        );
        after.bytes_relayed = 1;
        assert!(check_direct(before, after, 1000).is_err(), "a relayed byte");
    }
}
