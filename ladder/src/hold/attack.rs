//! The attack event of the hold (`--attack-router-at`,
//! `--attack-control-plane-at`, local mode): `agentmesh-hostile` processes
//! against one router (router-auth: strangers holding its auth slots, from
//! `--attack-router-sources` addresses) and against the control plane
//! (control-plane-flood: every unauthenticated RPC at a fixed rate from one
//! address), from loopback addresses the members do not use, each for
//! `--attack-duration-secs` at most and cut at the end of its window. While
//! they run, `--attack-joiners` members join, so the report shows what an
//! attacked mesh does to newcomers (enroll and ready times beside the last,
//! unattacked, step's) as well as to the members already in (flaps, exits,
//! below K, calls).
//!
//! The attack's window starts with the first attack and lasts until the
//! next event or the hold's end. The routers' and the control plane's
//! refusal counters are read before the first attack starts and after the
//! last one ended.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use crate::attack::counters::{self, Counters};
use crate::attack::harness::{Part, Running};
use crate::attack::record::{Joiners, PartRecord, Window};
use crate::attack::{AttackConfig, AttackRecord};
use crate::binaries::Binaries;
use crate::config::FleetConfig;
use crate::error::{LadderError, Result};
use crate::fleet::Fleet;
use crate::tally::Phase;
use crate::target::Target;

/// Wait after the last attack started before the joiners start: the
/// attackers' connections and floods are up by then.
const JOIN_AFTER: Duration = Duration::from_secs(3);

/// One attack planned: when (seconds into the hold) and what.
struct Planned {
    at: u64,
    part: Part,
}

/// What the attack needs to know about the mesh, read once at its start.
struct Mesh {
    router_name: String,
    router_addr: String,
    control_plane_url: String,
    router_metrics: Vec<(String, SocketAddr)>,
    control_plane_http: SocketAddr,
}

/// Runs the attack as the hold's event at `at` (seconds after
/// `hold_start`), observing the fleet until `window_end`.
pub(super) async fn run(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
    hold_start: Instant,
    window_end: Instant,
) -> Result<AttackRecord> {
    let a = &cfg.attack;
    let at = a.starts_at().unwrap_or(0);
    let bin = Binaries::locate()?.hostile()?;
    let before_routers = target.routers().await;
    let mesh = read_mesh(target, &before_routers)?;
    let mut record = AttackRecord {
        at_secs: at,
        target_router: a.router_at_secs.map(|_| mesh.router_name.clone()),
        ..AttackRecord::default()
    };
    let before = scrape_all(&mesh).await;
    let flaps_before = flaps(fleet);
    let exits_before = exits_of_residents(fleet);
    super::mark(fleet, "Attack").await?;
    let marked = Instant::now();
    let attached_before = super::attached_on(&before_routers, &mesh.router_name);

    let dir = target_dir(target);
    let running = start_parts(
        fleet,
        a,
        &mesh,
        &bin,
        &dir,
        hold_start,
        window_end,
        &mut record,
    )
    .await;
    join_meanwhile(fleet, cfg, &running, window_end, &mut record).await?;
    fleet.pump_until(window_end, |_| false).await;
    for (started, r) in running {
        let name = r.part.name.clone();
        let duration_secs = r.part.duration.as_secs();
        let (counts, error) = match super::while_pumping(fleet, r.finish()).await {
            Ok(s) => (s.counts, None),
            Err(e) => (BTreeMap::new(), Some(e)),
        };
        record.parts.push(PartRecord {
            name,
            started_at_secs: started,
            duration_secs,
            counts,
            error,
        });
    }

    record.window = Window::of(&super::window_stats(fleet).await?);
    record.window.secs = marked.elapsed().as_secs_f64();
    record.window.target_attached_before = attached_before;
    let after_routers = target.routers().await;
    record.window.target_attached_after = super::attached_on(&after_routers, &mesh.router_name);
    let after = scrape_all(&mesh).await;
    refusals_grown(&before, &after, &mut record);
    let (flaps_after, flapped) = flaps_since(fleet, &flaps_before);
    record.flaps = flaps_after;
    record.members_flapped = flapped;
    record.exits = exits_of_residents(fleet).saturating_sub(exits_before);
    eprintln!(
        "\rladder: attack at {at} s: flaps {}, exits {}, joiners ready {} of {}, calls ok/failed {}/{}",
        record.flaps,
        record.exits,
        record.joiners.ready,
        record.joiners.joining,
        record.window.calls_ok,
        record.window.calls_failed
    );
    Ok(record)
}

/// What the attack aims at: the busiest running router, the control plane.
fn read_mesh(target: &mut Target, routers: &[crate::observe::RouterSnapshot]) -> Result<Mesh> {
    let local = target.local("--attack-router-at / --attack-control-plane-at")?;
    let i = super::busiest_running_router(local, routers)
        .ok_or_else(|| LadderError::Process("no running router to attack".into()))?;
    let r = &local.routers[i];
    let id = local
        .router_names()
        .into_iter()
        .find_map(|(id, name)| (name == r.name).then_some(id))
        .ok_or_else(|| LadderError::Process(format!("{}: PeerId not known", r.name)))?;
    Ok(Mesh {
        router_name: r.name.clone(),
        router_addr: format!("/ip4/127.0.0.1/tcp/{}/p2p/{id}", r.listen_port),
        control_plane_url: local.url(),
        router_metrics: local
            .routers
            .iter()
            .map(|r| (r.name.clone(), r.metrics))
            .collect(),
        control_plane_http: local.control_planes.first().http,
    })
}

/// Starts each planned harness process at its time (cut to what is left
/// of the window); returns those running with their start (seconds into
/// the hold). A part that could not start is recorded with its error.
#[allow(clippy::too_many_arguments)]
async fn start_parts(
    fleet: &mut Fleet,
    a: &AttackConfig,
    mesh: &Mesh,
    bin: &std::path::Path,
    dir: &std::path::Path,
    hold_start: Instant,
    window_end: Instant,
    record: &mut AttackRecord,
) -> Vec<(f64, Running)> {
    let mut plan = plan(a, mesh);
    plan.sort_by_key(|p| p.at);
    let mut running = Vec::new();
    for p in plan {
        fleet
            .pump_until(hold_start + Duration::from_secs(p.at), |_| false)
            .await;
        let now = Instant::now();
        let left = window_end.saturating_duration_since(now).as_secs();
        let secs = a.duration_secs.min(left);
        let started = now.duration_since(hold_start).as_secs_f64();
        if secs == 0 {
            record.errors.push(format!(
                "{} at {} s: no time left in its window; not started",
                p.part.name, p.at
            ));
            continue;
        }
        let mut part = p.part;
        part.args
            .extend(["--duration-secs".into(), secs.to_string()]);
        part.duration = Duration::from_secs(secs);
        let log = format!("attack-{}", running.len());
        match Running::start(bin, part.clone(), dir, &log) {
            Ok(r) => {
                eprintln!("\rladder: attack {} started for {secs} s", part.name);
                running.push((started, r));
            }
            Err(e) => record.parts.push(PartRecord {
                name: part.name,
                started_at_secs: started,
                duration_secs: secs,
                error: Some(e.to_string()),
                ..PartRecord::default()
            }),
        }
    }
    running
}

/// The last step's (unattacked) figures for comparison, and
/// `--attack-joiners` members joining while the attack runs.
async fn join_meanwhile(
    fleet: &mut Fleet,
    cfg: &FleetConfig,
    running: &[(f64, Running)],
    window_end: Instant,
    record: &mut AttackRecord,
) -> Result<()> {
    let last_step = (1..=cfg.steps)
        .rev()
        .map(Phase::Step)
        .find(|p| fleet.tally.summary(*p).joining > 0);
    if let Some(p) = last_step {
        let s = fleet.tally.summary(p);
        record.unattacked_enroll_ms = s.enroll_ms;
        record.unattacked_ready_ms = s.ready_ms;
    }
    let joiners = cfg.attack.joiners;
    if joiners > 0 && !running.is_empty() {
        fleet.pump_for(JOIN_AFTER).await;
        let t0 = Instant::now();
        let label = std::mem::replace(&mut fleet.label, "attack joiners".into());
        let timeout = window_end.saturating_duration_since(t0);
        let done = fleet
            .join_phase(joiners, cfg.join_rate_per_sec, Phase::Attack, timeout)
            .await?;
        fleet.label = label;
        record.joiners = Joiners::of(&fleet.tally.summary(Phase::Attack), done);
    }
    Ok(())
}

/// The routers' and the control plane's refusal counters that grew.
fn refusals_grown(before: &Scrape, after: &Scrape, record: &mut AttackRecord) {
    for (name, b) in &before.routers {
        if let Some(a) = after.routers.get(name) {
            let g = counters::grown(b, a);
            if !g.is_empty() {
                record.router_refusals.insert(name.clone(), g);
            }
        }
    }
    if let (Some(b), Some(a)) = (&before.control_plane, &after.control_plane) {
        record.control_plane_refusals = counters::grown(b, a);
    }
}

/// The harness processes the flags ask for.
fn plan(a: &AttackConfig, mesh: &Mesh) -> Vec<Planned> {
    let mut plan = Vec::new();
    if let Some(at) = a.router_at_secs {
        for i in 0..a.router_sources {
            let ip = a.router_source(i);
            let stall = if i % 2 == 0 { "length-byte" } else { "silent" };
            plan.push(Planned {
                at,
                part: Part {
                    name: format!("router-auth {ip} {stall}"),
                    args: vec![
                        "router-auth".into(),
                        "--router".into(),
                        mesh.router_addr.clone(),
                        "--source-ip".into(),
                        ip.to_string(),
                        "--peers".into(),
                        a.router_peers.to_string(),
                        "--streams-per-peer".into(),
                        a.router_streams_per_peer.to_string(),
                        "--stall".into(),
                        stall.into(),
                    ],
                    duration: Duration::ZERO,
                },
            });
        }
    }
    if let Some(at) = a.control_plane_at_secs {
        let ip = a.control_plane_source();
        plan.push(Planned {
            at,
            part: Part {
                name: format!("control-plane-flood {ip}"),
                args: vec![
                    "control-plane-flood".into(),
                    "--control-plane".into(),
                    mesh.control_plane_url.clone(),
                    "--source-addr".into(),
                    ip.to_string(),
                    "--rate-per-sec".into(),
                    a.control_plane_rate_per_sec.to_string(),
                    "--max-in-flight".into(),
                    a.control_plane_max_in_flight.to_string(),
                    "--kinds".into(),
                    a.control_plane_kinds.clone(),
                ],
                duration: Duration::ZERO,
            },
        });
    }
    plan
}

/// The run's directory (the attackers' logs go there).
fn target_dir(target: &mut Target) -> std::path::PathBuf {
    match target.local("attack logs") {
        Ok(m) => m.dir.clone(),
        Err(_) => std::env::temp_dir(),
    }
}

/// Every program's refusal counters at one instant.
struct Scrape {
    routers: BTreeMap<String, Counters>,
    control_plane: Option<Counters>,
}

async fn scrape_all(mesh: &Mesh) -> Scrape {
    let mut routers = BTreeMap::new();
    for (name, addr) in &mesh.router_metrics {
        if let Some(c) = counters::scrape(*addr).await {
            routers.insert(name.clone(), c);
        }
    }
    Scrape {
        routers,
        control_plane: counters::scrape(mesh.control_plane_http).await,
    }
}

/// Flaps seen so far, by member.
fn flaps(fleet: &Fleet) -> BTreeMap<u64, u32> {
    fleet
        .tally
        .members
        .iter()
        .filter(|(_, m)| m.flaps > 0)
        .map(|(i, m)| (*i, m.flaps))
        .collect()
}

/// Flaps since `before` (all members, joiners included), and how many members had one.
fn flaps_since(fleet: &Fleet, before: &BTreeMap<u64, u32>) -> (u64, u64) {
    let mut total = 0u64;
    let mut members = 0u64;
    for (i, m) in &fleet.tally.members {
        let new = m.flaps.saturating_sub(before.get(i).copied().unwrap_or(0));
        if new > 0 {
            total += u64::from(new);
            members += 1;
        }
    }
    (total, members)
}

/// Members that joined before the attack and have exited.
fn exits_of_residents(fleet: &Fleet) -> u64 {
    fleet
        .tally
        .members
        .values()
        .filter(|m| m.phase != Phase::Attack && m.exit.is_some())
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        Mesh {
            router_name: "r1".into(),
            router_addr:
                "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
                    .into(),
            control_plane_url: "http://127.0.0.1:7400".into(),
            router_metrics: Vec::new(),
            control_plane_http: "127.0.0.1:7401".parse().expect("addr"),
        }
    }

    #[test]
    fn the_plan_has_one_process_per_router_source_and_one_flood() {
        let a = AttackConfig {
            router_at_secs: Some(10),
            control_plane_at_secs: Some(20),
            router_sources: 3,
            ..AttackConfig::default()
        };
        let plan = plan(&a, &mesh());
        let names: Vec<&str> = plan.iter().map(|p| p.part.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "router-auth 127.0.0.200 length-byte",
                "router-auth 127.0.0.201 silent",
                "router-auth 127.0.0.202 length-byte",
                "control-plane-flood 127.0.0.203",
            ]
        );
        assert_eq!(plan[3].at, 20);
        let args = &plan[0].part.args;
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag).expect(flag);
            args[i + 1].clone()
        };
        assert_eq!(after("--router"), mesh().router_addr);
        assert_eq!(after("--source-ip"), "127.0.0.200");
        assert_eq!(after("--peers"), "64");
        assert!(plan[3].part.args.contains(&"--source-addr".to_string()));
        let only_cp = AttackConfig {
            control_plane_at_secs: Some(0),
            ..AttackConfig::default()
        };
        assert_eq!(plan_names(&only_cp), ["control-plane-flood 127.0.0.202"]);
    }

    fn plan_names(a: &AttackConfig) -> Vec<String> {
        plan(a, &mesh()).into_iter().map(|p| p.part.name).collect()
    }
}
