//! Reading the replicas themselves: the Watch streams each holds (which
//! replica the routers watch) and each one's memory and CPU. A stopped
//! replica is not asked: its HTTP listener would hold the read until its
//! deadline.

use std::time::Duration;

use super::ControlPlanes;
use crate::procstat;
use crate::prom::Metrics;
use crate::replicas::record::ReplicaState;

/// Open Watch streams (routers holding the push of policy, revocations and keys).
pub const WATCHERS: &str = "agentmesh_control_plane_watchers";
/// Replicas a replica counts live on its database.
pub const LIVE_REPLICAS: &str = "agentmesh_control_plane_live_replicas";
/// Deadline of one replica's `/metrics` read.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A replica's `/metrics` page, None when stopped or not answering.
async fn page(set: &ControlPlanes, i: usize) -> Option<Metrics> {
    if set.is_stopped(i) {
        return None;
    }
    let r = crate::http::get(set.replicas.get(i)?.http, "/metrics", SCRAPE_TIMEOUT)
        .await
        .ok()?;
    (r.status == 200).then(|| Metrics::parse(&r.body))
}

/// A gauge of a page, None when the page or the gauge is missing.
fn gauge(page: Option<&Metrics>, name: &str) -> Option<u64> {
    page.filter(|m| m.has(name))
        .map(|m| m.sum(name, &[]).max(0.0) as u64)
}

/// Every replica's name and Watch streams (None: stopped, or its
/// `/metrics` did not answer).
pub async fn watchers(set: &ControlPlanes) -> Vec<(String, Option<u64>)> {
    let reads = (0..set.replicas.len()).map(|i| page(set, i));
    let pages = futures::future::join_all(reads).await;
    set.replicas
        .iter()
        .zip(pages)
        .map(|(r, p)| (r.name.clone(), gauge(p.as_ref(), WATCHERS)))
        .collect()
}

/// Every replica now: its process's memory and CPU, its Watch streams and
/// the replicas it counts live.
pub async fn states(set: &ControlPlanes) -> Vec<ReplicaState> {
    let reads = (0..set.replicas.len()).map(|i| page(set, i));
    let pages = futures::future::join_all(reads).await;
    set.replicas
        .iter()
        .zip(pages)
        .map(|(r, p)| {
            let pid = r.pid();
            ReplicaState {
                name: r.name.clone(),
                grpc: r.grpc.to_string(),
                http: r.http.to_string(),
                pid,
                starts: r.starts,
                rss_bytes: pid.and_then(procstat::rss_bytes),
                peak_rss_bytes: pid.and_then(procstat::peak_rss_bytes),
                cpu_secs: pid.and_then(procstat::cpu_secs),
                watchers: gauge(p.as_ref(), WATCHERS),
                live_replicas: gauge(p.as_ref(), LIVE_REPLICAS),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_read_or_left_unknown() {
        let m = Metrics::parse(
            "# TYPE agentmesh_control_plane_watchers gauge\n\
             agentmesh_control_plane_watchers 4\n\
             agentmesh_control_plane_live_replicas 3\n",
        );
        assert_eq!(gauge(Some(&m), WATCHERS), Some(4));
        assert_eq!(gauge(Some(&m), LIVE_REPLICAS), Some(3));
        assert_eq!(gauge(Some(&Metrics::parse("")), WATCHERS), None);
        assert_eq!(gauge(None, WATCHERS), None);
    }
}
