//! What `--restart-all-routers-at` measures beside the other router events:
//! every router drained and started again at once (a rollout of the whole
//! mesh, or `agentmesh-one` restarted), seen from the members' side.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::EventRecord;
use super::joined;
use crate::observe::ControlPlaneLoad;
use crate::stats::Quantiles;

/// The way back a restart of the whole mesh is held to: members ready
/// again (one router held) within this p95 after the first router is back, ms.
const READY_AGAIN_P95_TARGET_MS: u64 = 10_000;
/// … and within this at most, ms.
const READY_AGAIN_MAX_TARGET_MS: u64 = 30_000;

/// The whole mesh's routers restarted at once: the routers' side (drain,
/// exit, start, ready again), the members' way back measured from the
/// first router ready again, and the control plane's load meanwhile.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RestartAllRecord {
    /// Routers stopped and started again.
    pub routers: u64,
    /// SIGTERM (drain) → every router process exited, ms.
    pub exited_ms: Option<u64>,
    /// Routers still running at `--restart-all-routers-exit-deadline-secs`
    /// and SIGKILLed then.
    pub killed_after_deadline: u64,
    /// Every router exited → the first router ready again (`/readyz`), ms.
    pub first_ready_ms: Option<u64>,
    /// Every router exited → the last router ready again, ms.
    pub all_ready_ms: Option<u64>,
    /// Per router: every router exited → it was ready again, ms.
    pub router_ready_ms: BTreeMap<String, u64>,
    /// Per member that lost readiness in the window: the first router ready
    /// again → the member ready again (one router held), ms (0: ready
    /// again before it, which all routers gone cannot give).
    pub ready_after_first_router_ms: Quantiles,
    /// Members that lost readiness and were not ready again at the window's end.
    pub not_ready_again: u64,
    /// Per member that fell below K in the window: the first router ready
    /// again → back on K routers, ms.
    pub on_k_after_first_router_ms: Quantiles,
    /// Members alive at the event that exited in the window.
    pub exits: u64,
    /// The control plane from the event until every router had exited
    /// (members told to go away, with nowhere to go).
    pub control_plane_drain: Option<ControlPlaneLoad>,
    /// The control plane from every router exited until the window's end:
    /// the routers enrolling and leasing again and the members fetching
    /// directories with no router held, then attaching again.
    pub control_plane_return: Option<ControlPlaneLoad>,
}

/// The return table: one row for the event, then the control plane's load.
pub(super) fn markdown(s: &mut String, e: &EventRecord) {
    let Some(r) = &e.restart_all else {
        return;
    };
    let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| restart all routers | at s | routers | exited after ms (SIGKILLed) | first/all ready ms | lost ready | ready again after the first router p50/p95/p99/max ms (n) | not ready again | back on K after the first router p50/p95/p99/max ms (n) | not back on K | exits | router refusals during the return |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        s,
        "| {} | {} | {} | {} ({}) | {}/{} | {} | {} | {} | {} | {} | {} | {} |",
        e.error
            .as_deref()
            .map_or("done".to_string(), |err| format!("error: {err}")),
        e.at_secs,
        r.routers,
        n(r.exited_ms),
        r.killed_after_deadline,
        n(r.first_ready_ms),
        n(r.all_ready_ms),
        e.fleet.lost_ready,
        r.ready_after_first_router_ms.cell(),
        r.not_ready_again,
        r.on_k_after_first_router_ms.cell(),
        e.fleet.not_back_on_k,
        r.exits,
        joined(&e.router_refusals)
    );
    let q = &r.ready_after_first_router_ms;
    let met = match (q.p95, q.max) {
        _ if r.not_ready_again > 0 => "missed (not every member was ready again)",
        (Some(p95), Some(max))
            if p95 <= READY_AGAIN_P95_TARGET_MS && max <= READY_AGAIN_MAX_TARGET_MS =>
        {
            "met"
        }
        (Some(_), Some(_)) => "missed",
        _ => "not measured",
    };
    let _ = writeln!(
        s,
        "- members ready again after the first router: p95 {} ms, max {} ms (target p95 ≤ {} s, max ≤ {} s: {met})",
        n(q.p95),
        n(q.max),
        READY_AGAIN_P95_TARGET_MS / 1000,
        READY_AGAIN_MAX_TARGET_MS / 1000
    );
    for (when, load) in [
        ("the drain", &r.control_plane_drain),
        ("the return", &r.control_plane_return),
    ] {
        let line = load
            .as_ref()
            .map_or_else(|| "not read".to_string(), ControlPlaneLoad::summary);
        let _ = writeln!(s, "- control plane during {when}: {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::FleetWindow;

    #[test]
    fn the_return_row_carries_the_members_way_back() {
        let e = EventRecord {
            at_secs: 5,
            fleet: FleetWindow {
                lost_ready: 12,
                not_back_on_k: 1,
                ..FleetWindow::default()
            },
            router_refusals: [("r1:attach/peer/-".to_string(), 3)].into(),
            restart_all: Some(RestartAllRecord {
                routers: 3,
                exited_ms: Some(3_100),
                first_ready_ms: Some(900),
                all_ready_ms: Some(1_400),
                ready_after_first_router_ms: Quantiles::of(&[100, 200, 300]),
                on_k_after_first_router_ms: Quantiles::of(&[400, 500]),
                control_plane_return: Some(ControlPlaneLoad {
                    secs: 10.0,
                    requests: 40,
                    per_sec: 4.0,
                    by_method: [("GetDirectory/Ok".to_string(), 40)].into(),
                    ..ControlPlaneLoad::default()
                }),
                ..RestartAllRecord::default()
            }),
            ..EventRecord::default()
        };
        let mut s = String::new();
        markdown(&mut s, &e);
        assert!(
            s.contains(
                "| done | 5 | 3 | 3100 (0) | 900/1400 | 12 | 200/300/300/300 (3) | 0 | 400/500/500/500 (2) | 1 | 0 | r1:attach/peer/-=3 |"
            ),
            "{s}"
        );
        assert!(
            s.contains("- control plane during the drain: not read"),
            "{s}"
        );
        assert!(
            s.contains("- control plane during the return: 40 requests in 10.0 s (4.0/s;"),
            "{s}"
        );
        assert!(s.contains("GetDirectory/Ok=40"), "{s}");
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(
            json["restart_all"]["ready_after_first_router_ms"]["p95"],
            300
        );
        assert_eq!(json["lost_ready"], 12);
        // Other events carry no `restart_all` key.
        let other = serde_json::to_value(EventRecord::default()).expect("json");
        assert!(other.get("restart_all").is_none(), "{other}");
    }
}
