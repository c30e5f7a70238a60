//! The node binary as an operator runs it: `run` with a token file until
//! its Unix socket says ready, `call` with stdin, the read-only commands
//! (`status`, `services`), and SIGTERM.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{Cp, DEADLINE, socket_readyz};

/// The node binary these tests run.
pub const NODE_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-node");

/// Writes `token` as one line to `dir/token`, as an operator would; returns
/// the file's path.
pub async fn token_file(dir: &Path, token: &str) -> PathBuf {
    let path = dir.join("token");
    tokio::fs::write(&path, format!("{token}\n"))
        .await
        .expect("token file");
    path
}

/// Starts `agentmesh-node run` against `cp` (K = 1 router, a 1 s directory
/// poll), with `extra` flags, its token in `token_file` and its data in
/// `data`; killed if dropped.
pub fn run_node(cp: &Cp, token_file: &Path, data: &Path, extra: &[&str]) -> Child {
    Command::new(NODE_EXE)
        .args(["run", "--control-plane", &cp.url, "--routers", "1"])
        .args(["--directory-interval-secs", "1"])
        .args(extra)
        .arg("--token-file")
        .arg(token_file)
        .arg("--data-dir")
        .arg(data)
        .kill_on_drop(true)
        .spawn()
        .expect("run the node binary")
}

/// Waits (up to [`DEADLINE`]) until the node with its data in `data`
/// answers /readyz with 200 on its Unix socket; returns the socket's path.
pub async fn socket_ready(data: &Path) -> PathBuf {
    let sock = data.join(agentmesh_node::config::SOCKET_FILE);
    let end = Instant::now() + DEADLINE;
    while !socket_readyz(&sock)
        .await
        .is_some_and(|out| out.starts_with("HTTP/1.1 200"))
    {
        assert!(Instant::now() < end, "node binary never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sock
}

/// Runs `agentmesh-node call SERVICE --data-dir DATA` with `input` on stdin
/// (then closed) until it succeeds, up to [`DEADLINE`] (the routers' DHT
/// may not know the record yet), and asserts it printed `input` back (an
/// echo service).
pub async fn call_echo_until_found(data: &Path, service: &str, input: &[u8]) {
    let end = Instant::now() + DEADLINE;
    loop {
        let mut call = Command::new(NODE_EXE)
            .args(["call", service, "--data-dir"])
            .arg(data)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run call");
        let mut stdin = call.stdin.take().expect("stdin");
        stdin.write_all(input).await.expect("stdin");
        drop(stdin);
        let out = call.wait_with_output().await.expect("call output");
        if out.status.success() {
            assert_eq!(out.stdout, input);
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(Instant::now() < end, "call never succeeded: {err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends SIGTERM to `node` and asserts it exits with status 0 within
/// [`DEADLINE`].
pub async fn sigterm(node: &mut Child) {
    let pid = node.id().expect("pid").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(DEADLINE, node.wait())
        .await
        .expect("node exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status}");
}

/// Runs `agentmesh-node ARGS --data-dir DATA` and returns (success, stdout, stderr).
pub async fn node_cli(args: &[&str], data: &Path) -> (bool, String, String) {
    let out = tokio::time::timeout(
        DEADLINE,
        Command::new(NODE_EXE)
            .args(args)
            .arg("--data-dir")
            .arg(data)
            .output(),
    )
    .await
    .expect("the command ends in time")
    .expect("run agentmesh-node");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Asserts the command failed with one line saying no node runs at `data`.
pub async fn assert_no_node(args: &[&str], data: &Path) {
    let (ok, out, err) = node_cli(args, data).await;
    assert!(!ok, "{args:?} succeeded without a node: {out}");
    assert!(out.is_empty(), "{out}");
    let err = err.trim_end();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!("no node is running at {}", data.display())),
        "{err}"
    );
}
