//! The hold's control-plane replica events (local mode, `--control-planes`
//! 2 or more): a SIGKILL of a random live replica every
//! `--kill-control-plane-every-secs` (started again at once), a rolling
//! restart (`--rolling-restart-control-planes-at`: SIGTERM, start, ready,
//! the next), and a SIGSTOP of the replica the routers watch
//! (`--stop-control-plane-at`, SIGCONT after `--stop-control-plane-secs`).
//! Each is an event like the router events: its window runs until the next
//! event, with the fleet's readiness, routers and echo calls in it. Also
//! the admin client the propagation events send their change through: a
//! replica holding no router's Watch stream.

use std::time::Duration;

use agentmesh_controlplane::Client;
use tokio::time::Instant;

use super::{mark, router_names, while_pumping};
use crate::error::{LadderError, Result};
use crate::fleet::Fleet;
use crate::observe::RouterSnapshot;
use crate::replicas::choice::{KillPicker, ReplicaChoice, least_watched, most_watched};
use crate::replicas::record::{ReplicaEvent, RollingStep};
use crate::report::EventRecord;
use crate::target::Target;

/// Which replica event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum What {
    /// `--kill-control-plane-every-secs`.
    Kill,
    /// `--rolling-restart-control-planes-at`.
    RollingRestart,
    /// `--stop-control-plane-at`.
    Stop,
}

/// An event begun: its record so far, the routers before it and its mark.
struct Begun {
    record: EventRecord,
    before: Vec<RouterSnapshot>,
    marked: Instant,
    name: &'static str,
}

/// Snapshots the routers and opens the workers' window.
async fn begin(
    fleet: &mut Fleet,
    target: &mut Target,
    name: &'static str,
    at: u64,
) -> Result<Begun> {
    let before = target.routers().await;
    mark(fleet, name).await?;
    Ok(Begun {
        record: EventRecord {
            at_secs: at,
            replica: Some(ReplicaEvent::default()),
            ..EventRecord::default()
        },
        before,
        marked: Instant::now(),
        name,
    })
}

/// Observes the fleet until `window_end` and completes the record.
async fn end(
    fleet: &mut Fleet,
    target: &mut Target,
    begun: Begun,
    window_end: Instant,
) -> Result<EventRecord> {
    let Begun {
        mut record,
        before,
        marked,
        name,
    } = begun;
    fleet.pump_until(window_end, |_| false).await;
    let after = target.routers().await;
    let w = super::window_stats(fleet).await?;
    record.window_secs = marked.elapsed().as_secs_f64();
    record.calls = super::window_calls(&w);
    record.fleet = super::fleet_window(w, &router_names(target));
    record.router_refusals = super::delta(&before, &after, |r| &r.refusals);
    record.router_auth_failures = super::delta(&before, &after, |r| &r.auth_failures);
    eprintln!(
        "\rladder: event {name} at {} s on {}: lost ready {}, below K {}, calls ok/failed/unfinished {}/{}/{}{}",
        record.at_secs,
        record.target.target.as_deref().unwrap_or("-"),
        record.fleet.lost_ready,
        record.fleet.below_k_routers,
        record.calls.calls_ok,
        record.calls.calls_failed,
        record.calls.calls_unfinished,
        record
            .error
            .as_deref()
            .map_or_else(String::new, |e| format!("; error: {e}"))
    );
    Ok(record)
}

/// Runs replica event `what` at `at` s, observing until `window_end`.
pub(super) async fn run(
    fleet: &mut Fleet,
    target: &mut Target,
    what: What,
    stop_secs: u64,
    picker: &mut KillPicker,
    at: u64,
    window_end: Instant,
) -> Result<EventRecord> {
    let name = match what {
        What::Kill => "KillControlPlane",
        What::RollingRestart => "RollingRestartControlPlanes",
        What::Stop => "StopControlPlane",
    };
    let mut b = begin(fleet, target, name, at).await?;
    let outcome = match what {
        What::Kill => kill(fleet, target, picker, &mut b.record).await,
        What::RollingRestart => rolling(fleet, target, &mut b.record).await,
        What::Stop => stop(target, Duration::from_secs(stop_secs), &mut b.record).await,
    };
    if let Err(e) = outcome {
        eprintln!("\rladder: event {name}: {e}");
        b.record.error = Some(e.to_string());
    }
    end(fleet, target, b, window_end).await
}

/// The event's replica details (always set by [`begin`]).
fn detail(record: &mut EventRecord) -> &mut ReplicaEvent {
    record.replica.get_or_insert_with(ReplicaEvent::default)
}

/// SIGKILLs a live replica drawn by `picker` and starts it again.
async fn kill(
    fleet: &mut Fleet,
    target: &mut Target,
    picker: &mut KillPicker,
    record: &mut EventRecord,
) -> Result<()> {
    let mesh = target.local("--kill-control-plane-every-secs")?;
    let set = &mut mesh.control_planes;
    let live = set.live();
    let watchers = crate::control_planes::probe::watchers(set).await;
    let i = picker
        .pick(&live)
        .ok_or_else(|| LadderError::Process("no live control-plane replica to kill".into()))?;
    let d = detail(record);
    d.seed = Some(picker.seed());
    d.live = live.iter().map(|l| set.replicas[*l].name.clone()).collect();
    d.target_watchers = watchers.get(i).and_then(|(_, w)| *w);
    record.target.target = Some(set.replicas[i].name.clone());
    let ready = while_pumping(fleet, set.kill_and_start(i)).await?;
    record.control_plane_ready_ms = Some(ready.as_millis() as u64);
    Ok(())
}

/// SIGTERMs each replica in turn, starts it again and waits for it ready
/// before the next; a replica stopped by `--stop-control-plane-at` is
/// waited for until its SIGCONT (a frozen process takes no SIGTERM).
async fn rolling(fleet: &mut Fleet, target: &mut Target, record: &mut EventRecord) -> Result<()> {
    let mesh = target.local("--rolling-restart-control-planes-at")?;
    let set = &mut mesh.control_planes;
    record.target.target = Some("every replica".into());
    let mut first_error = None;
    for i in 0..set.replicas.len() {
        let waited = Instant::now();
        if let Some(until) = set.stopped_until(i) {
            // A little past the SIGCONT, so the process runs again.
            fleet
                .pump_until(until + Duration::from_millis(500), |_| false)
                .await;
        }
        let mut step = RollingStep {
            replica: set.replicas[i].name.clone(),
            waited_for_stop_ms: waited.elapsed().as_millis() as u64,
            ..RollingStep::default()
        };
        match while_pumping(fleet, set.terminate_and_start(i)).await {
            Ok((exited, ready)) => {
                step.exited_ms = exited.as_millis() as u64;
                step.ready_ms = Some(ready.as_millis() as u64);
            }
            Err(e) => {
                step.error = Some(e.to_string());
                first_error.get_or_insert(e);
            }
        }
        eprintln!(
            "\rladder: rolling restart: {} {}",
            step.replica,
            step.ready_ms.map_or_else(
                || "did not come back".into(),
                |ms| format!("ready after {ms} ms")
            )
        );
        detail(record).rolling.push(step);
    }
    first_error.map_or(Ok(()), Err)
}

/// SIGSTOPs the replica holding the most Watch streams (the first live
/// one when none answers) for `d`.
async fn stop(target: &mut Target, d: Duration, record: &mut EventRecord) -> Result<()> {
    let mesh = target.local("--stop-control-plane-at")?;
    let set = &mut mesh.control_planes;
    let live = set.live();
    let watchers = crate::control_planes::probe::watchers(set).await;
    let candidates: Vec<(String, Option<u64>)> = watchers
        .iter()
        .enumerate()
        .map(|(i, (n, w))| (n.clone(), w.filter(|_| live.contains(&i))))
        .collect();
    let i = most_watched(&candidates)
        .or_else(|| live.first().copied())
        .ok_or_else(|| LadderError::Process("no live control-plane replica to stop".into()))?;
    record.target.target = Some(set.replicas[i].name.clone());
    let names = live.iter().map(|l| set.replicas[*l].name.clone()).collect();
    set.stop_for(i, d)?;
    let e = detail(record);
    e.target_watchers = candidates[i].1;
    e.live = names;
    e.stopped_ms = Some(d.as_millis() as u64);
    Ok(())
}

/// The admin client a propagation event sends its change through: with
/// replicas, one starting at the live replica holding the fewest Watch
/// streams (none, when the routers all watch others), and that choice;
/// with one control plane, the plain client.
pub(super) async fn unwatched_client(
    target: &mut Target,
) -> Result<(Client, Option<ReplicaChoice>)> {
    let mesh = target.local("an admin call")?;
    if mesh.control_planes.replicas.len() < 2 {
        return Ok((mesh.admin_client()?, None));
    }
    let watchers = crate::control_planes::probe::watchers(&mesh.control_planes).await;
    let Some(choice) = least_watched(&watchers) else {
        eprintln!("\rladder: no replica answered its /metrics; the admin call goes to any");
        return Ok((mesh.admin_client()?, None));
    };
    let i = watchers
        .iter()
        .position(|(n, _)| *n == choice.replica)
        .unwrap_or(0);
    eprintln!(
        "\rladder: the admin call goes through {} ({} watch streams; all: {:?})",
        choice.replica,
        choice.watchers.unwrap_or(0),
        choice.watchers_by_replica
    );
    Ok((mesh.admin_client_via(i)?, Some(choice)))
}
