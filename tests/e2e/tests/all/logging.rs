//! The programs' log on a pipe: no colour codes, and `--log-format json`
//! lines that parse (agentmesh_runtime::logging, shared by every program).

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CONTROL_PLANE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// Starts the control plane with `format`, stderr on a pipe, and returns
/// its log lines up to and including "control plane started" (at most 60 s).
fn log_lines(format: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("log test set-up");
    let mut child = Command::new(CONTROL_PLANE)
        .args(["--log-format", format, "--insecure"])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .arg(format!("--db=sqlite://{}/cp.db", dir.path().display()))
        // The level from RUST_LOG, as documented.
        .env("RUST_LOG", "info")
        // A terminal would allow colours; a pipe never does, whatever TERM says.
        .env("TERM", "xterm-256color")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("log test set-up");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("log test set-up");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let done = line.contains("control plane started");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("control plane started")),
        "no start line within 60 s: {lines:?}"
    );
    lines
}

#[test]
fn text_log_on_a_pipe_has_no_escape_codes() {
    let lines = log_lines("text");
    for l in &lines {
        assert!(!l.contains('\x1b'), "escape code in {l:?}");
    }
    assert!(lines.iter().any(|l| l.contains(" INFO ")), "{lines:?}");
}

#[test]
fn json_log_lines_parse_with_level_target_and_message() {
    let lines = log_lines("json");
    for l in &lines {
        assert!(!l.contains('\x1b'), "escape code in {l:?}");
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
        assert!(v["timestamp"].is_string(), "{l}");
        assert!(v["level"].is_string(), "{l}");
        assert!(v["target"].is_string(), "{l}");
        assert!(v["fields"]["message"].is_string(), "{l}");
    }
    let started = lines.last().expect("log test set-up");
    let v: serde_json::Value = serde_json::from_str(started).expect("log test set-up");
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["fields"]["message"], "control plane started");
    assert!(v["fields"]["grpc_addr"].is_string(), "{started}");
}
