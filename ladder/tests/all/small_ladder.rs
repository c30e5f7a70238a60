//! CI's small ladder: the real `agentmesh-ladder` binary in local mode starts a
//! real control plane and three real routers (child processes, SQLite in a
//! temp dir), runs 3 steps of members (the real node, in two worker
//! processes), holds with one router drained (then started again) and one
//! killed, then lets a second fleet of the same size join and leave
//! (`--rounds 2`), and writes its JSON report. Asserts only what cannot flake:
//! everyone ready and called, nobody exited, nobody below one router during
//! the drain or the kill.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

/// The whole run must finish within this (about a minute on a quiet 2-core
/// box); below nextest's backstop so a hang fails with this test's message.
const RUN_DEADLINE: Duration = Duration::from_secs(7 * 60);
const STEP: u64 = 20;
const STEPS: u64 = 3;
const PROVIDERS: u64 = 2;

fn sibling(ladder: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = ladder
        .parent()
        .context("ladder binary has no parent directory")?
        .join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build the programs in the same profile first \
             (`cargo build -p agentmesh-controlplane -p agentmesh-router`; \
             `cargo nextest run --workspace` builds them)",
            path.display()
        );
    }
    Ok(path)
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

#[test]
fn small_ladder_with_a_drain() -> anyhow::Result<()> {
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    sibling(&ladder, "agentmesh-control-plane")?;
    sibling(&ladder, "agentmesh-router")?;
    let work = tempfile::tempdir()?;
    let report_path = work.path().join("report.json");
    let child = Command::new(&ladder)
        .args([
            "local",
            "--routers",
            "3",
            "--member-routers",
            "2",
            "--providers",
            &PROVIDERS.to_string(),
            "--step",
            &STEP.to_string(),
            "--steps",
            &STEPS.to_string(),
            "--join-rate",
            "10",
            "--members-per-worker",
            "40",
            "--hold-secs",
            "40",
            "--drain-router-at",
            "10",
            "--kill-router-at",
            "25",
            "--restart-routers",
            "--after-secs",
            "1",
            "--rounds",
            "2",
            "--step-deadline-secs",
            "300",
        ])
        .arg("--work-dir")
        .arg(work.path().join("run"))
        .arg("--report")
        .arg(&report_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting agentmesh-ladder")?;
    let (table, report) = super::finish::finish(child, &report_path, RUN_DEADLINE)?;

    // Providers and every step: everyone enrolled, ready, and called once through the mesh.
    assert_eq!(u(&report, "/providers/ready"), PROVIDERS, "{report:#}");
    let steps = report["steps"].as_array().context("steps array")?;
    assert_eq!(steps.len() as u64, STEPS);
    for (i, step) in steps.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(u(step, "/step"), n);
        assert_eq!(
            u(step, "/resident_before"),
            STEP * i as u64,
            "step {n}: {step:#}"
        );
        assert_eq!(u(step, "/joining"), STEP, "step {n}: {step:#}");
        assert_eq!(u(step, "/enrolled"), STEP, "step {n}: {step:#}");
        assert_eq!(u(step, "/ready"), STEP, "step {n}: {step:#}");
        assert_eq!(u(step, "/first_call_ok"), STEP, "step {n}: {step:#}");
        assert_eq!(u(step, "/exits"), 0, "step {n}: {step:#}");
        assert_eq!(step["routers"].as_array().map(Vec::len), Some(3));
    }

    // The real routers serve their allocator's totals; the ladder records them.
    for r in report["pre_ladder"].as_array().context("pre_ladder")? {
        assert!(u(r, "/allocator_resident_bytes") > 0, "{r:#}");
        assert!(u(r, "/allocator_allocated_bytes") > 0, "{r:#}");
    }
    let after = report["after"]["samples"]
        .as_array()
        .context("after samples")?;
    assert!(
        after.iter().any(|s| s["allocator_allocated_bytes"]
            .as_object()
            .is_some_and(|m| m.values().any(|v| v.as_u64().is_some_and(|b| b > 0)))),
        "no allocator bytes after teardown: {after:#?}"
    );

    // Hold: nobody exited, everyone ready at the end.
    let members = PROVIDERS + STEP * STEPS;
    assert_eq!(u(&report, "/hold/members"), members, "{report:#}");
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    assert_eq!(u(&report, "/hold/ready_at_end"), members, "{report:#}");
    assert!(u(&report, "/hold/samples") > 0);

    // Drain: it happened, and no member fell below one router.
    let drain = &report["events"]["drain_router"];
    assert!(drain.is_object(), "no drain event: {report:#}");
    assert!(drain["error"].is_null(), "drain failed: {drain:#}");
    assert_eq!(u(drain, "/members"), members, "{drain:#}");
    assert_eq!(u(drain, "/below_one_router"), 0, "{drain:#}");
    // The drained router held members, and the drain moved them off it
    // (it answers with fewer at the window's end, or has exited).
    let held = u(drain, "/target_attached_before");
    assert!(held > 0, "drained an empty router: {drain:#}");
    assert!(
        drain["target_attached_after"]
            .as_u64()
            .is_none_or(|left| left < held),
        "the drain moved nobody: {drain:#}"
    );
    // --restart-routers: the drained router came back before the kill.
    assert!(u(drain, "/router_restarted_ms") > 0, "{drain:#}");

    // Kill (SIGKILL) of a router with K=2 on three: nobody loses its last router.
    let kill = &report["events"]["kill_router"];
    assert!(kill.is_object(), "no kill event: {report:#}");
    assert!(kill["error"].is_null(), "kill failed: {kill:#}");
    assert_eq!(u(kill, "/members"), members, "{kill:#}");
    assert_eq!(u(kill, "/below_one_router"), 0, "{kill:#}");
    // The killed router held members, so some fell below K and the ladder saw it.
    assert!(
        u(kill, "/target_attached_before") > 0,
        "killed an empty router: {kill:#}"
    );
    assert!(
        u(kill, "/below_k_routers") > 0,
        "the kill moved nobody: {kill:#}"
    );

    // --rounds 2: a second fleet of the same size joined, was ready and
    // called, and left; router memory was sampled after each round.
    let rounds = report["rounds"].as_array().context("rounds array")?;
    assert_eq!(rounds.len(), 2, "{report:#}");
    for (i, r) in rounds.iter().enumerate() {
        assert_eq!(u(r, "/round"), i as u64 + 1, "{r:#}");
        assert_eq!(u(r, "/joining"), members, "{r:#}");
        assert_eq!(u(r, "/ready"), members, "{r:#}");
        // Providers serve; every other member calls once.
        assert_eq!(u(r, "/first_call_ok"), STEP * STEPS, "{r:#}");
        assert_eq!(u(r, "/exits"), 0, "{r:#}");
        assert!(
            r["after"]["samples"]
                .as_array()
                .is_some_and(|s| !s.is_empty()),
            "round {} has no samples after teardown: {r:#}",
            i + 1
        );
    }
    assert_eq!(u(&report, "/exits"), 0, "{report:#}");
    assert!(table.contains("| step |"), "no markdown table on stdout");
    assert!(table.contains("| round |"), "no rounds table on stdout");
    Ok(())
}
