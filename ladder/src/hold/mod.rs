//! The hold: every member's readiness sampled each second by its worker, and
//! the events (`--kill-router-at`, `--drain-router-at`,
//! `--restart-control-plane-at`, `--rotate-key-at`, the whole-mesh
//! restart of [`restart_all`], the attack of [`attack`], the
//! propagation events of [`policy`] and the control-plane replica events
//! of [`replicas`]), each observed from its instant until the next event
//! or the end of the hold.

mod attack;
pub mod policy;
mod quiet;
mod replicas;
mod restart_all;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::FleetConfig;
use crate::error::{LadderError, Result};
use crate::fleet::Fleet;
use crate::mesh::{LocalMesh, RouterState};
use crate::observe::RouterSnapshot;
use crate::replicas::choice::{KillPicker, kill_times};
use crate::report::{EventRecord, Events, FleetWindow, HoldRecord, WindowCalls};
use crate::stats;
use crate::target::Target;
use crate::wire::{
    BelowKRecord, Command, FlapRecord, HoldStats, MAX_FLAP_RECORDS, Reply, WindowStats,
    pick_below_k,
};

/// Deadline for the workers' answers to a report command.
const REPORT_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    KillRouter,
    DrainRouter,
    RestartControlPlane,
    RotateKey,
    /// `--restart-all-routers-at`: see [`restart_all`].
    RestartAllRouters,
    /// `--attack-router-at` / `--attack-control-plane-at`: see [`attack`].
    Attack,
    /// `--policy-change-at`: see [`policy`].
    PolicyChange,
    /// `--revoke-token-at`: see [`policy`].
    RevokeToken,
    /// One kill of `--kill-control-plane-every-secs`: see [`replicas`].
    KillControlPlane,
    /// `--rolling-restart-control-planes-at`: see [`replicas`].
    RollingRestartControlPlanes,
    /// `--stop-control-plane-at`: see [`replicas`].
    StopControlPlane,
}

/// The events recorded so far, and the kills' draws.
struct Progress {
    events: Events,
    picker: KillPicker,
}

/// Runs the hold; returns its record and the events'.
pub async fn run(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
) -> Result<(HoldRecord, Events)> {
    let members = fleet.tally.alive();
    fleet
        .broadcast(|id| Command::HoldStart { id }, REPORT_DEADLINE)
        .await?;
    let start = Instant::now();
    let end = start + Duration::from_secs(cfg.hold_secs);
    let plan = plan(cfg);
    // The quiet part first: until the first event, nothing but idling.
    let quiet_end = plan
        .first()
        .map(|(at, _)| start + Duration::from_secs(*at))
        .unwrap_or(end)
        .min(end);
    let idle = quiet::measure(fleet, target, members, quiet_end).await;
    let seed = cfg.replicas.kill_seed.unwrap_or_else(rand::random);
    if let Some(every) = cfg.replicas.kill_every_secs {
        eprintln!(
            "\rladder: a control-plane replica is killed every {every} s, draws seeded with {seed}"
        );
    }
    let mut progress = Progress {
        events: Events::default(),
        picker: KillPicker::new(seed),
    };
    for (i, (at, kind)) in plan.iter().enumerate() {
        let at_instant = start + Duration::from_secs(*at);
        if at_instant >= end {
            eprintln!(
                "\rladder: event {kind:?} at {at} s is past the hold ({} s); skipped",
                cfg.hold_secs
            );
            continue;
        }
        fleet.pump_until(at_instant, |_| false).await;
        let window_end = plan
            .get(i + 1)
            .map(|(next, _)| start + Duration::from_secs(*next))
            .unwrap_or(end)
            .min(end);
        let window = Window {
            hold_start: start,
            end: window_end,
            hold_end: end,
        };
        run_event(fleet, target, cfg, *kind, *at, window, &mut progress).await?;
    }
    let events = progress.events;
    fleet.pump_until(end, |_| false).await;
    let replies = fleet
        .broadcast(|id| Command::HoldReport { id }, REPORT_DEADLINE)
        .await?;
    let sum = sum_holds(replies);
    let flap_records = first_flaps(sum.flap_records, &router_names(target));
    let record = HoldRecord {
        secs: cfg.hold_secs,
        members,
        samples: sum.samples,
        flaps: sum.flaps,
        members_flapped: sum.members_flapped,
        fewest_ready: sum.fewest_ready,
        ready_at_end: fleet.tally.ready_now(),
        exits: sum.exits,
        socket_checks: sum.socket_checks,
        socket_mismatches: sum.socket_mismatches,
        socket_unanswered: sum.socket_unanswered,
        socket_changed: sum.socket_changed,
        socket_read_max_ms: sum.socket_read_max_ms,
        flap_records,
        idle,
        control_plane_memory: None,
    };
    eprintln!(
        "\rladder: hold {} s: flaps {}, fewest ready {}, exits {}",
        record.secs, record.flaps, record.fewest_ready, record.exits
    );
    Ok((record, events))
}

/// The events the flags ask for, earliest first.
fn plan(cfg: &FleetConfig) -> Vec<(u64, Kind)> {
    let mut plan: Vec<(u64, Kind)> = [
        (cfg.kill_router_at_secs, Kind::KillRouter),
        (cfg.drain_router_at_secs, Kind::DrainRouter),
        (cfg.restart_control_plane_at_secs, Kind::RestartControlPlane),
        (cfg.rotate_key_at_secs, Kind::RotateKey),
        (cfg.restart_all_routers_at_secs, Kind::RestartAllRouters),
        (cfg.attack.starts_at(), Kind::Attack),
        (cfg.propagation.policy_change_at_secs, Kind::PolicyChange),
        (cfg.propagation.revoke_token_at_secs, Kind::RevokeToken),
        (
            cfg.replicas.rolling_restart_at_secs,
            Kind::RollingRestartControlPlanes,
        ),
        (cfg.replicas.stop_at_secs, Kind::StopControlPlane),
    ]
    .into_iter()
    .filter_map(|(at, k)| at.map(|at| (at, k)))
    .collect();
    if let Some(every) = cfg.replicas.kill_every_secs {
        plan.extend(
            kill_times(every, cfg.hold_secs)
                .into_iter()
                .map(|at| (at, Kind::KillControlPlane)),
        );
    }
    plan.sort_by_key(|(at, _)| *at);
    plan
}

/// One event's window in the hold.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The hold's start.
    hold_start: Instant,
    /// The window's end: the next event, or the hold's end.
    end: Instant,
    /// The hold's end.
    hold_end: Instant,
}

/// Carries out the event `kind` at `at` s and records it in `events`.
async fn run_event(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
    kind: Kind,
    at: u64,
    window: Window,
    progress: &mut Progress,
) -> Result<()> {
    let window_end = window.end;
    let events = &mut progress.events;
    match kind {
        Kind::KillControlPlane | Kind::RollingRestartControlPlanes | Kind::StopControlPlane => {
            let what = match kind {
                Kind::KillControlPlane => replicas::What::Kill,
                Kind::RollingRestartControlPlanes => replicas::What::RollingRestart,
                _ => replicas::What::Stop,
            };
            let stop_secs = cfg.replicas.stop_secs;
            let picker = &mut progress.picker;
            let r = replicas::run(fleet, target, what, stop_secs, picker, at, window_end).await?;
            match what {
                replicas::What::Kill => events.kill_control_plane.push(r),
                replicas::What::RollingRestart => events.rolling_restart_control_planes = Some(r),
                replicas::What::Stop => events.stop_control_plane = Some(r),
            }
        }
        Kind::Attack => {
            events.attack =
                Some(attack::run(fleet, target, cfg, window.hold_start, window_end).await?);
        }
        Kind::RestartAllRouters => {
            let r = restart_all::run(fleet, target, cfg, at, window_end).await?;
            events.restart_all_routers = Some(r);
        }
        Kind::PolicyChange | Kind::RevokeToken => {
            let what = match kind {
                Kind::PolicyChange => policy::What::PolicyChange,
                _ => policy::What::RevokeToken,
            };
            let revoked_before = events.revoke_token.is_some();
            let r = policy::run(fleet, target, cfg, what, at, window_end, revoked_before).await?;
            match what {
                policy::What::PolicyChange => events.policy_change = Some(r),
                policy::What::RevokeToken => events.revoke_token = Some(r),
            }
        }
        Kind::KillRouter | Kind::DrainRouter | Kind::RestartControlPlane | Kind::RotateKey => {
            let record = event(fleet, target, kind, at, window_end, window.hold_end).await?;
            let slot = match kind {
                Kind::KillRouter => &mut events.kill_router,
                Kind::DrainRouter => &mut events.drain_router,
                Kind::RestartControlPlane => &mut events.restart_control_plane,
                _ => &mut events.rotate_key,
            };
            *slot = Some(record);
        }
    }
    Ok(())
}

/// The workers' hold reports, summed.
fn sum_holds(replies: Vec<Reply>) -> HoldStats {
    let mut sum = HoldStats::default();
    for r in replies {
        if let Reply::Hold(h) = r {
            sum.samples = sum.samples.max(h.samples);
            sum.flaps += h.flaps;
            sum.members_flapped += h.members_flapped;
            sum.fewest_ready += h.fewest_ready;
            sum.exits += h.exits;
            sum.socket_checks += h.socket_checks;
            sum.socket_mismatches += h.socket_mismatches;
            sum.socket_unanswered += h.socket_unanswered;
            sum.socket_changed += h.socket_changed;
            sum.socket_read_max_ms = sum.socket_read_max_ms.max(h.socket_read_max_ms);
            sum.flap_records.extend(h.flap_records);
        }
    }
    sum
}

/// Router names by PeerId (local mode; empty for a remote mesh).
fn router_names(target: &mut Target) -> BTreeMap<String, String> {
    match target.local("router names") {
        Ok(mesh) => mesh.router_names(),
        Err(_) => BTreeMap::new(),
    }
}

/// Replaces router PeerIds in `ids` by their names where known.
fn name_routers(ids: &mut [String], names: &BTreeMap<String, String>) {
    for id in ids {
        if let Some(n) = names.get(id) {
            *id = n.clone();
        }
    }
}

/// Replaces router PeerIds in an error text by their names where known.
fn name_in_text(text: &mut Option<String>, names: &BTreeMap<String, String>) {
    if let Some(t) = text {
        for (id, name) in names {
            *t = t.replace(id.as_str(), name);
        }
    }
}

/// The earliest [`MAX_FLAP_RECORDS`] of the workers' flap records, router
/// PeerIds replaced by the names in `names` where known.
fn first_flaps(mut all: Vec<FlapRecord>, names: &BTreeMap<String, String>) -> Vec<FlapRecord> {
    all.sort_by(|a, b| a.at_secs.total_cmp(&b.at_secs));
    all.truncate(MAX_FLAP_RECORDS);
    for r in &mut all {
        name_routers(&mut r.routers_before, names);
        name_routers(&mut r.leaving_before, names);
        name_routers(&mut r.routers_after, names);
        name_in_text(&mut r.last_router_error, names);
    }
    all
}

/// The workers' below-K records as [`pick_below_k`] picks them, routers
/// named as in [`first_flaps`].
fn first_below_k(all: Vec<BelowKRecord>, names: &BTreeMap<String, String>) -> Vec<BelowKRecord> {
    let mut all = pick_below_k(all);
    for r in &mut all {
        name_routers(&mut r.routers_before, names);
        name_routers(&mut r.routers_after, names);
        name_in_text(&mut r.last_router_error, names);
    }
    all
}

/// Carries out one event and observes the fleet until `window_end`.
async fn event(
    fleet: &mut Fleet,
    target: &mut Target,
    kind: Kind,
    at: u64,
    window_end: Instant,
    hold_end: Instant,
) -> Result<EventRecord> {
    let before = target.routers().await;
    mark(fleet, &format!("{kind:?}")).await?;
    let marked = Instant::now();
    let mut record = EventRecord {
        at_secs: at,
        ..EventRecord::default()
    };
    let outcome: Result<()> = match kind {
        Kind::KillRouter => match target.local("--kill-router-at") {
            Ok(mesh) => match busiest_running_router(mesh, &before) {
                Some(i) => {
                    record.target.target = Some(mesh.routers[i].name.clone());
                    while_pumping(fleet, mesh.kill_router(i)).await
                }
                None => Err(LadderError::Process("no running router to kill".into())),
            },
            Err(e) => Err(e),
        },
        Kind::DrainRouter => match target.local("--drain-router-at") {
            Ok(mesh) => match busiest_running_router(mesh, &before) {
                Some(i) => {
                    record.target.target = Some(mesh.routers[i].name.clone());
                    mesh.drain_router(i)
                }
                None => Err(LadderError::Process("no running router to drain".into())),
            },
            Err(e) => Err(e),
        },
        Kind::RestartControlPlane => match target.local("--restart-control-plane-at") {
            Ok(mesh) => while_pumping(fleet, mesh.restart_control_plane())
                .await
                .map(|d| record.control_plane_ready_ms = Some(d.as_millis() as u64)),
            Err(e) => Err(e),
        },
        Kind::RotateKey => while_pumping(fleet, target.rotate_key())
            .await
            .map(|k| record.key_id = Some(k)),
        Kind::RestartAllRouters
        | Kind::Attack
        | Kind::PolicyChange
        | Kind::RevokeToken
        | Kind::KillControlPlane
        | Kind::RollingRestartControlPlanes
        | Kind::StopControlPlane => Err(LadderError::Args(
            "the whole-mesh restart, the attack, the propagation and the replica events are \
             events of their own"
                .into(),
        )),
    };
    if let Err(e) = outcome {
        eprintln!("\rladder: event {kind:?}: {e}");
        record.error = Some(e.to_string());
    }
    fleet.pump_until(window_end, |_| false).await;
    let after = target.routers().await;
    let w = window_stats(fleet).await?;
    record.window_secs = marked.elapsed().as_secs_f64();
    record.calls = window_calls(&w);
    record.fleet = fleet_window(w, &router_names(target));
    if let Some(t) = record.target.target.clone() {
        record.target.target_attached_before = attached_on(&before, &t);
        record.target.target_attached_after = attached_on(&after, &t);
    }
    record.router_refusals = delta(&before, &after, |r| &r.refusals);
    record.router_auth_failures = delta(&before, &after, |r| &r.auth_failures);
    record.router_relay = delta(&before, &after, |r| &r.relay);
    record.router_cpu_secs = cpu_used(&before, &after);
    if matches!(kind, Kind::KillRouter | Kind::DrainRouter) && window_end < hold_end {
        restart_target(fleet, target, &mut record).await;
    }
    eprintln!(
        "\rladder: event {kind:?} at {at} s: lost ready {}, below one router {}, below K {}, not back on K {}, calls ok/failed/unfinished {}/{}/{}",
        record.fleet.lost_ready,
        record.fleet.below_one_router,
        record.fleet.below_k_routers,
        record.fleet.not_back_on_k,
        record.calls.calls_ok,
        record.calls.calls_failed,
        record.calls.calls_unfinished
    );
    Ok(record)
}

/// The members' side of a window, routers named in its below-K records.
fn fleet_window(w: WindowStats, names: &BTreeMap<String, String>) -> FleetWindow {
    FleetWindow {
        members: w.members,
        lost_ready: w.lost_ready,
        below_one_router: w.below_one_router,
        below_k_routers: w.below_k_routers,
        back_on_k_ms: stats::spread(&w.back_on_k_ms),
        below_k_ms: stats::spread(&w.below_k_ms),
        not_back_on_k: w.not_back_on_k,
        below_k_records: first_below_k(w.below_k_records, names),
    }
}

/// The echo calls of a window.
fn window_calls(w: &WindowStats) -> WindowCalls {
    WindowCalls {
        calls_ok: w.calls_ok,
        calls_failed: w.calls_failed,
        call_errors: w.call_errors.clone(),
        calls_unfinished: w.calls_unfinished,
        calls_direct: w.calls_direct,
        warm_direct: w.warm_direct,
        warm_relayed: w.warm_relayed,
        direct_counts: w.direct.counts.clone(),
        warm_paths: w.direct.warm_paths.clone(),
        warm_relayed_by_provider: w.direct.warm_relayed_by_provider.clone(),
    }
}

/// Starts an observation window named `name` in every worker.
async fn mark(fleet: &mut Fleet, name: &str) -> Result<()> {
    fleet
        .broadcast(
            |id| Command::Mark {
                id,
                name: name.to_string(),
            },
            REPORT_DEADLINE,
        )
        .await?;
    Ok(())
}

/// Ends the workers' window and sums their reports.
async fn window_stats(fleet: &mut Fleet) -> Result<WindowStats> {
    Ok(sum_windows(window_replies(fleet).await?))
}

/// Ends the workers' window; returns each worker's report.
async fn window_replies(fleet: &mut Fleet) -> Result<Vec<WindowStats>> {
    let replies = fleet
        .broadcast(|id| Command::WindowReport { id }, REPORT_DEADLINE)
        .await?;
    Ok(replies
        .into_iter()
        .filter_map(|r| match r {
            Reply::Window(x) => Some(*x),
            _ => None,
        })
        .collect())
}

/// The workers' window reports, summed (`mark_unix_ms`: the earliest).
fn sum_windows(replies: Vec<WindowStats>) -> WindowStats {
    let mut w = WindowStats::default();
    for x in replies {
        w.members += x.members;
        w.lost_ready += x.lost_ready;
        w.ready_again_ms.extend(x.ready_again_ms);
        w.not_ready_again += x.not_ready_again;
        w.mark_unix_ms = match w.mark_unix_ms {
            0 => x.mark_unix_ms,
            m => m.min(x.mark_unix_ms),
        };
        w.below_one_router += x.below_one_router;
        w.below_k_routers += x.below_k_routers;
        w.back_on_k_ms.extend(x.back_on_k_ms);
        w.below_k_ms.extend(x.below_k_ms);
        w.not_back_on_k += x.not_back_on_k;
        w.calls_ok += x.calls_ok;
        w.calls_failed += x.calls_failed;
        w.calls_unfinished += x.calls_unfinished;
        w.calls_direct += x.calls_direct;
        w.warm_direct += x.warm_direct;
        w.warm_relayed += x.warm_relayed;
        for (k, v) in x.call_errors {
            *w.call_errors.entry(k).or_insert(0) += v;
        }
        for (into, from) in [
            (&mut w.direct.counts, x.direct.counts),
            (&mut w.direct.warm_paths, x.direct.warm_paths),
            (
                &mut w.direct.warm_relayed_by_provider,
                x.direct.warm_relayed_by_provider,
            ),
        ] {
            for (k, v) in from {
                *into.entry(k).or_insert(0) += v;
            }
        }
        w.below_k_records.extend(x.below_k_records);
    }
    w
}

/// Members attached to router `name` in `snapshot`, if it answered.
fn attached_on(snapshot: &[RouterSnapshot], name: &str) -> Option<u64> {
    snapshot
        .iter()
        .find(|s| s.name == name && s.up)
        .map(|s| s.attached)
}

/// The running router with the most attached members (ties: the highest
/// index), so an event always moves members, also after `--restart-routers`
/// brought an empty router back.
fn busiest_running_router(mesh: &LocalMesh, snapshot: &[RouterSnapshot]) -> Option<usize> {
    let attached = |name: &str| attached_on(snapshot, name).unwrap_or(0);
    mesh.routers
        .iter()
        .enumerate()
        .filter(|(_, r)| r.state == RouterState::Running)
        .max_by_key(|(i, r)| (attached(&r.name), *i))
        .map(|(i, _)| i)
}

/// With `--restart-routers`, starts the event's router again (same key and
/// ports) as Kubernetes would, so the next event finds every router up.
async fn restart_target(fleet: &mut Fleet, target: &mut Target, record: &mut EventRecord) {
    let Some(mesh) = target.restarting() else {
        return;
    };
    let Some(i) = record
        .target
        .target
        .as_ref()
        .and_then(|name| mesh.routers.iter().position(|r| &r.name == name))
    else {
        return;
    };
    match while_pumping(fleet, mesh.restart_router(i)).await {
        Ok(d) => {
            record.router_restarted_ms = Some(d.as_millis() as u64);
            eprintln!(
                "\rladder: {} started again, ready after {d:?}",
                mesh.routers[i].name
            );
        }
        Err(e) => {
            eprintln!("\rladder: restarting {}: {e}", mesh.routers[i].name);
            record.error = Some(format!("restart: {e}"));
        }
    }
}

/// Runs `fut` while applying the fleet's events, so workers never wait on a full pipe.
async fn while_pumping<T>(fleet: &mut Fleet, fut: impl Future<Output = T>) -> T {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => return out,
            () = fleet.pump_for(Duration::from_millis(200)) => {}
        }
    }
}

fn delta(
    before: &[RouterSnapshot],
    after: &[RouterSnapshot],
    field: impl Fn(&RouterSnapshot) -> &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for a in after.iter().filter(|a| a.up) {
        let b = before.iter().find(|b| b.name == a.name);
        for (k, v) in field(a) {
            let old = b.and_then(|b| field(b).get(k)).copied().unwrap_or(0);
            if *v > old {
                out.insert(format!("{}:{k}", a.name), v - old);
            }
        }
    }
    out
}

/// CPU seconds the routers used between two snapshots: Σ over routers
/// whose CPU reads at both ends and did not go back (a restarted router is
/// a new process); `None` when none does (a remote mesh).
fn cpu_used(before: &[RouterSnapshot], after: &[RouterSnapshot]) -> Option<f64> {
    let used: Vec<f64> = after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.name == a.name)?.cpu_secs?;
            let a = a.cpu_secs?;
            (a >= b).then_some(a - b)
        })
        .collect();
    (!used.is_empty()).then(|| used.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_cpu_over_a_window_leaves_out_restarted_and_unread_routers() {
        let snap = |name: &str, cpu: Option<f64>| RouterSnapshot {
            name: name.into(),
            up: true,
            cpu_secs: cpu,
            ..RouterSnapshot::default()
        };
        let before = [
            snap("r0", Some(10.0)),
            snap("r1", Some(50.0)),
            snap("r2", None),
        ];
        // r1 restarted (its CPU went back), r2 unread, r3 new.
        let after = [
            snap("r0", Some(12.5)),
            snap("r1", Some(1.0)),
            snap("r2", Some(3.0)),
            snap("r3", Some(1.0)),
        ];
        assert_eq!(cpu_used(&before, &after), Some(2.5));
        assert_eq!(cpu_used(&before[2..], &after[2..]), None);
    }

    #[test]
    fn the_plan_has_every_kill_and_the_replica_events_in_time_order() {
        let mut cfg = FleetConfig {
            hold_secs: 100,
            ..FleetConfig::default()
        };
        cfg.replicas.kill_every_secs = Some(30);
        cfg.replicas.rolling_restart_at_secs = Some(45);
        cfg.replicas.stop_at_secs = Some(10);
        cfg.propagation.policy_change_at_secs = Some(50);
        let p = plan(&cfg);
        assert_eq!(
            p,
            vec![
                (10, Kind::StopControlPlane),
                (30, Kind::KillControlPlane),
                (45, Kind::RollingRestartControlPlanes),
                (50, Kind::PolicyChange),
                (60, Kind::KillControlPlane),
                (90, Kind::KillControlPlane),
            ]
        );
        cfg.replicas = crate::replicas::ReplicaEventsConfig::default();
        assert_eq!(plan(&cfg), vec![(50, Kind::PolicyChange)]);
    }

    fn flap(member: u64, at_secs: f64) -> FlapRecord {
        FlapRecord {
            member,
            peer_id: format!("peer{member}"),
            at_secs,
            routers_before: vec!["idA".into(), "idB".into()],
            leaving_before: vec!["idB".into()],
            routers_after: vec!["idA".into(), "unknown".into()],
            last_router_error: Some("router idB: sent go-away".into()),
        }
    }

    #[test]
    fn the_first_flaps_of_all_workers_are_kept_with_router_names() {
        let mut all: Vec<FlapRecord> = (0..30).rev().map(|i| flap(i, i as f64)).collect();
        all.push(flap(99, 0.5));
        let names: BTreeMap<String, String> = [
            ("idA".to_string(), "r0".to_string()),
            ("idB".to_string(), "r3".to_string()),
        ]
        .into();
        let kept = first_flaps(all, &names);
        assert_eq!(kept.len(), MAX_FLAP_RECORDS);
        let order: Vec<u64> = kept.iter().take(3).map(|f| f.member).collect();
        assert_eq!(order, vec![0, 99, 1]);
        assert_eq!(kept[0].routers_before, vec!["r0", "r3"]);
        assert_eq!(kept[0].leaving_before, vec!["r3"]);
        assert_eq!(kept[0].routers_after, vec!["r0", "unknown"]);
        assert_eq!(
            kept[0].last_router_error.as_deref(),
            Some("router r3: sent go-away")
        );
        let below = first_below_k(
            vec![BelowKRecord {
                at_ms: 5,
                routers_before: vec!["idA".into()],
                last_router_error: Some("router idA: lost the connection".into()),
                ..BelowKRecord::default()
            }],
            &names,
        );
        assert_eq!(below[0].routers_before, vec!["r0"]);
        assert_eq!(
            below[0].last_router_error.as_deref(),
            Some("router r0: lost the connection")
        );
    }
}
