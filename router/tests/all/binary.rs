//! The real `agentmesh-router` binary: flags, token file, readiness over
//! HTTP, graceful exit on SIGTERM.

use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use agentmesh_testkit::DEADLINE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const ADMIN: &str = "binary-test-admin-token-0123456789";

async fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_becomes_ready_and_exits_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = agentmesh_controlplane::spawn(agentmesh_controlplane::Config {
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        db: format!("sqlite://{}", dir.path().join("cp.db").display()),
        admin_token: Some(ADMIN.to_string()),
        ..Default::default()
    })
    .await
    .expect("control plane");
    let url = cp.public_url().to_string();
    let client = Client::new(ClientConfig {
        url: url.clone(),
        ..Default::default()
    })
    .expect("client");
    let token = client
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Router as i32,
                labels: vec![],
                max_uses: 10,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("token")
        .token;
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write token");

    let mut child = crate::support::router_binary(&url, &token_file, dir.path())
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--lease-interval-secs", "1"])
        .args(["--stream-inbound-queue-per-protocol", "1"])
        .spawn()
        .expect("start router binary");
    let metrics = agentmesh_testkit::scan_stderr(&mut child, "metrics address", |line| {
        let (_, rest) = line.split_once("metrics on http://")?;
        Some(rest.trim().trim_end_matches("\u{1b}[0m").to_string())
    })
    .await;

    let end = Instant::now() + DEADLINE;
    loop {
        if http_get(&metrics, "/readyz")
            .await
            .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
        {
            break;
        }
        assert!(Instant::now() < end, "router binary not ready in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = http_get(&metrics, "/metrics").await.expect("metrics");
    assert!(body.contains("agentmesh_router_ready 1"), "{body}");
    // The flag's metric: the stream drop counter, label values at 0.
    for protocol in [
        agentmesh_proto::protocols::AUTH,
        agentmesh_proto::protocols::CATALOG,
    ] {
        let series = format!(
            "agentmesh_streams_inbound_dropped_total{{protocol=\"{protocol}\",reason=\"queue_full\"}} 0"
        );
        assert!(body.contains(&series), "{series} missing: {body}");
    }

    let pid = child.id().expect("pid") as i32;
    let rc = send_sigterm(pid);
    assert_eq!(rc, 0, "signal sent");
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("router exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");
    cp.shutdown().await;
}

/// `kill -TERM pid` through the kill(1) program (the crate forbids unsafe).
fn send_sigterm(pid: i32) -> i32 {
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .map(|s| s.code().unwrap_or(-1))
        .unwrap_or(-1)
}

/// A router that cannot reach its control plane is still enrolling (its
/// calls retry within the control-plane retry budget) when SIGTERM comes:
/// shutdown stops the enrollment instead of waiting for it until the
/// shutdown grace runs out and the tasks are aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_enrollment_retries_stops_them_without_aborting() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    // A port nothing listens on: every enrollment attempt is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, "never-used-token\n").expect("write token");
    let mut child = crate::support::router_binary(&url, &token_file, dir.path())
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--control-plane-retry-budget-secs", "600"])
        .spawn()
        .expect("start router binary");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut log = String::new();
    let end = Instant::now() + DEADLINE;
    // Listening: the enrollment task is running (and retrying).
    while !log.contains("metrics on http://") {
        let line = tokio::time::timeout_at(end, lines.next_line())
            .await
            .expect("router started in time")
            .expect("read stderr")
            .expect("router exited early");
        log.push_str(&line);
        log.push('\n');
    }
    assert_eq!(
        send_sigterm(child.id().expect("pid") as i32),
        0,
        "signal sent"
    );
    while let Some(line) = tokio::time::timeout_at(end, lines.next_line())
        .await
        .expect("router exits after SIGTERM")
        .expect("read stderr")
    {
        log.push_str(&line);
        log.push('\n');
    }
    let status = tokio::time::timeout_at(end, child.wait())
        .await
        .expect("exit in time")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}\n{log}");
    assert!(
        !log.contains("did not stop within the grace period"),
        "the enrollment kept the router until it was aborted:\n{log}"
    );
}

#[test]
fn version_prints_the_version_and_the_git_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentmesh-router"))
        .arg("--version")
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "agentmesh-router {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            agentmesh_runtime::cli::checkout_commit(std::path::Path::new(env!(
                "CARGO_MANIFEST_DIR"
            )))
        )
    );
}
