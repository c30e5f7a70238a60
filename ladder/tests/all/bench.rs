//! CI's bench: the real `agentmesh-ladder bench` in a tiny configuration
//! (a few MiB, a few round trips) starts every path's processes (bare
//! libp2p peers and relays, the bare forwarder and splicing listener of the
//! circuit with TCP ends and of the direct floor, a real control plane, two
//! real routers, five real nodes, two of them punching on loopback) and
//! writes its JSON report. Asserts only what cannot flake: every path is
//! present with its bytes moved, round trips recorded and CPU read for
//! each of its processes; the direct row's bytes all went direct; every
//! time-to-direct sample went direct; no timing.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// The whole run must finish within this; below nextest's backstop.
const RUN_DEADLINE: Duration = Duration::from_secs(5 * 60);
const PATHS: [&str; 8] = [
    "plain TCP to the backend",
    "bare libp2p, direct",
    "bare libp2p, relay v2 circuit",
    "bare libp2p, relay v2 circuit with TCP ends",
    "bare libp2p, direct with TCP ends and the member's yamux",
    "agentmesh, same router",
    "agentmesh, transit (caller and provider on different routers)",
    "agentmesh, direct (punched)",
];
/// Fresh punches timed.
const SAMPLES: u64 = 2;

#[test]
fn tiny_bench_has_every_path() -> anyhow::Result<()> {
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let dir = ladder.parent().context("ladder dir")?;
    for p in [
        "agentmesh-control-plane",
        "agentmesh-router",
        "agentmesh-node",
    ] {
        ensure!(
            dir.join(p).is_file(),
            "{p} is missing beside the ladder: build the programs in the same profile first"
        );
    }
    let work = tempfile::tempdir()?;
    let report_path = work.path().join("bench.json");
    let mut child = Command::new(&ladder)
        .args([
            "bench",
            "--single-kib",
            "2048",
            "--concurrent-kib",
            "2048",
            "--streams",
            "4",
            "--round-trips",
            "20",
            "--request-deadline-secs",
            "120",
            "--time-to-direct-samples",
            "2",
            "--report",
        ])
        .arg(&report_path)
        .arg("--work-dir")
        .arg(work.path().join("run"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            bail!("bench did not finish within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut table = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().context("stdout")?, &mut table)?;
    ensure!(status.success(), "bench failed: {status}\n{table}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path)?)?;
    let rows = report["rows"].as_array().context("rows")?;
    ensure!(rows.len() == PATHS.len(), "{} rows: {report:#}", rows.len());
    for (row, path) in rows.iter().zip(PATHS) {
        ensure!(row["path"] == path, "expected {path}: {row:#}");
        ensure!(table.contains(path), "the table lacks {path}:\n{table}");
        ensure!(row["single_bytes"] == 2048 * 1024, "{row:#}");
        ensure!(row["concurrent_bytes"] == 2048 * 1024, "{row:#}");
        ensure!(row["round_trips"] == 20, "{row:#}");
        for k in ["single_mib_per_sec", "concurrent_mib_per_sec", "rtt_p50_ms"] {
            ensure!(row[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {row:#}");
        }
        let cpu = &row["cpu_secs_per_gib"];
        let want_router = path.contains("relay") || path.starts_with("agentmesh");
        ensure!(
            cpu["caller"].is_number() && cpu["provider"].is_number(),
            "{row:#}"
        );
        ensure!(cpu["router"].is_number() == want_router, "{row:#}");
        // The paths with TCP ends count the bench client and backend apart.
        let want_extra = path.contains("with TCP ends") || path.starts_with("agentmesh");
        for k in ["client", "backend"] {
            ensure!(cpu[k].is_number() == want_extra, "{k}: {row:#}");
        }
        // Every byte of the direct row went direct (the bench fails the
        // row otherwise; this checks the report says so).
        let bytes = &row["path_bytes"];
        if path.contains("punched") {
            ensure!(bytes["relayed"] == 0, "{row:#}");
            ensure!(
                bytes["direct_sent"].as_u64() >= Some(2 * 2048 * 1024),
                "{row:#}"
            );
        } else {
            ensure!(bytes.is_null(), "{row:#}");
        }
    }
    let direct = &report["direct"];
    ensure!(
        direct["rounds"].as_array().map(Vec::len) == Some(1) && direct["medians"].is_object(),
        "{direct:#}"
    );
    let t = &report["time_to_direct"];
    let went = t["samples_ms"].as_array().map_or(0, |v| v.len() as u64)
        + t["direct_at_first_call"].as_u64().unwrap_or(0);
    ensure!(
        went == SAMPLES && t["failed"].as_array().is_some_and(Vec::is_empty),
        "{t:#}"
    );
    for heading in [
        "Targets against the bare relay circuit",
        "The TCP ends alone",
        "agentmesh's own",
        "Direct: agentmesh, direct (punched) against",
        "Time from the first relayed call to the first direct one",
    ] {
        ensure!(table.contains(heading), "{heading}: {table}");
    }
    Ok(())
}
