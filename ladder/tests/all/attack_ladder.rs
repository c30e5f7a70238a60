//! The ladder's attack mode end to end: the real `agentmesh-ladder` in local
//! mode, a real control plane and two routers, a few members, and during
//! the hold the real `agentmesh-hostile` against one router (router-auth
//! from two addresses) and the control plane (the flood), with members
//! joining while it runs. Asserts only what cannot flake: each attacker
//! ran and counted what it sent, the attacked router and the control plane
//! counted refusals, and every member (those in and those joining) was
//! ready, called, and stayed.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;

/// Below nextest's backstop, so a hang fails with this test's message.
const RUN_DEADLINE: Duration = Duration::from_secs(6 * 60);
const STEP: u64 = 10;
const JOINERS: u64 = 10;

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

#[test]
fn a_ladder_under_attack_reports_the_attack_and_keeps_its_members() -> anyhow::Result<()> {
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let dir = ladder.parent().context("ladder has no directory")?;
    for name in [
        "agentmesh-control-plane",
        "agentmesh-router",
        "agentmesh-hostile",
    ] {
        ensure!(
            dir.join(name).is_file(),
            "{name} is missing beside the ladder: build it in the same profile first \
             (`cargo nextest run --workspace` builds it)"
        );
    }
    let work = tempfile::tempdir()?;
    let mut cmd = Command::new(&ladder);
    cmd.args([
        "local",
        "--routers",
        "2",
        "--providers",
        "1",
        "--step",
        &STEP.to_string(),
        "--steps",
        "1",
        "--members-per-worker",
        "40",
        "--hold-secs",
        "40",
        "--attack-router-at",
        "2",
        "--attack-control-plane-at",
        "2",
        "--attack-duration-secs",
        "20",
        "--attack-router-peers",
        "16",
        "--attack-control-plane-rate-per-sec",
        "200",
        "--attack-joiners",
        &JOINERS.to_string(),
        "--step-deadline-secs",
        "300",
    ]);
    let (_table, report) = super::finish::run(&mut cmd, work.path(), RUN_DEADLINE)?;
    let attack = &report["events"]["attack"];
    assert!(attack.is_object(), "no attack in the report: {report:#}");
    assert!(
        attack["errors"].as_array().is_some_and(Vec::is_empty),
        "{attack:#}"
    );
    let target = attack["target_router"].as_str().context("target router")?;

    // Each attacker ran and counted what it did.
    let parts = attack["parts"].as_array().context("parts")?;
    assert_eq!(
        parts.len(),
        3,
        "two router sources and one flood: {attack:#}"
    );
    for p in parts {
        assert!(p["error"].is_null(), "{p:#}");
    }
    assert!(u(&parts[0], "/counts/streams_opened") > 0, "{attack:#}");
    assert!(u(&parts[1], "/counts/streams_opened") > 0, "{attack:#}");
    assert!(u(&parts[2], "/counts/sent") > 0, "{attack:#}");
    assert!(u(&parts[2], "/counts/refused") > 0, "{attack:#}");

    // The attacked router and the control plane counted refusals.
    let refused = attack["router_refusals"][target]
        .as_object()
        .with_context(|| format!("no refusals on {target}: {attack:#}"))?;
    assert!(!refused.is_empty(), "{attack:#}");
    let cp = attack["control_plane_refusals"]
        .as_object()
        .context("control plane refusals")?;
    assert!(
        cp.keys()
            .any(|k| k.starts_with("control_plane_limiter_refusals")),
        "{attack:#}"
    );

    // Members: those in stayed, those joining got in and called.
    assert_eq!(u(attack, "/window/members"), 1 + STEP, "{attack:#}");
    assert_eq!(u(attack, "/exits"), 0, "{attack:#}");
    assert_eq!(u(attack, "/joiners/joining"), JOINERS, "{attack:#}");
    assert_eq!(u(attack, "/joiners/ready"), JOINERS, "{attack:#}");
    assert_eq!(u(attack, "/joiners/first_call_ok"), JOINERS, "{attack:#}");
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    assert_eq!(u(&report, "/exits"), 0, "{report:#}");
    Ok(())
}
