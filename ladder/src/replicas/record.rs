//! The report's `control_planes` object and the replica events' details,
//! with their markdown.

use std::fmt::Write as _;

use serde::Serialize;

use super::leases::LeaseRecord;
use super::monitor::{PgConnectionsRecord, SigningKeysRecord};
use crate::stats::Quantiles;

/// The control plane's replicas over the run (local mode).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ControlPlanesRecord {
    /// Replicas (`--control-planes`).
    pub replicas: u32,
    /// The one `--public-url` every replica serves (proofs are bound to it).
    pub public_url: String,
    /// The addresses routers and members dial (`--control-plane-endpoint`).
    pub endpoints: Vec<String>,
    /// `--kill-control-plane-every-secs`.
    pub kill_every_secs: Option<u64>,
    /// The seed of the kills' draws.
    pub kill_seed: Option<u64>,
    /// Replicas killed during the hold.
    pub kills: u64,
    /// SIGKILL → the restarted replica's `/readyz`, ms.
    pub kill_ready_ms: Quantiles,
    /// The routers' leases: lapses and the longest gaps.
    pub router_leases: LeaseRecord,
    /// The signing keys against the rotations due (PostgreSQL only).
    pub signing_keys: Option<SigningKeysRecord>,
    /// PostgreSQL connections in use against `max_connections`.
    pub postgres_connections: Option<PgConnectionsRecord>,
    /// Each replica at the end of the hold.
    pub at_end: Vec<ReplicaState>,
}

/// One replica at one instant.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplicaState {
    /// `cp0`, `cp1`…
    pub name: String,
    /// Its gRPC address.
    pub grpc: String,
    /// Its HTTP address (`/readyz`, `/metrics`).
    pub http: String,
    /// Its process (the latest start's).
    pub pid: Option<u32>,
    /// Times it was started (1: never restarted).
    pub starts: u32,
    /// Resident memory, bytes.
    pub rss_bytes: Option<u64>,
    /// Peak resident memory of this process, bytes.
    pub peak_rss_bytes: Option<u64>,
    /// CPU time of this process, seconds.
    pub cpu_secs: Option<f64>,
    /// Watch streams it holds (`agentmesh_control_plane_watchers`).
    pub watchers: Option<u64>,
    /// Replicas it counts live (`agentmesh_control_plane_live_replicas`).
    pub live_replicas: Option<u64>,
}

/// What a replica event did beyond the fleet's window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplicaEvent {
    /// Kills: the seed of the draws.
    pub seed: Option<u64>,
    /// Replicas the draw was made among (running, not stopped).
    pub live: Vec<String>,
    /// The target's Watch streams just before the event.
    pub target_watchers: Option<u64>,
    /// Stop: how long it stayed stopped, ms (SIGSTOP → SIGCONT).
    pub stopped_ms: Option<u64>,
    /// Rolling restart: each replica in turn.
    pub rolling: Vec<RollingStep>,
}

/// One replica of a rolling restart.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RollingStep {
    /// The replica.
    pub replica: String,
    /// Waited for a SIGSTOP on it to end first, ms.
    pub waited_for_stop_ms: u64,
    /// SIGTERM → its process gone, ms.
    pub exited_ms: u64,
    /// Started again → its `/readyz`, ms.
    pub ready_ms: Option<u64>,
    /// Why it did not come back, if it did not.
    pub error: Option<String>,
}

impl ReplicaEvent {
    /// Notes for the events table's row.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(s) = self.seed {
            out.push(format!("seed {s}, drawn among {}", self.live.join(" ")));
        }
        if let Some(w) = self.target_watchers {
            out.push(format!("{w} watch streams on it"));
        }
        if let Some(ms) = self.stopped_ms {
            out.push(format!("stopped {ms} ms"));
        }
        for r in &self.rolling {
            let ready = r
                .ready_ms
                .map_or_else(|| "not ready".to_string(), |ms| format!("ready {ms} ms"));
            let err = r
                .error
                .as_deref()
                .map_or_else(String::new, |e| format!(" ({e})"));
            out.push(format!(
                "{}: exited {} ms, {ready}{err}",
                r.replica, r.exited_ms
            ));
        }
        out
    }
}

/// Bytes as MiB with one decimal, `-` when unknown.
fn mib(b: Option<u64>) -> String {
    b.map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1_048_576.0))
}

impl ControlPlanesRecord {
    /// The markdown section.
    pub fn markdown(&self, s: &mut String) {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Control planes: {} replica(s) serving {} at {}.",
            self.replicas,
            self.public_url,
            if self.endpoints.is_empty() {
                "its own address".to_string()
            } else {
                self.endpoints.join(", ")
            }
        );
        if self.kill_every_secs.is_some() {
            let _ = writeln!(
                s,
                "- kills: {} (every {} s, seed {}), ready again p50/p95/p99/max {} ms",
                self.kills,
                self.kill_every_secs.unwrap_or(0),
                self.kill_seed.map_or_else(|| "-".into(), |x| x.to_string()),
                self.kill_ready_ms.cell()
            );
        }
        let l = &self.router_leases;
        let gaps = l
            .by_router
            .iter()
            .map(|(r, x)| format!("{r}={:.1}", x.max_gap_ms as f64 / 1000.0))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "- lapsed router leases: {} ({} routers; TTL {} s; longest gap without an accepted lease, s: {})",
            l.lapses,
            l.routers_lapsed,
            l.lease_ttl_secs,
            if gaps.is_empty() { "-".into() } else { gaps }
        );
        if let Some(k) = &self.signing_keys {
            let n = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
            let _ = writeln!(
                s,
                "- signing keys: {} at the start, {} at the end, {} created; rotations due {} ({} scheduled, {} admin){}{}",
                n(k.at_start),
                n(k.at_end),
                n(k.created),
                k.rotations_due,
                k.scheduled_rotations,
                k.admin_rotations,
                match k.one_per_rotation {
                    Some(true) => ": one key per rotation",
                    Some(false) => ": NOT one key per rotation",
                    None => "",
                },
                k.error
                    .as_deref()
                    .map_or_else(String::new, |e| format!(" (error: {e})"))
            );
        }
        if let Some(c) = &self.postgres_connections {
            let n = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
            let _ = writeln!(
                s,
                "- PostgreSQL connections in use: peak {}, last {} of max_connections {} ({} samples, {} failed)",
                n(c.peak),
                n(c.last),
                n(c.max_connections),
                c.samples,
                c.errors
            );
        }
        for r in &self.at_end {
            let _ = writeln!(
                s,
                "- {} at the end: started {} time(s), RSS {} MiB (peak {}), CPU {} s, {} watch streams, counts {} live",
                r.name,
                r.starts,
                mib(r.rss_bytes),
                mib(r.peak_rss_bytes),
                r.cpu_secs.map_or_else(|| "-".into(), |c| format!("{c:.1}")),
                r.watchers.map_or_else(|| "-".into(), |w| w.to_string()),
                r.live_replicas
                    .map_or_else(|| "-".into(), |w| w.to_string()),
            );
        }
    }
}
