//! Runs the real `agentmesh-one` binary with demo members, as README's first
//! command does, and waits until calls flow.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;

/// Generous: a cold, loaded CI machine starts the mesh slowly.
const DEADLINE: Duration = Duration::from_secs(120);
const MEMBERS: usize = 5;
const WANTED_CALLS: u64 = 20;

/// Parses `members ready R/N | calls ok K failed F | ...`.
fn parse(line: &str) -> Option<(usize, usize, u64, u64)> {
    let rest = line.split("members ready ").nth(1)?;
    let (ready, rest) = rest.split_once('/')?;
    let (total, rest) = rest.split_once(" | calls ok ")?;
    let (ok, rest) = rest.split_once(" failed ")?;
    let failed = rest.split_whitespace().next()?;
    Some((
        ready.parse().ok()?,
        total.parse().ok()?,
        ok.parse().ok()?,
        failed.parse().ok()?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_members_call_each_other_through_the_mesh() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh-one"))
        .args([
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
            "--demo-members",
            &MEMBERS.to_string(),
            "--demo-call-interval-ms",
            "200",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--router-base-port",
            "0",
            "--router-metrics-base-port",
            "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start agentmesh-one");

    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    // The banner names the token file and the join command.
    let (metrics_tx, metrics_rx) = tokio::sync::oneshot::channel();
    let banner = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        let mut metrics_tx = Some(metrics_tx);
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(addr) = router0_metrics(&l)
                && let Some(tx) = metrics_tx.take()
            {
                let _ = tx.send(addr);
            }
            seen.push(l);
        }
        seen
    });
    let mut lines = BufReader::new(stderr).lines();
    // Counted from the first status line with every member ready: calls
    // made while members still join may fail (a caller before its provider
    // is ready), and how many does is the machine's load, not the mesh's.
    let outcome = tokio::time::timeout(DEADLINE, async {
        let mut last = None;
        let mut at_ready: Option<(u64, u64)> = None;
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(s) = parse(&line) {
                last = Some(s);
                let (ready, total, ok, failed) = s;
                if ready == total && total == MEMBERS {
                    let (ok0, failed0) = *at_ready.get_or_insert((ok, failed));
                    if ok.saturating_sub(ok0) >= WANTED_CALLS {
                        return Ok((ready, total, ok - ok0, failed.saturating_sub(failed0)));
                    }
                }
            }
        }
        Err(last)
    })
    .await;
    let (ready, total, ok, failed) = match outcome {
        Ok(Ok(s)) => s,
        Ok(Err(last)) => panic!("agentmesh-one exited early; last status {last:?}"),
        Err(_) => panic!("no {WANTED_CALLS} calls with every member ready within {DEADLINE:?}"),
    };
    assert_eq!((ready, total), (MEMBERS, MEMBERS));
    assert!(ok >= WANTED_CALLS);
    // Once every member is ready, failures must stay a small minority.
    assert!(
        failed * 10 <= ok,
        "calls failed {failed} vs ok {ok} since every member was ready"
    );

    // The process-wide gauges (jemalloc's totals) are on router 0's /metrics.
    let metrics_addr = tokio::time::timeout(DEADLINE, metrics_rx)
        .await
        .expect("banner names router 0's metrics within the deadline")
        .expect("banner task alive");
    let body = http_get(&metrics_addr, "/metrics").await;
    let resident = agentmesh_testkit::metric(&body, "agentmesh_runtime_allocator_resident_bytes");
    assert!(resident > 0.0, "resident bytes {resident}");

    // Ctrl-C stops it cleanly.
    let pid = child.id().expect("pid") as i32;
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .await
        .expect("kill -INT");
    assert!(status.success());
    let exit = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("agentmesh-one stops after SIGINT")
        .expect("wait");
    assert!(exit.success(), "exit status {exit}");

    let banner = banner.await.expect("banner task");
    let token_file = dir.path().join("token");
    assert!(
        banner
            .iter()
            .any(|l| l.contains("agentmesh-node run --control-plane http://127.0.0.1:"))
    );
    // Without --policy the control plane starts with the allow-all policy
    // and the banner says so.
    assert!(
        banner
            .iter()
            .any(|l| l.starts_with("policy") && l.contains("version 1: allow-all")),
        "{banner:?}"
    );
    let token = std::fs::read_to_string(&token_file).expect("token file");
    assert!(!token.trim().is_empty());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&token_file)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "token file is private");
}

/// `host:port` of router 0's metrics from its banner line
/// (`router 0       <peer> <addrs> metrics http://host:port/metrics`).
fn router0_metrics(line: &str) -> Option<String> {
    let rest = line.strip_prefix("router 0 ")?;
    let url = rest.split(" metrics http://").nth(1)?;
    Some(url.strip_suffix("/metrics")?.to_string())
}

/// A plain HTTP/1.0 GET with a deadline; returns the body.
async fn http_get(addr: &str, path: &str) -> String {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    };
    let resp = tokio::time::timeout(DEADLINE, fetch)
        .await
        .expect("GET within the deadline");
    assert!(
        resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200"),
        "{resp}"
    );
    resp.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[test]
fn banner_names_router0_metrics() {
    assert_eq!(
        router0_metrics(
            "router 0       12D3Koo /ip4/127.0.0.1/tcp/1 metrics http://127.0.0.1:7420/metrics"
        ),
        Some("127.0.0.1:7420".into())
    );
    assert_eq!(
        router0_metrics("router 1       x y metrics http://127.0.0.1:7421/metrics"),
        None
    );
}

#[test]
fn status_line_parses() {
    assert_eq!(
        parse("members ready 3/5 | calls ok 12 failed 1 | p50 2.0 ms p95 5.0 ms"),
        Some((3, 5, 12, 1))
    );
    assert_eq!(parse("something else"), None);
}
