//! The ladder on a PostgreSQL server of its own: the real `agentmesh-ladder
//! local --control-plane-store postgres` starts a real PostgreSQL (initdb
//! in a temp dir, as the `postgres` user when root), the real control plane
//! on it and two real routers, runs a tiny fleet with credentials short
//! enough (`--credential-ttl-secs`) that every member refreshes during the
//! hold, and stops everything. Asserts counts only: everyone ready and
//! called, nobody exited, the report names PostgreSQL and its version,
//! refreshes were answered, and the cluster dir and its server are gone
//! after the run.
//!
//! Needs the PostgreSQL binaries (Debian's `postgresql`); without them the
//! test prints `SKIPPED:` and passes, unless PostgreSQL is required here
//! (`CI` set or `AGENTMESH_REQUIRE_POSTGRES=1`, as `.ci/run` exports),
//! where it fails instead.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use super::finish::u;

/// The whole run must finish within this; below nextest's backstop.
const RUN_DEADLINE: Duration = Duration::from_secs(6 * 60);
const PROVIDERS: u64 = 1;
const STEP: u64 = 6;
/// Credential lifetime: a member refreshes about every 7 s.
const CREDENTIAL_TTL_SECS: u64 = 12;
/// Long enough for every member to refresh at least twice.
const HOLD_SECS: u64 = 20;

#[test]
fn ladder_on_its_own_postgres_refreshes_and_removes_the_cluster() -> anyhow::Result<()> {
    if let Some(why) = agentmesh_ladder::postgres::unavailable(None) {
        let required = std::env::var_os("CI").is_some()
            || std::env::var("AGENTMESH_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{why}; PostgreSQL is required here (CI or AGENTMESH_REQUIRE_POSTGRES=1)"
        );
        eprintln!("SKIPPED: postgres_ladder: {why}");
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let work = tempfile::tempdir()?;
    let mut cmd = Command::new(&ladder);
    cmd.args([
        "local",
        "--control-plane-store",
        "postgres",
        "--credential-ttl-secs",
        &CREDENTIAL_TTL_SECS.to_string(),
        "--routers",
        "2",
        "--member-routers",
        "2",
        "--providers",
        &PROVIDERS.to_string(),
        "--step",
        &STEP.to_string(),
        "--steps",
        "1",
        "--join-rate",
        "10",
        "--hold-secs",
        &HOLD_SECS.to_string(),
        "--step-deadline-secs",
        "240",
    ]);
    let (table, report) = super::finish::run(&mut cmd, work.path(), RUN_DEADLINE)?;

    let members = PROVIDERS + STEP;
    assert_eq!(u(&report, "/steps/0/ready"), STEP, "{report:#}");
    assert_eq!(u(&report, "/steps/0/first_call_ok"), STEP, "{report:#}");
    assert_eq!(u(&report, "/hold/ready_at_end"), members, "{report:#}");
    assert_eq!(u(&report, "/exits"), 0, "{report:#}");

    let store = &report["store"];
    assert_eq!(store["backend"], "postgres", "{store:#}");
    assert_eq!(store["started_by_ladder"], true, "{store:#}");
    let version = store["version"].as_str().context("store version")?;
    assert!(
        version.starts_with(|c: char| c.is_ascii_digit()),
        "{store:#}"
    );
    assert!(table.contains("Control-plane store: PostgreSQL"), "{table}");

    // Each member (and router) refreshed at least twice in the hold: count
    // at least one per member, every refresh answered OK.
    let refresh = &report["refresh"];
    assert!(u(refresh, "/refreshes") >= members, "{refresh:#}");
    assert_eq!(
        refresh["codes"]
            .as_object()
            .map(|c| c.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["Ok".to_string()]),
        "{refresh:#}"
    );
    assert!(refresh["p99_ms"].as_f64().is_some(), "{refresh:#}");
    assert!(
        report["steps"][0]["control_plane"]["rpc_p50_ms"]
            .as_f64()
            .is_some()
    );

    // The cluster and its server are gone.
    let dir = PathBuf::from(store["cluster_dir"].as_str().context("cluster dir")?);
    assert!(!dir.exists(), "cluster {} left behind", dir.display());
    let data = dir.join("data").display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&data))
        .collect();
    assert!(left.is_empty(), "server processes left: {left:?}");
    assert!(Path::new(&work.path().join("run/postgres.log")).is_file());
    Ok(())
}
