//! The ladder's `remote` mode the way a run on real VMs takes it: a mesh
//! started apart from the ladder (a real control plane serving gRPC over TLS
//! with a certificate of its own, two real routers given it as their CA),
//! then the real `agentmesh-ladder remote` binary joins it over `https://`
//! with `--control-plane-ca`, its members dialing from the address the
//! kernel picks (no 127.0.0.x spreading unless asked). Asserts counts only:
//! everyone enrolled over TLS, became ready and called through the mesh.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentmesh_ladder::binaries::Binaries;
use agentmesh_ladder::config::LocalConfig;
use agentmesh_ladder::mesh::LocalMesh;
use anyhow::{Context, ensure};
use serde_json::Value;

/// The whole run must finish within this (well under a minute when quiet).
const RUN_DEADLINE: Duration = Duration::from_secs(5 * 60);
const STEP: u64 = 6;
const PROVIDERS: u64 = 1;

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

async fn run_remote(
    ladder: &Path,
    mesh: &LocalMesh,
    ca: &Path,
    work: &Path,
) -> anyhow::Result<Value> {
    let report_path = work.join("report.json");
    let mut args: Vec<String> = vec![
        "remote".into(),
        "--control-plane".into(),
        mesh.url(),
        "--control-plane-ca".into(),
        ca.display().to_string(),
        "--token-file".into(),
        mesh.member_token_file.display().to_string(),
        "--control-plane-http-addr".into(),
        mesh.control_planes.first().http.to_string(),
        "--providers".into(),
        PROVIDERS.to_string(),
        "--step".into(),
        STEP.to_string(),
        "--steps".into(),
        "1".into(),
        "--member-routers".into(),
        "2".into(),
        "--members-per-worker".into(),
        "10".into(),
        "--hold-secs".into(),
        "3".into(),
        "--step-deadline-secs".into(),
        "180".into(),
        "--work-dir".into(),
        work.join("fleet").display().to_string(),
        "--report".into(),
        report_path.display().to_string(),
    ];
    for r in &mesh.routers {
        args.extend(["--router-metrics-addr".into(), r.metrics.to_string()]);
    }
    let child = tokio::process::Command::new(ladder)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting agentmesh-ladder remote")?;
    let out = tokio::time::timeout(RUN_DEADLINE, child.wait_with_output())
        .await
        .context("the remote ladder did not finish within its deadline")??;
    println!("{}", String::from_utf8_lossy(&out.stdout));
    ensure!(
        out.status.success(),
        "agentmesh-ladder remote failed: {}",
        out.status
    );
    let text = std::fs::read_to_string(&report_path).context("reading the report")?;
    Ok(serde_json::from_str(&text)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_ladder_joins_a_tls_control_plane() -> anyhow::Result<()> {
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let bins = Binaries::beside(&ladder)?;
    let work = tempfile::tempdir()?;
    let mesh_dir = work.path().join("mesh");
    std::fs::create_dir_all(&mesh_dir)?;
    let cfg = LocalConfig {
        routers: 2,
        control_plane_tls: true,
        ..LocalConfig::default()
    };
    let mesh = LocalMesh::start(bins, cfg, &mesh_dir, PROVIDERS + STEP + 10).await?;
    assert!(
        mesh.url().starts_with("https://127.0.0.1:"),
        "{}",
        mesh.url()
    );
    let ca = mesh.ca_file().context("a TLS mesh has a CA file")?;

    let result = run_remote(&ladder, &mesh, &ca, work.path()).await;
    mesh.shutdown().await;
    let report = result?;

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
    assert_eq!(
        step["routers"].as_array().map(Vec::len),
        Some(2),
        "{step:#}"
    );
    assert_eq!(u(&report, "/hold/exits"), 0, "{report:#}");
    Ok(())
}
