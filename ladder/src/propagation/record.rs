//! The record of one propagation event and its rows in the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

pub use crate::stats::Quantiles;

/// What one propagation event (`--policy-change-at` or `--revoke-token-at`)
/// took, from the admin call to each member concerned.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PropagationRecord {
    /// Seconds into the hold.
    pub at_secs: u64,
    /// From the admin call to the window's report, seconds.
    pub window_secs: f64,
    /// Error carrying out the event, if any.
    pub error: Option<String>,
    /// The policy version the change applied (policy change).
    pub version: Option<u64>,
    /// The token revoked (revocation).
    pub token_id: Option<String>,
    /// With replicas: the one the admin call was sent through, chosen
    /// among those holding no router's Watch stream.
    pub via: Option<crate::replicas::choice::ReplicaChoice>,
    /// Members concerned by taking the change: every live member (policy
    /// change), every live member not revoked (revocation).
    pub members: u64,
    /// Admin call → the member holds the new version (policy change) or
    /// the revocation (revocation), per member: what it acknowledges to
    /// its router.
    pub took_ms: Quantiles,
    /// Members concerned that had not taken it by the window's end.
    pub not_taken: u64,
    /// The calls held open across the event (JSON: `live_calls`,
    /// `live_calls_not_opened`, `live_calls_ended_before`, `closed_ms`,
    /// `still_open`, `close_reasons` at this level).
    #[serde(flatten)]
    pub held: HeldCalls,
    /// The routers' policy pushes over the window, summed over routers:
    /// `outcome=acked|ignored|failed|timeout|dropped` and
    /// `decision=pushed|probed|…` (`agentmesh_router_policy_push_total`,
    /// `…_decisions_total`).
    pub router_pushes: BTreeMap<String, u64>,
    /// The members enrolled with the revoked token (JSON:
    /// `revoked_members`, `dropped_ms`, `not_dropped` at this level).
    #[serde(flatten)]
    pub revoked: Revoked,
    /// The fleet's echo calls in the window (still granted): ok, failed.
    pub calls_ok: u64,
    /// See `calls_ok`.
    pub calls_failed: u64,
    /// What the window cost the control plane and the routers (JSON:
    /// `control_plane_cpu_secs`, `router_cpu_secs`, `control_plane_rss_*`,
    /// `enrolled_members` at this level).
    #[serde(flatten)]
    pub cost: MeshCost,
}

/// The calls held open across a propagation event that it forbids: on
/// the removed grant (policy change), by the revoked members (revocation).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HeldCalls {
    /// Such calls open at the event.
    pub live_calls: u64,
    /// Such calls that could not be opened before the event.
    pub live_calls_not_opened: u64,
    /// Such calls that ended before the admin call (not counted below).
    pub live_calls_ended_before: u64,
    /// Admin call → the call's stream ended at the caller, per call.
    pub closed_ms: Quantiles,
    /// Held calls still open at the window's end.
    pub still_open: u64,
    /// How the held calls ended, by reason.
    pub close_reasons: BTreeMap<String, u64>,
}

/// The members a revocation concerns.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Revoked {
    /// Live members enrolled with the revoked token (revocation).
    pub revoked_members: u64,
    /// Admin call → the revoked member held no router, per member.
    pub dropped_ms: Quantiles,
    /// Revoked members still holding a router at the window's end.
    pub not_dropped: u64,
}

/// What a propagation window cost the control plane and the routers.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct MeshCost {
    /// Control-plane CPU over the window, seconds.
    pub control_plane_cpu_secs: Option<f64>,
    /// Each router's CPU over the window, seconds.
    pub router_cpu_secs: BTreeMap<String, f64>,
    /// Control-plane RSS at the window's end, bytes.
    pub control_plane_rss_bytes: Option<u64>,
    /// Control-plane RSS before the first member joined, bytes.
    pub control_plane_rss_pre_ladder_bytes: Option<u64>,
    /// Members enrolled and live at the window's end.
    pub enrolled_members: u64,
    /// (RSS at the window's end − RSS before the ladder) ÷ enrolled members, bytes.
    pub control_plane_rss_per_member_bytes: Option<u64>,
}

impl PropagationRecord {
    /// Sets the pre-ladder RSS and the per-member figure from it.
    pub fn set_rss_baseline(&mut self, pre_ladder: Option<u64>) {
        let c = &mut self.cost;
        c.control_plane_rss_pre_ladder_bytes = pre_ladder;
        c.control_plane_rss_per_member_bytes = match (c.control_plane_rss_bytes, pre_ladder) {
            (Some(now), Some(pre)) if c.enrolled_members > 0 => {
                Some(now.saturating_sub(pre) / c.enrolled_members)
            }
            _ => None,
        };
    }
}

/// The propagation rows of the report: one per event given.
pub fn markdown(s: &mut String, rows: &[(&str, &Option<PropagationRecord>)]) {
    if rows.iter().all(|(_, r)| r.is_none()) {
        return;
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| propagation | at s | members | took p50/p95/p99/max ms (n) | not taken | forbidden calls closed p50/p95/p99/max ms (n of open) | still open | revoked dropped p50/p95/p99/max ms (n of revoked) | not dropped | CP CPU s | routers CPU s | CP RSS per member KiB | notes |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, r) in rows {
        let Some(r) = r else { continue };
        let mut notes = Vec::new();
        if let Some(e) = &r.error {
            notes.push(format!("error: {e}"));
        }
        if let Some(v) = r.version {
            notes.push(format!("version {v}"));
        }
        if let Some(t) = &r.token_id {
            notes.push(format!("token {t}"));
        }
        if let Some(v) = &r.via {
            notes.push(format!(
                "sent through {} ({} watch streams on it)",
                v.replica,
                v.watchers.map_or_else(|| "-".into(), |w| w.to_string())
            ));
        }
        if r.held.live_calls_not_opened > 0 {
            notes.push(format!(
                "{} held calls not opened",
                r.held.live_calls_not_opened
            ));
        }
        if r.held.live_calls_ended_before > 0 {
            notes.push(format!(
                "{} held calls ended before the event",
                r.held.live_calls_ended_before
            ));
        }
        if !r.held.close_reasons.is_empty() {
            let reasons: Vec<String> = r
                .held
                .close_reasons
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            notes.push(format!("ended by {}", reasons.join(", ")));
        }
        if !r.router_pushes.is_empty() {
            let pushes: Vec<String> = r
                .router_pushes
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            notes.push(format!("router pushes {}", pushes.join(", ")));
        }
        notes.push(format!(
            "echo calls ok/failed {}/{}",
            r.calls_ok, r.calls_failed
        ));
        let routers_cpu: f64 = r.cost.router_cpu_secs.values().sum();
        let revoked = if r.revoked.revoked_members > 0 || r.token_id.is_some() {
            format!(
                "{} of {}",
                r.revoked.dropped_ms.cell(),
                r.revoked.revoked_members
            )
        } else {
            "-".to_string()
        };
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} of {} | {} | {} | {} | {} | {:.2} | {} | {} |",
            r.at_secs,
            r.members,
            r.took_ms.cell(),
            r.not_taken,
            r.held.closed_ms.cell(),
            r.held.live_calls,
            r.held.still_open,
            revoked,
            r.revoked.not_dropped,
            r.cost
                .control_plane_cpu_secs
                .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
            routers_cpu,
            r.cost
                .control_plane_rss_per_member_bytes
                .map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1024.0)),
            notes.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_the_row() {
        let q = Quantiles::of(&(1..=100).collect::<Vec<_>>());
        assert_eq!(
            (q.count, q.p50, q.p95, q.p99, q.max),
            (100, Some(50), Some(95), Some(99), Some(100))
        );
        assert_eq!(Quantiles::of(&[]).cell(), "-/-/-/- (0)");
        let mut r = PropagationRecord {
            at_secs: 5,
            members: 20,
            took_ms: Quantiles::of(&[10, 20]),
            held: HeldCalls {
                live_calls: 2,
                closed_ms: Quantiles::of(&[30, 40]),
                ..HeldCalls::default()
            },
            cost: MeshCost {
                control_plane_rss_bytes: Some(10_000),
                enrolled_members: 10,
                ..MeshCost::default()
            },
            ..PropagationRecord::default()
        };
        r.set_rss_baseline(Some(5_000));
        assert_eq!(r.cost.control_plane_rss_per_member_bytes, Some(500));
        let mut s = String::new();
        markdown(
            &mut s,
            &[("policy change", &Some(r)), ("revoke token", &None)],
        );
        assert!(
            s.contains("| policy change | 5 | 20 | 10/20/20/20 (2) |"),
            "{s}"
        );
        assert!(s.contains("30/40/40/40 (2) of 2"), "{s}");
        assert!(!s.contains("revoke token"), "{s}");
    }
}
