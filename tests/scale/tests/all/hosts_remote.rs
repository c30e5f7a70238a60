//! `remote` mode across hosts, the path a run on real VMs takes: a mesh
//! started on hosts of its own (the real control plane serving gRPC over
//! TLS with a certificate for its host's address, two real routers), then
//! the real `agentmesh-ladder remote` started on another host behind an
//! endpoint-independent NAT joins it over `https://` with
//! `--control-plane-ca`, its workers and members on that host. Asserts
//! counts only: everyone enrolled over TLS, ready and called.
//!
//! Needs root; prints `SKIPPED:` without it unless `AGENTMESH_REQUIRE_NETNS=1`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use agentmesh_ladder::binaries::Binaries;
use agentmesh_ladder::config::LocalConfig;
use agentmesh_ladder::hosts::MemberNat;
use agentmesh_ladder::hosts::build::Layout;
use agentmesh_ladder::mesh::LocalMesh;
use anyhow::{Context, ensure};
use serde_json::Value;

const RUN_DEADLINE: Duration = Duration::from_secs(5 * 60);
const STEP: u64 = 6;
const PROVIDERS: u64 = 1;

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("report has no number at {path}: {v:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_ladder_on_a_natted_host_joins_a_tls_mesh_on_other_hosts() -> anyhow::Result<()> {
    if let Some(why) = agentmesh_netns::unavailable() {
        assert!(
            !agentmesh_netns::required(),
            "hosts_remote: {why}; {}=1 here, so the namespace tests fail rather than skip",
            agentmesh_netns::REQUIRE_ENV
        );
        eprintln!("SKIPPED: hosts_remote: {why}");
        return Ok(());
    }
    let ladder = PathBuf::from(env!("CARGO_BIN_EXE_agentmesh-ladder"));
    let bins = Binaries::beside(&ladder)?;
    let work = tempfile::tempdir()?;
    let mesh_dir = work.path().join("mesh");
    std::fs::create_dir_all(&mesh_dir)?;
    let tb = Layout {
        hosts: 4,
        routers: 2,
        member_hosts: 1,
        member_nat: MemberNat::Eim,
    }
    .build()
    .await?;
    let cfg = LocalConfig {
        routers: 2,
        control_plane_tls: true,
        ..LocalConfig::default()
    };
    let place = tb.placement.clone();
    let dir = mesh_dir.clone();
    let mesh = tb
        .driver
        .run(async move {
            LocalMesh::start_placed(bins, cfg, &dir, PROVIDERS + STEP + 10, Some(place)).await
        })
        .await?;
    let cp_addr = tb.control_plane.addr();
    assert_eq!(mesh.url(), format!("https://{cp_addr}:7400"));
    let ca = mesh.ca_file().context("a TLS mesh has a CA file")?;

    let fleet_host = &tb.members[0];
    assert_ne!(fleet_host.addr(), fleet_host.public_addr(), "behind a NAT");
    let report_path = work.path().join("report.json");
    let mut cmd = fleet_host.command(&ladder);
    cmd.args(["remote", "--control-plane", &mesh.url()])
        .arg("--control-plane-ca")
        .arg(&ca)
        .arg("--token-file")
        .arg(&mesh.member_token_file)
        .args([
            "--control-plane-http-addr",
            &mesh.control_plane.http.to_string(),
        ])
        .args(["--providers", &PROVIDERS.to_string()])
        .args(["--step", &STEP.to_string(), "--steps", "1"])
        .args(["--member-routers", "2", "--members-per-worker", "10"])
        .args(["--hold-secs", "3", "--step-deadline-secs", "180"])
        .arg("--work-dir")
        .arg(work.path().join("fleet"))
        .arg("--report")
        .arg(&report_path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for r in &mesh.routers {
        cmd.args(["--router-metrics-addr", &r.metrics.to_string()]);
    }
    let run = async {
        let child = cmd.spawn().context("starting agentmesh-ladder remote")?;
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
        anyhow::Ok(serde_json::from_str::<Value>(&text)?)
    };
    let result = run.await;
    tb.driver
        .run(async move {
            mesh.shutdown().await;
            Ok(())
        })
        .await?;
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
