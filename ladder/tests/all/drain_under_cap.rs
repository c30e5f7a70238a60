//! Issue 20's done-means test: a paced drain under a CPU cap. The real
//! `agentmesh-ladder` in local mode runs a real control plane, three real
//! routers and a small fleet (K = 2) inside a cgroup capped at a quarter
//! of this machine's cores (`--cpu-quota`, created and removed by the
//! ladder; at 70%, the ladder cap, a fleet this small was never
//! throttled, and a cap has to bite to mean anything), then drains the busiest router with a pace slow enough that its go-aways go
//! out in many waves. Counts, not timings:
//!
//! - the drained router sent its go-aways in more than one wave and saw
//!   every member move before its grace was over (its log says so);
//! - no member fell below one router during the drain (each kept one of
//!   its two throughout), and every member is back on K at the window's end;
//! - no echo call of the drain's window failed, for any reason (none cut
//!   or stalled mid-stream by the drain either).
//!
//! It also checks the idle row of the report (CPU per member per hour over
//! the quiet hold before the drain) exists and is above zero.
//!
//! A cgroup needs root and a `cpu` controller: without them the test prints
//! `SKIPPED:` and returns, unless `AGENTMESH_REQUIRE_NETNS=1` (CI as root),
//! where it fails instead, as the namespace tests do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// Below nextest's backstop, so a hang fails with this test's message.
const RUN_DEADLINE: Duration = Duration::from_secs(5 * 60);
const PROVIDERS: u64 = 2;
const STEP: u64 = 40;
/// The drain starts this far into the hold; before it the hold is quiet.
const DRAIN_AT_SECS: u64 = 8;
const HOLD_SECS: u64 = 26;
/// The drained router's grace: sending ends a third of it (4 s) before.
const DRAIN_GRACE_SECS: u64 = 12;
/// Go-aways per second per survivor: ≈ 28 members over 2 survivors at 4 a
/// second is ≈ 14 waves of 2, well inside the 8 s of sending.
const DRAIN_RATE: u32 = 2;
/// The cap, as a share of this machine's cores.
const CAP_SHARE: f64 = 0.25;
/// Set to `1` where tests that need root must run (as in `tests/netns`).
const REQUIRE_ENV: &str = "AGENTMESH_REQUIRE_NETNS";

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

/// Why a capped run cannot be made here, if it cannot.
fn why_no_cgroup() -> Option<String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    // "Uid: real effective saved fs": the effective one decides.
    let euid = read("/proc/self/status").lines().find_map(|l| {
        l.strip_prefix("Uid:")?
            .split_whitespace()
            .nth(1)
            .map(str::to_owned)
    });
    if euid.as_deref() != Some("0") {
        return Some("a cgroup needs root".into());
    }
    let found = agentmesh_ladder::cgroup::find(
        &read("/proc/self/mountinfo"),
        &read("/proc/self/cgroup"),
        |p| std::fs::read_to_string(p.join("cgroup.controllers")).ok(),
    );
    found
        .is_none()
        .then(|| "no cgroup hierarchy with the cpu controller".into())
}

/// `key=value` of a tracing line, ANSI colours stripped.
fn field(line: &str, key: &str) -> Option<String> {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let (_, rest) = plain.split_once(&format!(" {key}="))?;
    Some(
        rest.split_whitespace()
            .next()?
            .trim_matches('"')
            .to_string(),
    )
}

/// What the drained router's log says about its drain.
#[derive(Debug)]
struct DrainLog {
    waves: u64,
    told: u64,
    everyone_moved: bool,
    grace_over: bool,
}

fn drain_log(path: &Path) -> anyhow::Result<DrainLog> {
    let log = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    let paced = log
        .lines()
        .rev()
        .find(|l| l.contains("paced go-aways sent") && l.contains("draining"))
        .with_context(|| format!("no paced drain in {path:?}:\n{log}"))?;
    let num = |k: &str| {
        field(paced, k)
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("no {k} in {paced:?}"))
    };
    Ok(DrainLog {
        waves: num("waves")?,
        told: num("told")?,
        everyone_moved: log.contains("every member moved and no circuit is left"),
        grace_over: log.contains("drain grace over"),
    })
}

#[test]
fn a_paced_drain_under_a_cpu_cap_keeps_every_member_on_a_router() -> anyhow::Result<()> {
    if let Some(why) = why_no_cgroup() {
        if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
            bail!("{why}; {REQUIRE_ENV}=1 here, so this test fails rather than skips");
        }
        eprintln!("SKIPPED: a_paced_drain_under_a_cpu_cap_keeps_every_member_on_a_router: {why}");
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let dir = ladder.parent().context("ladder has no directory")?;
    for name in ["agentmesh-control-plane", "agentmesh-router"] {
        ensure!(
            dir.join(name).is_file(),
            "{name} is missing beside the ladder: build it in the same profile first \
             (`cargo nextest run --workspace` builds it)"
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64 * CAP_SHARE;
    let work = tempfile::tempdir()?;
    let run_dir = work.path().join("run");
    let mut cmd = Command::new(&ladder);
    cmd.args(["local", "--routers", "3", "--member-routers", "2"])
        .args(["--providers", &PROVIDERS.to_string()])
        .args(["--step", &STEP.to_string(), "--steps", "1"])
        .args(["--join-rate", "20", "--members-per-worker", "40"])
        .args(["--hold-secs", &HOLD_SECS.to_string()])
        .args(["--drain-router-at", &DRAIN_AT_SECS.to_string()])
        .args(["--step-deadline-secs", "120"])
        .args(["--cpu-quota", &format!("{cores:.2}")])
        .arg(format!(
            "--router-arg=--drain-grace-secs={DRAIN_GRACE_SECS}"
        ))
        .arg(format!(
            "--router-arg=--drain-rate-members-per-sec={DRAIN_RATE}"
        ));
    let (table, report) = super::finish::run(&mut cmd, work.path(), RUN_DEADLINE)?;

    // The run was capped, and the ladder removed its cgroup.
    let cap = &report["cpu_cap"];
    assert!(cap["cores"].as_f64().is_some_and(|c| c > 0.0), "{cap:#}");
    let cgroup = cap["path"].as_str().context("cpu_cap.path")?;
    assert!(!Path::new(cgroup).exists(), "cgroup {cgroup} left behind");

    let members = PROVIDERS + STEP;
    assert_eq!(u(&report, "/hold/members"), members, "{report:#}");
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");

    // The quiet hold before the drain: the idle row, both sides above zero.
    let idle = &report["hold"]["idle"];
    assert_eq!(u(idle, "/members"), members, "{idle:#}");
    for side in [
        "member_cpu_secs_per_member_hour",
        "router_cpu_secs_per_member_hour",
    ] {
        assert!(
            idle[side].as_f64().is_some_and(|v| v > 0.0),
            "{side}: {idle:#}"
        );
    }
    assert!(
        table.contains("| idle (quiet hold) |"),
        "no idle row: {table}"
    );

    // The drain: the busiest router held members, each kept a router.
    let drain = &report["events"]["drain_router"];
    assert!(drain["error"].is_null(), "drain failed: {drain:#}");
    assert_eq!(u(drain, "/members"), members, "{drain:#}");
    let held = u(drain, "/target_attached_before");
    assert!(held > 1, "drained a router with {held} members: {drain:#}");
    assert_eq!(u(drain, "/below_one_router"), 0, "{drain:#}");
    assert_eq!(u(drain, "/not_back_on_k"), 0, "{drain:#}");
    // No window call failed, for any reason: none lacked a router, and none
    // already streaming was cut or stalled when the drained router ended its
    // last circuits (members keep their connection to it while a call runs
    // over a circuit through it, and open no new one through it: see
    // docs/architecture.md, "Draining without cutting a call"). Before,
    // 1 of 90 was cut or stalled in two of five CI runs.
    assert!(
        u(drain, "/calls_ok") > 0,
        "no calls in the window: {drain:#}"
    );
    assert_eq!(u(drain, "/calls_failed"), 0, "{drain:#}");
    let errors = drain["call_errors"]
        .as_object()
        .context("drain call_errors")?;
    assert!(errors.is_empty(), "window calls failed: {errors:#?}");

    // Paced: in waves, and every member moved before the grace was over.
    let target = drain["target"].as_str().context("drain target")?;
    let log = drain_log(&run_dir.join(format!("{target}.log")))?;
    eprintln!("the drained router {target} held {held}: {log:?}; cap: {cap}");
    assert!(log.waves > 1, "one wave: not paced: {log:?}");
    assert!(
        log.told >= held,
        "told fewer than it held ({held}): {log:?}"
    );
    assert!(
        log.everyone_moved && !log.grace_over,
        "members left when the grace ended: {log:?}"
    );
    Ok(())
}

#[test]
fn tracing_fields_are_read_through_colours() {
    let line = "\x1b[2m2026-12-02T14:00:00Z\x1b[0m \x1b[32m INFO\x1b[0m paced go-aways sent \x1b[3mreason\x1b[0m\x1b[2m=\x1b[0m\"draining\" \x1b[3mwaves\x1b[0m\x1b[2m=\x1b[0m14 told=28";
    assert_eq!(field(line, "waves").as_deref(), Some("14"));
    assert_eq!(field(line, "told").as_deref(), Some("28"));
    assert_eq!(field(line, "reason").as_deref(), Some("draining"));
    assert_eq!(field(line, "acked"), None);
}
