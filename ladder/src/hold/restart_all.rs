//! The whole-mesh restart of the hold (`--restart-all-routers-at`, local
//! mode): every router gets SIGTERM at once and drains, as in a rollout of
//! every router or a restart of `agentmesh-one`; once every router process
//! has exited (SIGKILL after `--restart-all-routers-exit-deadline-secs`)
//! all of them start again on the same ports with the same keys. The
//! members have nowhere to go meanwhile: each loses its routers and comes
//! back on its own (with no router held a node fetches the directory again
//! with a short backoff, and lifts a DRAINING shun once a fresh directory
//! shows the router up again).
//!
//! Measured from the members' side, per member, from the instant the first
//! router was ready again: until ready again (one router held) and until
//! back on K, from the workers' window reports (each worker's times from
//! its mark, rebased through the wall clock the coordinator and the
//! workers share). Beside them: members that exited in the window, the
//! restarted routers' refusals (their counters start again at 0, so all
//! of them are the return's) and the control plane's requests by method
//! and code during the drain and during the return.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::FleetConfig;
use crate::error::Result;
use crate::fleet::Fleet;
use crate::observe::{self, ControlPlaneRaw};
use crate::report::{EventRecord, RestartAllRecord};
use crate::stats::Quantiles;
use crate::target::Target;
use crate::wire::WindowStats;

/// Runs the restart as the hold's event at `at` s, observing the fleet
/// until `window_end`.
pub(super) async fn run(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
    at: u64,
    window_end: Instant,
) -> Result<EventRecord> {
    let before = target.routers().await;
    let exits_before = fleet.tally.exits();
    let cp_start = target.control_plane().await;
    super::mark(fleet, "RestartAllRouters").await?;
    let marked = Instant::now();
    let mut record = EventRecord {
        at_secs: at,
        ..EventRecord::default()
    };
    let mut all = RestartAllRecord {
        routers: before.len() as u64,
        ..RestartAllRecord::default()
    };
    let deadline = Duration::from_secs(cfg.restart_all_routers_exit_deadline_secs);
    let mut cp_exited = None;
    let first_ready = match restart(fleet, target, deadline, &mut all, &mut cp_exited).await {
        Ok(first) => first,
        Err(e) => {
            eprintln!("\rladder: event RestartAllRouters: {e}");
            record.error = Some(e.to_string());
            None
        }
    };
    fleet.pump_until(window_end, |_| false).await;
    let after = target.routers().await;
    let cp_end = target.control_plane().await;
    let replies = super::window_replies(fleet).await?;
    if let Some(first) = first_ready {
        all.ready_after_first_router_ms =
            Quantiles::of(&rebased(&replies, first, |w| &w.ready_again_ms));
        all.on_k_after_first_router_ms =
            Quantiles::of(&rebased(&replies, first, |w| &w.back_on_k_ms));
    }
    let w = super::sum_windows(replies);
    record.window_secs = marked.elapsed().as_secs_f64();
    all.not_ready_again = w.not_ready_again;
    all.exits = fleet.tally.exits().saturating_sub(exits_before);
    if let Some((exited, exited_at)) = &cp_exited {
        all.control_plane_drain = load(cp_start.as_ref(), Some(exited), all.exited_ms);
        let ms = exited_at.elapsed().as_millis() as u64;
        all.control_plane_return = load(Some(exited), cp_end.as_ref(), Some(ms));
    }
    record.calls = super::window_calls(&w);
    record.fleet = super::fleet_window(w, &super::router_names(target));
    // The routers counted from 0 again when they started: all they
    // counted is the return's.
    record.router_refusals = super::delta(&[], &after, |r| &r.refusals);
    record.router_auth_failures = super::delta(&[], &after, |r| &r.auth_failures);
    eprintln!(
        "\rladder: event RestartAllRouters at {at} s: {} routers exited after {} ms, first ready after {} ms; lost ready {}, ready again after the first router p95/max {}/{} ms, not ready again {}, exits {}",
        all.routers,
        ms(all.exited_ms),
        ms(all.first_ready_ms),
        record.fleet.lost_ready,
        ms(all.ready_after_first_router_ms.p95),
        ms(all.ready_after_first_router_ms.max),
        all.not_ready_again,
        all.exits
    );
    record.restart_all = Some(all);
    Ok(record)
}

/// Stops every router, reads the control plane once all have exited
/// (`cp_exited`, with the instant), starts them all again; returns when the
/// first was ready again, Unix ms.
async fn restart(
    fleet: &mut Fleet,
    target: &mut Target,
    deadline: Duration,
    all: &mut RestartAllRecord,
    cp_exited: &mut Option<(ControlPlaneRaw, Instant)>,
) -> Result<Option<u64>> {
    let mesh = target.local("--restart-all-routers-at")?;
    let stopped = super::while_pumping(fleet, mesh.stop_all_routers(deadline)).await?;
    all.exited_ms = Some(stopped.exited_after.as_millis() as u64);
    all.killed_after_deadline = stopped.killed;
    eprintln!(
        "\rladder: every router exited after {:?} ({} SIGKILLed); starting them again",
        stopped.exited_after, stopped.killed
    );
    *cp_exited = target.control_plane().await.map(|cp| (cp, Instant::now()));
    let mesh = target.local("--restart-all-routers-at")?;
    let ready = super::while_pumping(fleet, mesh.start_all_routers()).await?;
    all.router_ready_ms = ready
        .iter()
        .map(|r| (r.name.clone(), r.after.as_millis() as u64))
        .collect::<BTreeMap<_, _>>();
    all.first_ready_ms = all.router_ready_ms.values().min().copied();
    all.all_ready_ms = all.router_ready_ms.values().max().copied();
    Ok(ready.iter().map(|r| r.unix_ms).min())
}

/// Each worker's `field` (ms from its mark) as ms from `since_unix_ms`
/// (0 for an instant before it).
fn rebased(
    replies: &[WindowStats],
    since_unix_ms: u64,
    field: impl Fn(&WindowStats) -> &Vec<u64>,
) -> Vec<u64> {
    replies
        .iter()
        .flat_map(|w| {
            field(w)
                .iter()
                .map(move |ms| (w.mark_unix_ms + ms).saturating_sub(since_unix_ms))
        })
        .collect()
}

/// The control plane's load between two readings `ms` apart.
fn load(
    before: Option<&ControlPlaneRaw>,
    after: Option<&ControlPlaneRaw>,
    ms: Option<u64>,
) -> Option<observe::ControlPlaneLoad> {
    observe::control_plane_load(before?, after?, ms? as f64 / 1000.0)
}

fn ms(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_times_are_rebased_to_the_first_router_ready() {
        // Two workers marked 40 ms apart; the first router was ready
        // 5,000 ms after the first mark.
        let a = WindowStats {
            mark_unix_ms: 1_000_000,
            ready_again_ms: vec![5_100, 7_000],
            back_on_k_ms: vec![4_000],
            ..WindowStats::default()
        };
        let b = WindowStats {
            mark_unix_ms: 1_000_040,
            ready_again_ms: vec![5_060],
            ..WindowStats::default()
        };
        let first = 1_005_000;
        let replies = [a, b];
        assert_eq!(
            rebased(&replies, first, |w| &w.ready_again_ms),
            vec![100, 2_000, 100]
        );
        // Back on K before the first router was ready counts as 0.
        assert_eq!(rebased(&replies, first, |w| &w.back_on_k_ms), vec![0]);
    }
}
