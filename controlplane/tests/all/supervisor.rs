//! The supervisor: a long-lived task that stops outside a shutdown is
//! reported by name through the handle, turns `/readyz` not ready, and
//! stops the binary with a non-zero status and a line naming it. The task
//! is the hidden `--fault-end-task-after-ms` one, the only way to make a
//! healthy control plane lose a task from outside.

use std::time::Duration;

use agentmesh_controlplane::{Config, spawn};

use crate::common::{self, binary, http_get};

#[tokio::test]
async fn a_task_that_stops_is_reported_and_readyz_turns_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(Config {
        fault_end_task_after_ms: Some(50),
        ..common::config(dir.path())
    })
    .await
    .expect("control plane starts");
    let f = tokio::time::timeout(Duration::from_secs(30), h.failed())
        .await
        .expect("the failure is reported within 30 s");
    assert_eq!(f.task, "fault_injection");
    assert!(f.reason.contains("--fault-end-task-after-ms"), "{f}");
    assert_eq!(h.failure(), Some(f));
    let (status, body) = http_get(h.http_addr(), "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("fault_injection"), "{body}");
    // The rest still serves, and stops when asked.
    assert_eq!(http_get(h.http_addr(), "/healthz").await.0, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn a_shutdown_is_no_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path()).await;
    assert_eq!(h.failure(), None);
    assert_eq!(http_get(h.http_addr(), "/readyz").await.0, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn the_binary_exits_non_zero_naming_the_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("cp.db").display());
    let out = binary::run(
        &[
            "--db",
            &db,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--policy-allow-all",
            "--fault-end-task-after-ms",
            "50",
        ],
        &[],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("agentmesh-control-plane: task fault_injection stopped:"),
        "{stderr}"
    );
}
