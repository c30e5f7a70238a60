//! The propagation events end to end: the real `agentmesh-ladder` in local
//! mode (a real control plane and two routers, a few real members in two
//! worker processes) with `--policy-change-at` (a grant some held calls
//! use is removed) and `--revoke-token-at` (the token one step member in
//! five enrolled with is revoked). Asserts only counts: both rows exist,
//! every member concerned took each change, every forbidden held call was
//! closed, every revoked member lost its routers.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;

/// Below nextest's backstop, so a hang fails with this test's message.
const RUN_DEADLINE: Duration = Duration::from_secs(6 * 60);
const PROVIDERS: u64 = 2;
const STEP: u64 = 20;
const REVOKE_EVERY: u64 = 5;
const LIVE_CALLS: u64 = 6;

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

#[test]
fn a_policy_change_and_a_token_revocation_reach_every_member_concerned() -> anyhow::Result<()> {
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
        "2",
        "--providers",
        &PROVIDERS.to_string(),
        "--step",
        &STEP.to_string(),
        "--steps",
        "1",
        "--join-rate",
        "10",
        "--members-per-worker",
        "12",
        "--hold-secs",
        "40",
        "--policy-change-at",
        "5",
        "--policy-live-calls",
        &LIVE_CALLS.to_string(),
        "--revoke-token-at",
        "20",
        "--revoke-token-every",
        &REVOKE_EVERY.to_string(),
        "--step-deadline-secs",
        "300",
    ]);
    let (table, report) = super::finish::run(&mut cmd, work.path(), RUN_DEADLINE)?;
    let members = PROVIDERS + STEP;
    assert_eq!(u(&report, "/steps/0/ready"), STEP, "{report:#}");
    // Step members are numbered after the providers; one in five enrolls
    // with the token that is revoked.
    let revocable = (PROVIDERS..PROVIDERS + STEP)
        .filter(|i| i % REVOKE_EVERY == 0)
        .count() as u64;

    let change = &report["events"]["policy_change"];
    assert!(change.is_object(), "no policy change row: {report:#}");
    assert!(change["error"].is_null(), "{change:#}");
    // Version 1 is the start policy; the change is the next.
    assert_eq!(u(change, "/version"), 2, "{change:#}");
    assert_eq!(u(change, "/members"), members, "{change:#}");
    assert_eq!(u(change, "/took_ms/count"), members, "{change:#}");
    assert_eq!(u(change, "/not_taken"), 0, "{change:#}");
    assert_eq!(u(change, "/live_calls"), LIVE_CALLS, "{change:#}");
    assert_eq!(u(change, "/live_calls_not_opened"), 0, "{change:#}");
    assert_eq!(u(change, "/closed_ms/count"), LIVE_CALLS, "{change:#}");
    assert_eq!(u(change, "/still_open"), 0, "{change:#}");
    // The grant the fleet's echo calls use stays.
    assert!(u(change, "/calls_ok") > 0, "{change:#}");
    assert!(u(change, "/enrolled_members") >= members, "{change:#}");

    let revoke = &report["events"]["revoke_token"];
    assert!(revoke.is_object(), "no revocation row: {report:#}");
    assert!(revoke["error"].is_null(), "{revoke:#}");
    assert!(revoke["token_id"].is_string(), "{revoke:#}");
    assert_eq!(u(revoke, "/revoked_members"), revocable, "{revoke:#}");
    assert_eq!(u(revoke, "/dropped_ms/count"), revocable, "{revoke:#}");
    assert_eq!(u(revoke, "/not_dropped"), 0, "{revoke:#}");
    assert_eq!(u(revoke, "/live_calls"), revocable, "{revoke:#}");
    assert_eq!(u(revoke, "/closed_ms/count"), revocable, "{revoke:#}");
    assert_eq!(u(revoke, "/members"), members - revocable, "{revoke:#}");
    assert_eq!(
        u(revoke, "/took_ms/count"),
        members - revocable,
        "{revoke:#}"
    );

    assert!(table.contains("| policy change | 5 |"), "{table}");
    assert!(table.contains("| revoke token | 20 |"), "{table}");
    Ok(())
}
