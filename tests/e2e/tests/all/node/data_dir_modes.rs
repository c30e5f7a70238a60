//! The node and router binaries refuse to start on secrets others may
//! write, as ssh's `StrictModes` does: a world-writable data dir, a
//! world-writable `keys.pb` in a private one (the key set the node trusts
//! credentials with), a router key in a world-writable dir. Each exits with
//! an error naming the path and its mode; a key others may only read is
//! set back to 0600 and the program runs.

use super::support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Stdio;

use agentmesh_proto::pb::credential::Role;
use support::binary::{NODE_EXE, token_file};
use support::{DEADLINE, start_cp};
use tokio::process::Command;

const ROUTER_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-router");

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
}

/// Runs `cmd` to its exit (within the deadline): (success, stderr).
async fn exit_of(mut cmd: Command) -> (bool, String) {
    let out = tokio::time::timeout(
        DEADLINE,
        cmd.env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the program exits instead of starting")
    .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn node_run(cp_url: &str, tokens: &Path, data: &Path) -> Command {
    let mut c = Command::new(NODE_EXE);
    c.args(["run", "--control-plane", cp_url, "--routers", "1"])
        .arg("--token-file")
        .arg(tokens)
        .arg("--data-dir")
        .arg(data);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_refuses_a_data_dir_or_key_set_others_may_write() {
    let cp = start_cp().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), &cp.token(Role::Member).await).await;

    let data = dir.path().join("open");
    std::fs::create_dir(&data).expect("mkdir");
    chmod(&data, 0o777);
    let (ok, err) = exit_of(node_run(&cp.url, &tokens, &data)).await;
    assert!(!ok, "started on a world-writable data dir: {err}");
    assert!(
        err.contains(&data.display().to_string())
            && err.contains("0777")
            && err.contains("world-writable"),
        "{err}"
    );
    assert!(!data.join("node.key").exists(), "nothing was written in it");

    // A private dir whose cached key set anyone may rewrite.
    let data = dir.path().join("planted");
    std::fs::create_dir(&data).expect("mkdir");
    chmod(&data, 0o700);
    let keys = data.join("keys.pb");
    std::fs::write(&keys, b"").expect("plant");
    chmod(&keys, 0o666);
    let (ok, err) = exit_of(node_run(&cp.url, &tokens, &data)).await;
    assert!(!ok, "trusted a world-writable keys.pb: {err}");
    assert!(
        err.contains(&keys.display().to_string()) && err.contains("0666"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_refuses_a_key_in_a_dir_others_may_write_and_tightens_a_readable_key() {
    let cp = start_cp().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("router.token");
    std::fs::write(&tokens, cp.token(Role::Router).await).expect("token");
    let router = |key: &Path| {
        let mut c = Command::new(ROUTER_EXE);
        c.args(["--control-plane", &cp.url])
            .arg("--token-file")
            .arg(&tokens)
            .arg("--key-path")
            .arg(key)
            .args(["--listen", "/ip4/127.0.0.1/tcp/0"]);
        c
    };

    let open = dir.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    chmod(&open, 0o777);
    let (ok, err) = exit_of(router(&open.join("router.key"))).await;
    assert!(!ok, "started with its key in a world-writable dir: {err}");
    assert!(
        err.contains(&open.display().to_string()) && err.contains("0777"),
        "{err}"
    );
    assert!(!open.join("router.key").exists(), "no key was made there");

    // A key someone made readable: set back to 0600 on start.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).expect("mkdir");
    chmod(&private, 0o700);
    let key = private.join("router.key");
    let kp = libp2p::identity::Keypair::generate_ed25519();
    std::fs::write(&key, kp.to_protobuf_encoding().expect("encode")).expect("key");
    chmod(&key, 0o644);
    let mut child = router(&key)
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("router");
    let peer = kp.public().to_peer_id().to_string();
    let started = agentmesh_testkit::scan_stderr(&mut child, "the router started", |l| {
        l.contains("router started").then(|| l.to_string())
    })
    .await;
    assert!(
        started.contains(&peer),
        "runs with the key it was given: {started}"
    );
    assert_eq!(mode(&key), 0o600, "the key is private again");
}
