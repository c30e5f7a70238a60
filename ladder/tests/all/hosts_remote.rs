//! `remote` mode across hosts, the path a run on real VMs takes, driven as
//! an operator drives it: the real `agentmesh-ladder testbed` starts a mesh
//! on hosts of its own (the real control plane serving gRPC over TLS with a
//! certificate for its host's address, two real routers) and describes it
//! in `testbed.json`; the real `agentmesh-ladder remote`, started on the
//! member host behind an endpoint-independent NAT with the prefix and
//! arguments the file gives, joins it over `https://` with
//! `--control-plane-ca`, its workers and members on that host. Then the
//! testbed is SIGTERMed: it exits 0 and leaves no namespace. Asserts counts
//! only: everyone enrolled over TLS, ready and called.
//!
//! A second test kills a router under a testbed: the testbed stops with a
//! non-zero status naming it, and still removes its namespaces.
//!
//! Needs root; prints `SKIPPED:` without it unless `AGENTMESH_REQUIRE_NETNS=1`.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use agentmesh_ladder::hosts::testbed::namespaces_of;
use anyhow::{Context, bail, ensure};
use serde_json::Value;

use super::finish::{finish, u};
use tokio::time::Instant;

/// Until `testbed.json` appears: hosts built, mesh ready.
const START_DEADLINE: Duration = Duration::from_secs(3 * 60);
const RUN_DEADLINE: Duration = Duration::from_secs(5 * 60);
/// Until the testbed has exited after SIGTERM (each program has 30 s).
const STOP_DEADLINE: Duration = Duration::from_secs(2 * 60);
const POLL: Duration = Duration::from_millis(200);
const STEP: u64 = 6;
const PROVIDERS: u64 = 1;

fn s<'a>(v: &'a Value, path: &str) -> &'a str {
    v.pointer(path)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("testbed.json has no string at {path}: {v:#}"))
}

fn strings(v: &Value, path: &str) -> Vec<String> {
    v.pointer(path)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("testbed.json has no array at {path}: {v:#}"))
        .iter()
        .map(|a| a.as_str().expect("a string").to_string())
        .collect()
}

/// A running `agentmesh-ladder testbed`, its stderr in `log`. Dropped while
/// it runs (a failed test), it is stopped as an operator would, with
/// SIGTERM, so its namespaces go, and its output is printed.
struct TestbedProc {
    child: tokio::process::Child,
    log: PathBuf,
    file: PathBuf,
}

impl TestbedProc {
    fn start(work: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let ladder = env!("CARGO_BIN_EXE_agentmesh-ladder");
        let log = work.join("testbed.log");
        let out = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(ladder)
            .arg("testbed")
            .args(args)
            .arg("--work-dir")
            .arg(work.join("testbed"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting agentmesh-ladder testbed")?;
        Ok(Self {
            child,
            log,
            file: work.join("testbed").join("testbed.json"),
        })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `testbed.json`, once written (atomically), within [`START_DEADLINE`].
    async fn described(&mut self) -> anyhow::Result<Value> {
        let until = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "the testbed exited ({status}) before writing testbed.json:\n{}",
                    self.output()
                );
            }
            if let Ok(text) = std::fs::read_to_string(&self.file) {
                return Ok(serde_json::from_str(&text)?);
            }
            ensure!(
                Instant::now() < until,
                "no testbed.json within {START_DEADLINE:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Its exit, within [`STOP_DEADLINE`].
    async fn exited(&mut self) -> anyhow::Result<ExitStatus> {
        tokio::time::timeout(STOP_DEADLINE, self.child.wait())
            .await
            .with_context(|| format!("the testbed still runs after {STOP_DEADLINE:?}"))?
            .context("waiting for the testbed")
    }

    fn sigterm(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("the testbed has exited")?;
        agentmesh_ladder::children::sigterm(pid)?;
        Ok(())
    }
}

impl Drop for TestbedProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.sigterm();
            let until = std::time::Instant::now() + STOP_DEADLINE;
            while std::time::Instant::now() < until {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(POLL);
            }
        }
        eprintln!("--- agentmesh-ladder testbed ---\n{}", self.output());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_ladder_on_a_natted_host_joins_a_tls_mesh_on_other_hosts() -> anyhow::Result<()> {
    if super::netns::skipped("hosts_remote") {
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let work = tempfile::tempdir()?;
    let members = (PROVIDERS + STEP).to_string();
    let mut testbed = TestbedProc::start(
        work.path(),
        &[
            "--hosts",
            "4",
            "--routers",
            "2",
            "--member-nat",
            "eim",
            "--control-plane-tls",
            "--members",
            &members,
            "--max-up-secs",
            "900",
        ],
    )?;
    let tb = testbed.described().await?;

    // What the file says: a TLS control plane on its host's address, its
    // certificate, two routers, one member host behind a NAT.
    assert_eq!(tb["tls"], true, "{tb:#}");
    let url = s(&tb, "/control_plane_url");
    let cp_addr = s(&tb, "/control_plane/grpc_addr");
    assert_eq!(url, format!("https://{cp_addr}"), "{tb:#}");
    assert!(cp_addr.ends_with(":7400"), "{tb:#}");
    let ca = s(&tb, "/ca_file");
    assert!(Path::new(ca).is_file(), "no CA file at {ca}");
    assert_eq!(tb["routers"].as_array().map(Vec::len), Some(2), "{tb:#}");
    let host = &tb["member_hosts"][0];
    assert_ne!(
        host["addr"], host["public_addr"],
        "not behind a NAT: {tb:#}"
    );
    let prefix = s(&tb, "/prefix").to_string();
    assert!(
        !namespaces_of(&prefix).is_empty(),
        "no namespace of {prefix}"
    );

    // The remote ladder on the member host, as the file says to start it.
    let exec_prefix = strings(&tb, "/member_hosts/0/exec_prefix");
    let (program, rest) = exec_prefix.split_first().context("an empty prefix")?;
    let report_path = work.path().join("report.json");
    let child = std::process::Command::new(program)
        .args(rest)
        .arg(&ladder)
        .arg("remote")
        .args(strings(&tb, "/remote_args"))
        .args(["--providers", &PROVIDERS.to_string()])
        .args(["--step", &STEP.to_string(), "--steps", "1"])
        .args(["--member-routers", "2", "--members-per-worker", "10"])
        .args(["--hold-secs", "3", "--step-deadline-secs", "180"])
        .arg("--work-dir")
        .arg(work.path().join("fleet"))
        .arg("--report")
        .arg(&report_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting agentmesh-ladder remote")?;
    let report_file = report_path.clone();
    let (_table, report) =
        tokio::task::spawn_blocking(move || finish(child, &report_file, RUN_DEADLINE)).await??;

    // The testbed stops on SIGTERM, cleanly, and leaves nothing behind.
    testbed.sigterm()?;
    let status = testbed.exited().await?;
    assert!(
        status.success(),
        "the testbed exited {status}:\n{}",
        testbed.output()
    );
    let output = testbed.output();
    assert!(output.contains("testbed: up"), "no summary:\n{output}");
    assert!(output.contains("testbed: stopped"), "no stop:\n{output}");
    let left = namespaces_of(&prefix);
    assert!(
        left.is_empty(),
        "namespaces left after the testbed: {left:?}"
    );
    assert!(
        !work.path().join("testbed").join("testbed.json").exists(),
        "testbed.json outlived the testbed"
    );

    assert_eq!(report["mode"], "remote", "{report:#}");
    assert_eq!(report["shape"]["control_plane_tls"], true, "{report:#}");
    assert_eq!(u(&report, "/shape/source_ips"), 0, "{report:#}");
    assert_eq!(u(&report, "/providers/ready"), PROVIDERS, "{report:#}");
    let steps = report["steps"].as_array().context("steps array")?;
    assert_eq!(steps.len(), 1, "{report:#}");
    let step = &steps[0];
    for field in ["/joining", "/enrolled", "/ready", "/first_call_ok"] {
        assert_eq!(u(step, field), STEP, "{field}: {step:#}");
    }
    assert_eq!(u(step, "/exits"), 0, "{step:#}");
    // The routers' metrics were read across the NAT from the fleet's host.
    let routers = step["routers"].as_array().context("routers")?;
    assert_eq!(routers.len(), 2, "{step:#}");
    assert!(
        routers.iter().all(|r| r["up"] == true),
        "a router's /metrics did not answer across the NAT: {step:#}"
    );
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_testbed_whose_router_dies_stops_and_says_which() -> anyhow::Result<()> {
    if super::netns::skipped("hosts_remote_router_dies") {
        return Ok(());
    }
    let work = tempfile::tempdir()?;
    let mut testbed = TestbedProc::start(
        work.path(),
        &[
            "--hosts",
            "3",
            "--routers",
            "1",
            "--members",
            "10",
            "--max-up-secs",
            "900",
        ],
    )?;
    let tb = testbed.described().await?;
    let prefix = s(&tb, "/prefix").to_string();
    let pid = tb
        .pointer("/routers/0/pid")
        .and_then(Value::as_u64)
        .context("the router's pid")?;
    agentmesh_ladder::children::signal(u32::try_from(pid)?, libc::SIGKILL)?;
    let status = testbed.exited().await?;
    let output = testbed.output();
    assert!(!status.success(), "the testbed exited {status}:\n{output}");
    assert!(
        output.contains("router r0") && output.contains("exited unexpectedly"),
        "the testbed did not say which program died:\n{output}"
    );
    let left = namespaces_of(&prefix);
    assert!(
        left.is_empty(),
        "namespaces left after the testbed: {left:?}"
    );
    Ok(())
}
