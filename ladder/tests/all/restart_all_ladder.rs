//! The whole-mesh restart end to end: the real `agentmesh-ladder` in local
//! mode (a real control plane and three real routers, a few real members in
//! two worker processes) with `--restart-all-routers-at`: every router gets
//! SIGTERM at once, drains (a 2 s grace here), exits, and starts again on
//! its ports with its key. Asserts only behaviour and counts: the event is
//! recorded with its numbers, every member that lost readiness was ready
//! and back on K again within the hold, nobody exited, and the members
//! fetched the directory from the control plane during the return.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;

use super::finish::u;

/// Below nextest's backstop, so a hang fails with this test's message.
const RUN_DEADLINE: Duration = Duration::from_secs(4 * 60);
const PROVIDERS: u64 = 2;
const STEP: u64 = 10;
const ROUTERS: u64 = 3;

#[test]
fn every_member_comes_back_after_all_routers_restart_at_once() -> anyhow::Result<()> {
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let dir = ladder.parent().context("ladder has no directory")?;
    for name in ["agentmesh-control-plane", "agentmesh-router"] {
        ensure!(
            dir.join(name).is_file(),
            "{name} is missing beside the ladder: build it in the same profile first"
        );
    }
    let work = tempfile::tempdir()?;
    let mut cmd = Command::new(&ladder);
    cmd.args([
        "local",
        "--routers",
        &ROUTERS.to_string(),
        "--member-routers",
        "2",
        "--providers",
        &PROVIDERS.to_string(),
        "--step",
        &STEP.to_string(),
        "--steps",
        "1",
        "--join-rate",
        "20",
        "--members-per-worker",
        "8",
        "--hold-secs",
        "20",
        "--restart-all-routers-at",
        "2",
        // The routers' drain ends at its grace: no member has a router to go to.
        "--router-arg=--drain-grace-secs=2",
        // Back on one router, the second within 1 s: back on K in the hold.
        "--member-rejoin-spread-ms",
        "1000",
    ]);
    let (table, report) = super::finish::run(&mut cmd, work.path(), RUN_DEADLINE)?;

    let members = PROVIDERS + STEP;
    assert_eq!(u(&report, "/hold/members"), members, "{report:#}");
    let e = &report["events"]["restart_all_routers"];
    assert!(e.is_object(), "no restart event: {report:#}");
    assert!(e["error"].is_null(), "the restart failed: {e:#}");
    assert_eq!(u(e, "/members"), members, "{e:#}");
    let r = &e["restart_all"];
    // Every router was stopped and started again, none had to be killed.
    assert_eq!(u(r, "/routers"), ROUTERS, "{r:#}");
    assert_eq!(u(r, "/killed_after_deadline"), 0, "{r:#}");
    assert!(r["exited_ms"].is_u64(), "{r:#}");
    assert!(
        r["first_ready_ms"].is_u64() && r["all_ready_ms"].is_u64(),
        "{r:#}"
    );
    assert_eq!(
        r["router_ready_ms"].as_object().map(|m| m.len() as u64),
        Some(ROUTERS),
        "{r:#}"
    );
    // With every router gone members lose readiness; each of them was
    // ready again, and back on K, within the hold, measured from the first
    // router ready again.
    let lost = u(e, "/lost_ready");
    assert!(lost > 0, "nobody lost readiness: {e:#}");
    assert_eq!(u(r, "/ready_after_first_router_ms/count"), lost, "{e:#}");
    assert_eq!(u(r, "/not_ready_again"), 0, "{e:#}");
    assert_eq!(
        u(r, "/on_k_after_first_router_ms/count"),
        u(e, "/below_k_routers"),
        "{e:#}"
    );
    assert_eq!(u(e, "/not_back_on_k"), 0, "{e:#}");
    assert_eq!(u(r, "/exits"), 0, "{e:#}");
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    assert_eq!(u(&report, "/hold/ready_at_end"), members, "{report:#}");
    assert_eq!(u(&report, "/exits"), 0, "{report:#}");
    // The control plane served the return: members with no router held
    // fetched the directory again.
    let ret = &r["control_plane_return"];
    assert!(u(ret, "/requests") > 0, "{r:#}");
    assert!(
        ret["by_method"]
            .get("GetDirectory/Ok")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 0),
        "no directory fetched during the return: {r:#}"
    );
    assert!(r["control_plane_drain"].is_object(), "{r:#}");
    assert!(
        table.contains("| restart all routers | at s | routers |"),
        "no restart table on stdout"
    );
    Ok(())
}

#[test]
fn a_remote_run_refuses_the_restart_of_all_routers() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_agentmesh-ladder"))
        .args(["remote", "--control-plane", "http://127.0.0.1:9"])
        .arg("--token-file")
        .arg(work.path().join("member.token"))
        .arg("--work-dir")
        .arg(work.path().join("run"))
        .args(["--restart-all-routers-at", "1"])
        .output()
        .context("running agentmesh-ladder")?;
    ensure!(!out.status.success(), "a remote run took the restart");
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        err.contains("--restart-all-routers-at needs local mode"),
        "unexpected refusal: {err}"
    );
    Ok(())
}
