//! The ladder run: providers, steps, hold with events, burst, teardown, after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::config::{self, FleetConfig, LocalConfig, RemoteConfig, WorkerConfig};
use crate::error::{LadderError, Result};
use crate::fleet::Fleet;
use crate::hold;
use crate::mesh::LocalMesh;
use crate::observe;
use crate::observe::RouterSnapshot;
use crate::placement::Placement;
use crate::postgres::{Postgres, StoreKind, StoreRecord};
use crate::procstat;
use crate::replicas::monitor::Monitor;
use crate::replicas::record::ControlPlanesRecord;
use crate::report::{
    AfterRecord, AfterSample, BurstRecord, ControlPlaneMemory, Failures, PhaseRecord, Report,
    RoundRecord, Shape, StepRecord,
};
use crate::tally::{Phase, PhaseSummary};
use crate::target::Target;

/// Wait after a step before sampling, a little over the workers' tick period.
const TICK_SETTLE: Duration = Duration::from_millis(1_100);
/// Extra token uses beyond the planned members (restarts, retries).
const TOKEN_SLACK: u64 = 100;

/// Runs a ladder against a mesh the ladder starts.
pub async fn run_local(local: LocalConfig, cfg: FleetConfig) -> Result<Report> {
    run_local_at(local, cfg, None).await
}

/// [`run_local`] with every program where `place` says (`None`: here);
/// the caller's runtime must reach those hosts ([`crate::hosts`]).
pub async fn run_local_at(
    mut local: LocalConfig,
    cfg: FleetConfig,
    place: Option<Placement>,
) -> Result<Report> {
    validate(&cfg)?;
    check_replicas(&local, &cfg)?;
    // First, so everything the run starts is inside the cap.
    let cap = local
        .cpu_quota
        .map(crate::cgroup::CpuCap::create)
        .transpose()?;
    let hosts = place.as_ref().map(|p| p.record.clone());
    let dir = work_dir(&cfg)?;
    crate::workdir::clear_previous_run(&dir).await?;
    let pg = start_store(&mut local, &dir).await?;
    let db = local.control_plane_db.clone();
    let mut report = run_local_capped(local, cfg, place, &dir).await;
    // The control plane has stopped: its server can go.
    let store = match pg {
        Some(pg) => {
            let r = pg.record();
            pg.stop().await;
            r
        }
        None => external_store(db.as_deref(), &dir),
    };
    if let Ok(r) = report.as_mut() {
        r.environment.hosts = hosts;
        r.environment.store = Some(store);
    }
    if let (Some(cap), Ok(r)) = (cap, report.as_mut()) {
        r.environment.cpu_cap = Some(cap.finish());
    }
    report
}

/// Refuses replicas without PostgreSQL and replica events without
/// replicas (see [`crate::replicas::config`]).
fn check_replicas(local: &LocalConfig, cfg: &FleetConfig) -> Result<()> {
    let postgres = local.control_plane_store == StoreKind::Postgres
        || local
            .control_plane_db
            .as_deref()
            .is_some_and(crate::replicas::config::is_postgres_url);
    cfg.replicas.check(crate::replicas::config::MeshShape {
        control_planes: local.control_planes,
        postgres,
        hold_secs: cfg.hold_secs,
        restart_control_plane: cfg.restart_control_plane_at_secs.is_some(),
    })?;
    let revoke_at = cfg.propagation.revoke_token_at_secs;
    if let Some(w) = cfg.replicas.after_revocation(revoke_at, cfg.hold_secs) {
        eprintln!("ladder: warning: {w}");
    }
    Ok(())
}

/// `--control-plane-store postgres`: starts the run's server and points the
/// control plane at it (its URL as `--db`, its password in the environment).
async fn start_store(local: &mut LocalConfig, dir: &Path) -> Result<Option<Postgres>> {
    if local.control_plane_store != StoreKind::Postgres {
        return Ok(None);
    }
    if local.control_plane_db.is_some() {
        return Err(LadderError::Args(
            "--control-plane-store postgres starts a server of its own: not with --control-plane-db"
                .into(),
        ));
    }
    let deadline = Duration::from_secs(local.ready_deadline_secs);
    let log = dir.join("postgres.log");
    let pg = Postgres::start(local.postgres_bin_dir.as_deref(), &log, deadline).await?;
    local.control_plane_db = Some(pg.url());
    local.control_plane_env.extend(pg.env());
    local.store_server_pid = pg.pid();
    Ok(Some(pg))
}

/// The store of a control plane on SQLite in `dir` or on `--control-plane-db`.
fn external_store(db: Option<&str>, dir: &Path) -> StoreRecord {
    match db {
        Some(url) => StoreRecord {
            backend: url.split("://").next().unwrap_or("unknown").into(),
            ..StoreRecord::default()
        },
        None => StoreRecord {
            backend: "sqlite".into(),
            version: crate::postgres::sqlite_file_version(&dir.join("control-plane.db")),
            ..StoreRecord::default()
        },
    }
}

async fn run_local_capped(
    mut local: LocalConfig,
    cfg: FleetConfig,
    place: Option<Placement>,
    dir: &Path,
) -> Result<Report> {
    let dir = dir.to_path_buf();
    let bins = Binaries::locate()?;
    check_attack(&local, &cfg, &bins)?;
    eprintln!("ladder: work dir {}", dir.display());
    hold::policy::prepare_control_plane(&mut local, &cfg, &dir)?;
    local.routers_quic = cfg.member_direct
        && cfg.member_direct_transport == agentmesh_node::config::DirectTransport::Quic;
    let routers = local.routers;
    let uses = cfg.total_members() + TOKEN_SLACK;
    let mut mesh = LocalMesh::start_placed(bins.clone(), local, &dir, uses, place).await?;
    hold::policy::prepare_token(&mut mesh, &cfg).await?;
    eprintln!(
        "ladder: control plane {} ({} replica(s)) and {routers} routers ready",
        mesh.url(),
        mesh.control_planes.replicas.len()
    );
    run(
        Target::Local(Box::new(mesh)),
        cfg,
        bins.ladder,
        &dir,
        "local",
    )
    .await
}

/// Runs a ladder's fleet against an existing mesh.
pub async fn run_remote(remote: RemoteConfig, cfg: FleetConfig) -> Result<Report> {
    validate(&cfg)?;
    for (flag, v) in [
        ("--kill-router-at", cfg.kill_router_at_secs),
        ("--drain-router-at", cfg.drain_router_at_secs),
        (
            "--restart-control-plane-at",
            cfg.restart_control_plane_at_secs,
        ),
        ("--restart-all-routers-at", cfg.restart_all_routers_at_secs),
        ("--attack-router-at", cfg.attack.router_at_secs),
        cfg.propagation.local_only()[0],
        cfg.propagation.local_only()[1],
        (
            "--attack-control-plane-at",
            cfg.attack.control_plane_at_secs,
        ),
        cfg.replicas.local_only()[0],
        cfg.replicas.local_only()[1],
        cfg.replicas.local_only()[2],
    ] {
        if v.is_some() {
            return Err(LadderError::Args(format!("{flag} needs local mode")));
        }
    }
    let dir = work_dir(&cfg)?;
    crate::workdir::clear_previous_run(&dir).await?;
    let ladder = std::env::current_exe()
        .map_err(|e| LadderError::io("locating the ladder's own executable", e))?;
    let admin_token = match &cfg.admin_token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| LadderError::io(format!("reading {}", p.display()), e))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    if let Some(ca) = &remote.control_plane_ca
        && !ca.is_file()
    {
        return Err(LadderError::Args(format!(
            "--control-plane-ca {}: no such file",
            ca.display()
        )));
    }
    let target = Target::Remote {
        url: remote.control_plane,
        ca_file: remote.control_plane_ca,
        token_file: remote.token_file,
        admin_token,
        router_metrics: remote.router_metrics_addrs,
        control_plane_http: remote.control_plane_http_addr,
    };
    run(target, cfg, ladder, &dir, "remote").await
}

fn validate(cfg: &FleetConfig) -> Result<()> {
    if cfg.providers == 0 && cfg.step > 0 {
        return Err(LadderError::Args(
            "--providers must be at least 1: every joiner calls a provider".into(),
        ));
    }
    if cfg.member_routers == 0 {
        return Err(LadderError::Args(
            "--member-routers must be at least 1".into(),
        ));
    }
    Ok(())
}

/// An attack needs its harness built, a hold to run in, attacker
/// addresses apart from the members', and (for the flood) a control plane
/// without TLS.
fn check_attack(local: &LocalConfig, cfg: &FleetConfig, bins: &Binaries) -> Result<()> {
    let a = &cfg.attack;
    let Some(at) = a.starts_at() else {
        return Ok(());
    };
    if at >= cfg.hold_secs {
        return Err(LadderError::Args(format!(
            "the attack starts {at} s into the hold, which lasts --hold-secs {}",
            cfg.hold_secs
        )));
    }
    if a.control_plane_at_secs.is_some() && local.control_plane_tls {
        return Err(LadderError::Args(
            "--attack-control-plane-at floods plain gRPC: not with --control-plane-tls".into(),
        ));
    }
    a.check(config::FIRST_SOURCE_IP, cfg.source_ips(true))?;
    bins.hostile().map(drop)
}

fn work_dir(cfg: &FleetConfig) -> Result<PathBuf> {
    let dir = match &cfg.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "agentmesh-ladder-{}-{}",
            agentmesh_proto::unix_now(),
            std::process::id()
        )),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| LadderError::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

fn phase_record(s: PhaseSummary, completed: bool, started: Instant) -> PhaseRecord {
    PhaseRecord {
        joining: s.joining,
        enrolled: s.enrolled,
        ready: s.ready,
        first_call_ok: s.first_call_ok,
        first_call_failed: s.first_call_failed,
        calls_per_member: s.calls_per_member,
        exits: s.exits,
        enroll_ms: s.enroll_ms,
        ready_ms: s.ready_ms,
        first_call_ms: s.first_call_ms,
        completed,
        duration_secs: started.elapsed().as_secs_f64(),
    }
}

async fn run(
    mut target: Target,
    cfg: FleetConfig,
    ladder: PathBuf,
    dir: &Path,
    mode: &str,
) -> Result<Report> {
    let started = Instant::now();
    let capacity = if cfg.members_per_worker > 0 {
        cfg.members_per_worker
    } else {
        let nofile = procstat::nofile_limit().unwrap_or(1024);
        config::members_per_worker(nofile, cfg.fds_per_member, cfg.fd_headroom)
    };
    let base = WorkerConfig {
        index: 0,
        control_plane: target.url(),
        control_plane_endpoints: target.endpoints(),
        control_plane_ca: target.ca_file(),
        token_file: target.token_file(),
        data_dir: dir.to_path_buf(),
        member_routers: cfg.member_routers,
        source_ips: cfg.source_ips(matches!(target, Target::Local(_))),
        call_timeout_secs: cfg.call_timeout_secs,
        call_budget_secs: cfg.call_budget_secs,
        member_ping_interval_secs: cfg.member_ping_interval_secs,
        member_rejoin_spread_ms: cfg.member_rejoin_spread_ms,
        window_calls_per_sec: cfg.window_calls_per_sec,
        member_direct: cfg.member_direct,
        member_direct_transport: cfg.member_direct_transport,
        member_quic_idle_timeout_secs: cfg.member_quic_idle_timeout_secs,
        warm_call_after_secs: cfg.warm_call_after_secs,
        propagation: hold::policy::worker_config(&target, &cfg),
    };
    let mut fleet = Fleet::new(ladder.clone(), base.clone(), dir, capacity);
    fleet.place_workers(target.worker_prefixes());
    let mut report = Report {
        mode: mode.to_string(),
        command: std::env::args().collect(),
        started_at_unix_secs: agentmesh_proto::unix_now(),
        work_dir: dir.display().to_string(),
        shape: Shape {
            step: cfg.step,
            steps: cfg.steps,
            join_rate_per_sec: cfg.join_rate_per_sec,
            member_routers: cfg.member_routers,
            routers: target.router_count(),
            providers: cfg.providers,
            members_per_worker: capacity,
            workers: 0,
            source_ips: base.source_ips,
            control_plane_tls: base.control_plane.starts_with("https://"),
        },
        pre_ladder: target.routers().await,
        ..Report::default()
    };
    let control_plane_pre_ladder_rss = target.control_plane().await.and_then(|c| c.rss_bytes);
    let monitor = match &target {
        Target::Local(m) => Some(Monitor::start(m.monitor_config()).await),
        Target::Remote { .. } => None,
    };
    join_providers(&mut fleet, &cfg, &mut report).await?;
    join_steps(&mut fleet, &target, &cfg, &mut report).await?;
    if cfg.hold_secs > 0 {
        hold(
            &mut fleet,
            &mut target,
            &cfg,
            &mut report,
            control_plane_pre_ladder_rss,
        )
        .await?;
    }
    if cfg.burst > 0 {
        report.burst = Some(burst(&mut fleet, &target, &cfg).await?);
    }
    if let (Some(monitor), Target::Local(mesh)) = (monitor, &target) {
        report.control_planes = Some(control_planes_record(monitor, mesh, &cfg, &report).await);
    }

    // Teardown and after.
    fleet.label = "leaving".into();
    report.failures = Failures {
        exits: fleet.tally.exits(),
        exit_reasons: fleet.tally.exit_reasons.clone(),
        first_call_errors: fleet.tally.call_errors.clone(),
    };
    report.shape.workers = fleet.worker_count();
    eprintln!("\rladder: the fleet leaves");
    if let Err(e) = fleet.leave().await {
        eprintln!("ladder: leaving: {e}");
    }
    if cfg.after_secs > 0 {
        report.after = Some(after(&target, &cfg, &report.pre_ladder).await);
    }

    // Further rounds: a fresh fleet of the same size joins and leaves.
    if cfg.rounds > 1 {
        let completed = report.stopped_early.is_none();
        report.rounds.push(round_record(
            1,
            &fleet,
            cfg.steps,
            completed,
            report.after.clone(),
        ));
        restart_stopped_routers(&mut target).await;
        for k in 2..=cfg.rounds {
            let r = extra_round(k, &target, &cfg, &ladder, &base, dir, capacity, &report).await?;
            report.failures.exits += r.exits;
            report.rounds.push(r);
        }
    }
    target.shutdown().await;
    report.duration_secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The control plane's replicas over the run: what the monitor watched,
/// the kills, and each replica now.
async fn control_planes_record(
    monitor: Monitor,
    mesh: &LocalMesh,
    cfg: &FleetConfig,
    report: &Report,
) -> ControlPlanesRecord {
    let watched = monitor.finish(&mesh.admin_rotations_unix).await;
    let kills = &report.events.kill_control_plane;
    let ready: Vec<u64> = kills
        .iter()
        .filter_map(|k| k.control_plane_ready_ms)
        .collect();
    let set = &mesh.control_planes;
    let record = ControlPlanesRecord {
        replicas: set.replicas.len() as u32,
        public_url: set.url(),
        endpoints: set.addresses(),
        kill_every_secs: cfg.replicas.kill_every_secs,
        kill_seed: kills
            .iter()
            .find_map(|k| k.replica.as_ref().and_then(|r| r.seed)),
        kills: kills.iter().filter(|k| k.error.is_none()).count() as u64,
        kill_ready_ms: crate::stats::Quantiles::of(&ready),
        router_leases: watched.leases,
        signing_keys: watched.signing_keys,
        postgres_connections: watched.postgres_connections,
        at_end: crate::control_planes::probe::states(set).await,
    };
    eprintln!(
        "\rladder: control planes: {} kills, {} lapsed router leases, PostgreSQL connections peak {}",
        record.kills,
        record.router_leases.lapses,
        record
            .postgres_connections
            .as_ref()
            .and_then(|c| c.peak)
            .map_or_else(|| "-".into(), |p| p.to_string())
    );
    record
}

/// The providers join before the first step.
async fn join_providers(fleet: &mut Fleet, cfg: &FleetConfig, report: &mut Report) -> Result<()> {
    let t0 = Instant::now();
    fleet.label = "providers".into();
    let done = fleet
        .join_phase(
            cfg.providers,
            cfg.join_rate_per_sec,
            Phase::Provider,
            Duration::from_secs(cfg.step_deadline_secs),
        )
        .await?;
    report.providers = phase_record(fleet.tally.summary(Phase::Provider), done, t0);
    eprintln!(
        "\rladder: {} of {} providers ready",
        report.providers.ready, cfg.providers
    );
    Ok(())
}

/// Every step, each recorded with the routers, the fleet and the control
/// plane at its end; a step past its deadline ends the stepping.
async fn join_steps(
    fleet: &mut Fleet,
    target: &Target,
    cfg: &FleetConfig,
    report: &mut Report,
) -> Result<()> {
    let step_deadline = Duration::from_secs(cfg.step_deadline_secs);
    for n in 1..=cfg.steps {
        let resident_before = fleet
            .tally
            .members
            .values()
            .filter(|m| matches!(m.phase, Phase::Step(p) if p < n))
            .filter(|m| m.ready_ms.is_some() && m.exit.is_none())
            .count() as u64;
        let cp_before = target.control_plane().await;
        let t0 = Instant::now();
        fleet.label = format!("step {n}/{}", cfg.steps);
        let done = fleet
            .join_phase(
                cfg.step,
                cfg.join_rate_per_sec,
                Phase::Step(n),
                step_deadline,
            )
            .await?;
        // One more worker tick, so the fleet figures are from after the step.
        fleet.pump_for(TICK_SETTLE).await;
        let cp_after = target.control_plane().await;
        let record = StepRecord {
            step: n,
            resident_before,
            joined: phase_record(fleet.tally.summary(Phase::Step(n)), done, t0),
            routers: target.routers().await,
            fleet: fleet.snapshot(),
            control_plane: match (&cp_before, &cp_after) {
                (Some(b), Some(a)) => Some(observe::control_plane_between(b, a)),
                _ => None,
            },
        };
        let j = &record.joined;
        eprintln!(
            "\rladder: step {n}: {} joining, {} enrolled, {} ready, {} first call ok, {} exits in {:.0} s{}",
            j.joining,
            j.enrolled,
            j.ready,
            j.first_call_ok,
            j.exits,
            j.duration_secs,
            if done { "" } else { " (deadline passed)" }
        );
        report.steps.push(record);
        if !done {
            let why = format!(
                "step {n} did not finish within --step-deadline-secs {}; later steps skipped",
                cfg.step_deadline_secs
            );
            eprintln!("ladder: {why}");
            report.stopped_early = Some(why);
            break;
        }
    }
    Ok(())
}

/// The hold and its events, the refreshes answered in it and the control
/// plane's memory at its end.
async fn hold(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
    report: &mut Report,
    control_plane_pre_ladder_rss: Option<u64>,
) -> Result<()> {
    fleet.label = "hold".into();
    let cp_before = target.control_plane().await;
    let t0 = Instant::now();
    let (mut h, events) = hold::run(fleet, target, cfg).await?;
    let secs = t0.elapsed().as_secs_f64();
    if let (Some(b), Some(a)) = (cp_before, target.control_plane().await)
        && b.up
        && a.up
    {
        report.refresh = Some(observe::refresh_between(&b, &a, secs));
    }
    h.control_plane_memory = ControlPlaneMemory::between(
        control_plane_pre_ladder_rss,
        target.control_plane().await.and_then(|c| c.rss_bytes),
        fleet.tally.alive(),
    );
    if let Some(m) = &h.control_plane_memory {
        eprintln!("\rladder: {}", m.summary());
    }
    report.hold = Some(h);
    report.events = events;
    for r in [
        report.events.policy_change.as_mut(),
        report.events.revoke_token.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        r.set_rss_baseline(control_plane_pre_ladder_rss);
    }
    Ok(())
}

async fn burst(fleet: &mut Fleet, target: &Target, cfg: &FleetConfig) -> Result<BurstRecord> {
    fleet.label = format!("burst {}", cfg.burst);
    let cp_before = target.control_plane().await;
    let all = fleet
        .join_phase(
            cfg.burst,
            0.0,
            Phase::Burst,
            Duration::from_secs(cfg.step_deadline_secs),
        )
        .await?;
    let s = fleet.tally.summary(Phase::Burst);
    let cp_after = target.control_plane().await;
    let (refusals, codes) = match (&cp_before, &cp_after) {
        (Some(b), Some(a)) => (
            (a.enroll_limited - b.enroll_limited).max(0.0) as u64,
            observe::control_plane_between(b, a).codes,
        ),
        _ => (0, BTreeMap::new()),
    };
    let all_enrolled = all && s.enrolled == s.joining;
    eprintln!(
        "\rladder: burst {}: {} enrolled{}",
        cfg.burst,
        s.enrolled,
        if all_enrolled { "" } else { " (not all)" }
    );
    Ok(BurstRecord {
        joiners: s.joining,
        enrolled: s.enrolled,
        all_enrolled_ms: if all_enrolled { s.enroll_max_ms } else { None },
        enroll_ms: s.enroll_ms,
        enroll_max_ms: s.enroll_max_ms,
        refusals,
        codes,
        gave_up: s.exits,
    })
}

/// With `--restart-routers`, starts every router an event left stopped (an
/// event at the end of the hold is not followed by a restart), so later
/// rounds join the whole mesh.
async fn restart_stopped_routers(target: &mut Target) {
    let Some(mesh) = target.restarting() else {
        return;
    };
    let stopped: Vec<usize> = (0..mesh.routers.len())
        .filter(|i| mesh.routers[*i].state != crate::mesh::RouterState::Running)
        .collect();
    for i in stopped {
        match mesh.restart_router(i).await {
            Ok(d) => eprintln!(
                "\rladder: {} started again for the next round, ready after {d:?}",
                mesh.routers[i].name
            ),
            Err(e) => eprintln!("\rladder: restarting {}: {e}", mesh.routers[i].name),
        }
    }
}

/// What round `round` of `fleet` joined (providers and `steps` steps).
fn round_record(
    round: u32,
    fleet: &Fleet,
    steps: u32,
    completed: bool,
    after: Option<AfterRecord>,
) -> RoundRecord {
    let mut r = RoundRecord {
        round,
        completed,
        after,
        ..RoundRecord::default()
    };
    let phases = std::iter::once(Phase::Provider).chain((1..=steps).map(Phase::Step));
    for p in phases {
        let s = fleet.tally.summary(p);
        r.joining += s.joining;
        r.ready += s.ready;
        r.first_call_ok += s.first_call_ok;
        r.exits += s.exits;
    }
    r
}

/// Round `k` (> 1): a fresh fleet (new identities, own data directory) joins
/// like the first round's providers and steps, then leaves; router RSS is
/// sampled after it as after the first round.
#[allow(clippy::too_many_arguments)]
async fn extra_round(
    k: u32,
    target: &Target,
    cfg: &FleetConfig,
    ladder: &Path,
    base: &WorkerConfig,
    dir: &Path,
    capacity: u64,
    report: &Report,
) -> Result<RoundRecord> {
    let rdir = dir.join(format!("round{k}"));
    std::fs::create_dir_all(&rdir)
        .map_err(|e| LadderError::io(format!("creating {}", rdir.display()), e))?;
    let base = WorkerConfig {
        data_dir: rdir.clone(),
        ..base.clone()
    };
    let mut fleet = Fleet::new(ladder.to_path_buf(), base, &rdir, capacity);
    fleet.place_workers(target.worker_prefixes());
    let deadline = Duration::from_secs(cfg.step_deadline_secs);
    fleet.label = format!("round {k} providers");
    let mut completed = fleet
        .join_phase(
            cfg.providers,
            cfg.join_rate_per_sec,
            Phase::Provider,
            deadline,
        )
        .await?;
    for n in 1..=cfg.steps {
        if !completed {
            break;
        }
        fleet.label = format!("round {k} step {n}/{}", cfg.steps);
        completed = fleet
            .join_phase(cfg.step, cfg.join_rate_per_sec, Phase::Step(n), deadline)
            .await?;
    }
    let mut record = round_record(k, &fleet, cfg.steps, completed, None);
    eprintln!(
        "\rladder: round {k}: {} joining, {} ready, {} first call ok, {} exits; the fleet leaves",
        record.joining, record.ready, record.first_call_ok, record.exits
    );
    fleet.label = format!("round {k} leaving");
    if let Err(e) = fleet.leave().await {
        eprintln!("ladder: leaving: {e}");
    }
    if cfg.after_secs > 0 {
        record.after = Some(after(target, cfg, &report.pre_ladder).await);
    }
    Ok(record)
}

async fn after(target: &Target, cfg: &FleetConfig, pre_ladder: &[RouterSnapshot]) -> AfterRecord {
    let t0 = Instant::now();
    let every = Duration::from_secs(cfg.after_interval_secs.max(1));
    let mut samples = Vec::new();
    loop {
        let routers = target.routers().await;
        samples.push(AfterSample::of(t0.elapsed().as_secs(), &routers));
        if t0.elapsed() + every > Duration::from_secs(cfg.after_secs) {
            break;
        }
        tokio::time::sleep(every).await;
    }
    let pre: BTreeMap<String, u64> = pre_ladder
        .iter()
        .filter_map(|r| r.rss_bytes.map(|b| (r.name.clone(), b)))
        .collect();
    let pre_anon: BTreeMap<String, u64> = pre_ladder
        .iter()
        .filter_map(|r| r.rss_anon_bytes.map(|b| (r.name.clone(), b)))
        .collect();
    let last = samples.last();
    AfterRecord {
        secs: cfg.after_secs,
        ratio_to_pre_ladder: last
            .map(|l| ratio_to(&l.rss_bytes, &pre))
            .unwrap_or_default(),
        anon_ratio_to_pre_ladder: last
            .map(|l| ratio_to(&l.rss_anon_bytes, &pre_anon))
            .unwrap_or_default(),
        samples,
        pre_ladder_rss_bytes: pre,
        pre_ladder_rss_anon_bytes: pre_anon,
    }
}

/// `now ÷ pre` per router that has both (and a non-zero `pre`).
fn ratio_to(now: &BTreeMap<String, u64>, pre: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    now.iter()
        .filter_map(|(r, b)| {
            pre.get(r)
                .filter(|p| **p > 0)
                .map(|p| (r.clone(), *b as f64 / *p as f64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_need_both_samples_and_a_non_zero_start() {
        let now: BTreeMap<String, u64> =
            [("r0".into(), 30), ("r1".into(), 10), ("r2".into(), 5)].into();
        let pre: BTreeMap<String, u64> =
            [("r0".into(), 20), ("r1".into(), 0), ("r3".into(), 7)].into();
        let r = ratio_to(&now, &pre);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!((r["r0"] - 1.5).abs() < 1e-9);
    }
}
