//! The quiet part of the hold: from its start until the first event (or
//! its end), sampled for [`IdleCost`] at both ends.

use tokio::time::Instant;

use crate::fleet::Fleet;
use crate::idle_cost::{CpuSample, IdleCost, sum_all};
use crate::procstat;
use crate::target::Target;

/// CPU used so far by the workers, routers and control plane (local mode;
/// routers and control plane of a remote mesh are `None`).
async fn sample(fleet: &Fleet, target: &mut Target, origin: Instant) -> CpuSample {
    let workers = sum_all(fleet.worker_pids().into_iter().map(procstat::cpu_secs));
    let routers = target.routers().await;
    let routers = (!routers.is_empty())
        .then(|| sum_all(routers.iter().map(|r| r.cpu_secs)))
        .flatten();
    let control_plane = target
        .local("control plane pid")
        .ok()
        .and_then(|m| m.control_plane_pid())
        .and_then(procstat::cpu_secs);
    CpuSample {
        at_secs: origin.elapsed().as_secs_f64(),
        workers,
        routers,
        control_plane,
    }
}

/// Samples now, applies the fleet's events until `until`, samples again:
/// the idle cost of `members` over that window.
pub(super) async fn measure(
    fleet: &mut Fleet,
    target: &mut Target,
    members: u64,
    until: Instant,
) -> Option<IdleCost> {
    let origin = Instant::now();
    let before = sample(fleet, target, origin).await;
    fleet.pump_until(until, |_| false).await;
    let after = sample(fleet, target, origin).await;
    let cost = IdleCost::between(&before, &after, members);
    if let Some(c) = &cost {
        eprintln!(
            "\rladder: idle over the quiet {:.0} s of the hold: {} CPU-s per member per hour on the member side, {} on the routers, {} on the control plane",
            c.secs,
            c.member_cpu_secs_per_member_hour
                .map_or("-".into(), |v| format!("{v:.2}")),
            c.router_cpu_secs_per_member_hour
                .map_or("-".into(), |v| format!("{v:.2}")),
            c.control_plane_cpu_secs_per_member_hour
                .map_or("-".into(), |v| format!("{v:.2}")),
        );
    }
    cost
}
