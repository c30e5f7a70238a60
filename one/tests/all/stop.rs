//! SIGTERM (what `kill`, a CI job's timeout and a container stop send)
//! drains the real `agentmesh-one` binary's routers and exits cleanly, as
//! SIGINT does; a clean stop (Ctrl-C with demo members calling) logs no
//! warning and no error.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::Command;

/// Generous: a cold, loaded CI machine starts the mesh slowly, and the
/// drain may take its whole grace.
const DEADLINE: Duration = Duration::from_secs(120);

/// `line` without ANSI colour sequences (`ESC [ ... m`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_routers_and_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh-one"))
        .args([
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
            "--routers",
            "2",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--router-base-port",
            "0",
            "--router-metrics-base-port",
            "0",
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start agentmesh-one");

    // Running once the banner's last line (the join command) is out.
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::time::timeout(DEADLINE, async {
        while let Some(l) = stdout.next_line().await.expect("stdout") {
            if l.starts_with("join with") {
                return;
            }
        }
        panic!("agentmesh-one exited before printing its banner");
    })
    .await
    .expect("banner within the deadline");
    // Keep reading stdout so the child never blocks on a full pipe.
    let rest_out = tokio::spawn(async move {
        let mut inner = stdout.into_inner();
        let mut sink = Vec::new();
        let _ = inner.read_to_end(&mut sink).await;
    });
    let stderr = child.stderr.take().expect("stderr");
    let log = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push(plain(&l));
        }
        seen
    });

    let pid = child.id().expect("pid").to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill -TERM");
    assert!(sent.success());
    let exit = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("agentmesh-one stops after SIGTERM within the deadline")
        .expect("wait");
    let log = tokio::time::timeout(DEADLINE, log)
        .await
        .expect("stderr closes")
        .expect("log task");
    let _ = rest_out.await;
    let text = log.join("\n");
    assert!(exit.success(), "exit status {exit}: {text}");
    assert!(
        log.iter()
            .any(|l| l.contains("stopping: demo members first") && l.contains("SIGTERM")),
        "no stop on SIGTERM logged: {text}"
    );
    assert!(
        log.iter().any(|l| l.contains("routers drained")
            && l.contains("drained=2")
            && l.contains("routers=2")),
        "both routers not drained: {text}"
    );
    assert!(log.iter().any(|l| l.ends_with("stopped")), "{text}");
}

/// Parses the calls ok count of a demo progress line
/// (`members ready R/N | calls ok K failed F | ...`).
fn calls_ok(line: &str) -> Option<u64> {
    line.split(" | calls ok ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_with_demo_members_calling_logs_no_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentmesh-one"))
        .args([
            "--data-dir",
            dir.path().to_str().expect("utf-8 path"),
            "--routers",
            "2",
            "--demo-members",
            "3",
            "--demo-call-interval-ms",
            "100",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--router-base-port",
            "0",
            "--router-metrics-base-port",
            "0",
        ])
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start agentmesh-one");
    let stdout = child.stdout.take().expect("stdout");
    let rest_out = tokio::spawn(async move {
        let mut sink = Vec::new();
        let mut out = stdout;
        let _ = out.read_to_end(&mut sink).await;
    });
    // Every stderr line, and a signal once calls flow.
    // Start-up may warn about the machine (e.g. a low open-files limit):
    // only what is logged from the signal on counts.
    let (flowing_tx, flowing_rx) = tokio::sync::oneshot::channel();
    let signalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stderr = child.stderr.take().expect("stderr");
    let after_signal = signalled.clone();
    let log = tokio::spawn(async move {
        let mut flowing = Some(flowing_tx);
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let mut stop_log = Vec::new();
        while let Ok(Some(l)) = lines.next_line().await {
            let l = plain(&l);
            if calls_ok(&l).is_some_and(|n| n >= 10)
                && let Some(tx) = flowing.take()
            {
                let _ = tx.send(());
            }
            if after_signal.load(std::sync::atomic::Ordering::SeqCst) {
                stop_log.push(l.clone());
            }
            seen.push(l);
        }
        (seen, stop_log)
    });
    tokio::time::timeout(DEADLINE, flowing_rx)
        .await
        .expect("demo calls flow within the deadline")
        .expect("agentmesh-one exited before calls flowed");

    let pid = child.id().expect("pid").to_string();
    signalled.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill -INT");
    assert!(sent.success());
    let exit = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("agentmesh-one stops after SIGINT within the deadline")
        .expect("wait");
    let (log, stop_log) = tokio::time::timeout(DEADLINE, log)
        .await
        .expect("stderr closes")
        .expect("log task");
    let _ = rest_out.await;
    let text = log.join("\n");
    assert!(exit.success(), "exit status {exit}: {text}");
    assert!(
        stop_log
            .iter()
            .any(|l| l.contains("routers drained") && l.contains("drained=2")),
        "{text}"
    );
    assert!(stop_log.iter().any(|l| l.ends_with("stopped")), "{text}");
    let bad: Vec<&String> = stop_log
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        bad.is_empty(),
        "a clean stop logged {bad:#?}\nfull log:\n{text}"
    );
}

#[test]
fn colour_sequences_are_stripped() {
    assert_eq!(
        plain("\u{1b}[3mdrained\u{1b}[0m\u{1b}[2m=\u{1b}[0m2"),
        "drained=2"
    );
    assert_eq!(plain("plain"), "plain");
    assert_eq!(
        calls_ok("members ready 3/3 | calls ok 12 failed 0 | p50 1.0 ms p95 2.0 ms"),
        Some(12)
    );
    assert_eq!(calls_ok("stopping"), None);
}
