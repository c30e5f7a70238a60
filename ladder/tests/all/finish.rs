//! The end of every ladder test's run: the real `agentmesh-ladder` waited
//! for within the test's own deadline (killed past it, so a hang fails with
//! the test's message before nextest's backstop), its table printed, its
//! JSON report read.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// Runs the ladder `cmd` (its flags given) with its data in `work/run` and
/// its report at `work/report.json`, and [`finish`]es it within `deadline`.
pub(crate) fn run(
    cmd: &mut Command,
    work: &Path,
    deadline: Duration,
) -> anyhow::Result<(String, Value)> {
    let report = work.join("report.json");
    let child = cmd
        .arg("--work-dir")
        .arg(work.join("run"))
        .arg("--report")
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting agentmesh-ladder")?;
    finish(child, &report, deadline)
}

/// Waits for `child` (spawned with its stdout piped) within `deadline` and
/// returns the table it printed and the report it wrote at `report_path`.
/// Stdout is read on a thread of its own while the ladder runs, so a table
/// larger than the pipe's buffer cannot stall the ladder.
pub(crate) fn finish(
    mut child: Child,
    report_path: &Path,
    deadline: Duration,
) -> anyhow::Result<(String, Value)> {
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut table = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut table);
            table
        })
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > deadline {
            child.kill()?;
            let _ = child.wait();
            bail!("the ladder did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let table = reader
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default();
    println!("{table}");
    ensure!(status.success(), "agentmesh-ladder failed: {status}");
    let report =
        serde_json::from_str(&std::fs::read_to_string(report_path).context("reading the report")?)
            .context("parsing the report")?;
    Ok((table, report))
}

/// The number at JSON pointer `path` of a report (panics, quoting the
/// report, when there is none).
pub(crate) fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}
