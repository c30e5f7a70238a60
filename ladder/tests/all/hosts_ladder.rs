//! The ladder across hosts: the real `agentmesh-ladder local --hosts 5
//! --member-nat eim` puts the real control plane, two real routers and the
//! fleet's workers on hosts of their own (network namespaces), the two
//! member hosts each behind an endpoint-independent NAT of its own, so
//! every call crosses two NATs through a router. It holds with one router
//! killed (SIGKILL to the router process inside its host). Asserts counts
//! only: everyone ready and called, nobody exited, the kill row present
//! with nobody below one router, and no namespace of the run left after it.
//!
//! Needs root; without it the test prints `SKIPPED:` and passes, unless
//! `AGENTMESH_REQUIRE_NETNS=1` (CI as root), where it fails instead.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use agentmesh_ladder::hosts::testbed::namespaces_of;
use anyhow::{Context, ensure};
use serde_json::Value;

use super::finish::u;

/// The whole run must finish within this (about a minute and a half on a
/// quiet 2-core box); below nextest's backstop.
const RUN_DEADLINE: Duration = Duration::from_secs(8 * 60);
const PROVIDERS: u64 = 2;
const STEP: u64 = 9;
const STEPS: u64 = 2;
const MEMBER_HOSTS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_ladder_behind_eim_nats_with_a_router_kill() -> anyhow::Result<()> {
    if super::netns::skipped("hosts_ladder") {
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let work = tempfile::tempdir()?;
    let report_path = work.path().join("report.json");
    let hosts = 1 + 2 + MEMBER_HOSTS;
    let child = tokio::process::Command::new(&ladder)
        .args([
            "local",
            "--hosts",
            &hosts.to_string(),
            "--member-nat",
            "eim",
            "--routers",
            "2",
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
            "30",
            "--kill-router-at",
            "10",
            "--step-deadline-secs",
            "300",
        ])
        .arg("--work-dir")
        .arg(work.path().join("run"))
        .arg("--report")
        .arg(&report_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting agentmesh-ladder")?;
    let out = tokio::time::timeout(RUN_DEADLINE, child.wait_with_output())
        .await
        .context("the hosts ladder did not finish within its deadline")??;
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    ensure!(
        out.status.success(),
        "agentmesh-ladder failed: {}",
        out.status
    );
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(&report_path).context("reading the report")?,
    )?;

    // The hosts: the control plane, two routers and two member hosts, each
    // member host seen from its NAT gateway's public address.
    let h = &report["hosts"];
    assert_eq!(u(h, "/hosts"), hosts, "{h:#}");
    assert_eq!(h["member_nat"], "eim", "{h:#}");
    assert_eq!(h["routers"].as_array().map(Vec::len), Some(2), "{h:#}");
    let members = h["members"].as_array().context("member hosts")?;
    assert_eq!(members.len() as u64, MEMBER_HOSTS, "{h:#}");
    for m in members {
        assert_ne!(m["addr"], m["public_addr"], "not behind a NAT: {m:#}");
    }
    assert_eq!(u(&report, "/shape/source_ips"), 0, "{report:#}");
    assert!(table.contains("Hosts: "), "no hosts line on stdout");

    // Providers and every step: everyone enrolled, ready and called once.
    assert_eq!(u(&report, "/providers/ready"), PROVIDERS, "{report:#}");
    let steps = report["steps"].as_array().context("steps array")?;
    assert_eq!(steps.len() as u64, STEPS, "{report:#}");
    for step in steps {
        for field in ["/joining", "/enrolled", "/ready", "/first_call_ok"] {
            assert_eq!(u(step, field), STEP, "{field}: {step:#}");
        }
        assert_eq!(u(step, "/exits"), 0, "{step:#}");
        assert_eq!(step["routers"].as_array().map(Vec::len), Some(2));
    }
    // Every worker ran on a member host (workers were spread over them).
    assert!(u(&report, "/shape/workers") >= MEMBER_HOSTS, "{report:#}");

    // Hold: nobody exited, everyone ready at the end.
    let all = PROVIDERS + STEP * STEPS;
    assert_eq!(u(&report, "/hold/members"), all, "{report:#}");
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    assert_eq!(u(&report, "/hold/ready_at_end"), all, "{report:#}");

    // The kill: a router process inside its host, SIGKILLed; it held
    // members, none of whom lost its last router (K = 2).
    let kill = &report["events"]["kill_router"];
    assert!(kill.is_object(), "no kill event: {report:#}");
    assert!(kill["error"].is_null(), "kill failed: {kill:#}");
    assert_eq!(u(kill, "/members"), all, "{kill:#}");
    assert_eq!(u(kill, "/below_one_router"), 0, "{kill:#}");
    assert!(u(kill, "/target_attached_before") > 0, "{kill:#}");
    assert!(
        u(kill, "/below_k_routers") > 0,
        "the kill moved nobody: {kill:#}"
    );
    assert_eq!(u(&report, "/exits"), 0, "{report:#}");

    // Cleanup: no namespace of the run is left.
    let prefix = h["prefix"].as_str().context("prefix")?;
    assert_eq!(prefix.len(), agentmesh_netns::names::PREFIX_LEN, "{prefix}");
    let left = namespaces_of(prefix);
    assert!(left.is_empty(), "namespaces left after the run: {left:?}");
    Ok(())
}

/// A hosts ladder SIGKILLed while it runs cannot remove its namespaces;
/// the next testbed made on the machine (the next run's start) sweeps them,
/// because their creating process is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hosts_ladder_is_swept_by_the_next_start() -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    if super::netns::skipped("hosts_ladder_killed") {
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let work = tempfile::tempdir()?;
    let mut child = tokio::process::Command::new(&ladder)
        .args(["local", "--hosts", "3", "--routers", "1", "--step", "2"])
        .args(["--steps", "1", "--providers", "1", "--hold-secs", "600"])
        .arg("--work-dir")
        .arg(work.path().join("run"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting agentmesh-ladder")?;
    let stderr = child.stderr.take().context("stderr")?;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    // "ladder: Hosts: 3 (testbed PREFIX): …", then the mesh is started.
    let find = async {
        let mut prefix = None;
        while let Some(line) = lines.next_line().await? {
            eprintln!("{line}");
            if let Some(rest) = line.split_once("(testbed ").map(|(_, r)| r) {
                prefix = rest.split(')').next().map(str::to_string);
            }
            if prefix.is_some() && line.contains("routers ready") {
                break;
            }
        }
        anyhow::Ok(prefix)
    };
    let prefix = tokio::time::timeout(RUN_DEADLINE, find)
        .await
        .context("the ladder did not start its mesh within its deadline")??
        .context("the ladder never named its testbed")?;
    let made = namespaces_of(&prefix);
    assert!(made.len() >= 4, "the run's namespaces: {made:?}");
    child.kill().await?;
    // The ladder is gone and reaped: its namespaces stay behind.
    assert_eq!(namespaces_of(&prefix), made);
    let next = agentmesh_netns::Testbed::new()
        .await
        .context("the next testbed")?;
    let left = namespaces_of(&prefix);
    assert!(left.is_empty(), "not swept: {left:?}");
    drop(next);
    Ok(())
}
