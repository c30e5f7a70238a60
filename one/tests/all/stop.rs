//! SIGTERM (what `kill`, a CI job's timeout and a container stop send)
//! drains the real `agentmesh-one` binary's routers and exits cleanly, as
//! SIGINT does.

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

#[test]
fn colour_sequences_are_stripped() {
    assert_eq!(
        plain("\u{1b}[3mdrained\u{1b}[0m\u{1b}[2m=\u{1b}[0m2"),
        "drained=2"
    );
    assert_eq!(plain("plain"), "plain");
}
