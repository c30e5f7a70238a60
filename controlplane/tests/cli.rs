//! The real `agentmesh-control-plane` binary: `token create`, `backup`,
//! serving, and refusing bad flags with a clear message.

mod common;

use std::{process::Stdio, time::Duration};

use agentmesh_proto::{credential::peek_claims, identity::Keypair, pb::credential::Role};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh-control-plane");

async fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("binary finishes within 60 s")
        .expect("binary runs")
}

#[tokio::test]
async fn token_create_then_enroll_and_backup_while_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("cp.db").display());
    let out = run(&[
        "token",
        "create",
        "--db",
        &db,
        "--kind",
        "bootstrap",
        "--role",
        "router",
        "--label",
        "zone=eu",
        "--max-uses",
        "2",
        "--ttl-secs",
        "600",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string();
    assert!(token.starts_with("amt_"), "{token}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("shown once"));
    // Only the digest is stored.
    let stored = common::sql_count(
        dir.path(),
        &format!("SELECT COUNT(*) FROM tokens WHERE CAST(digest AS TEXT) = '{token}'"),
    );
    assert_eq!(stored, 0);

    // A control plane (the real binary) serving that database; its log
    // names the bound addresses.
    let common::Served {
        mut child,
        url,
        http_addr,
    } = common::serve_binary(&[
        "--db",
        &db,
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ])
    .await;
    // The binary's /metrics carries the process-wide gauges: jemalloc's
    // (read at the scrape, so resident bytes are never 0) and the watchdog's.
    let (status, body) = common::http_get(http_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        common::metric(&body, "agentmesh_runtime_allocator_resident_bytes ")
            .is_some_and(|v| v > 0.0),
        "{body}"
    );
    assert!(body.contains("agentmesh_runtime_stalls_total"), "{body}");
    let client = agentmesh_controlplane::Client::new(agentmesh_controlplane::ClientConfig {
        url: url.clone(),
        ..Default::default()
    })
    .expect("client");
    let k = Keypair::generate_ed25519();
    let e = client
        .enroll(&token, &k)
        .await
        .expect("enrolls with the CLI token");
    let claims = peek_claims(e.credential.as_ref().expect("cred")).expect("claims");
    assert_eq!(claims.role, Role::Router as i32);
    assert_eq!(claims.labels.len(), 1);
    assert_eq!(
        (
            claims.labels[0].key.as_str(),
            claims.labels[0].value.as_str()
        ),
        ("zone", "eu")
    );

    // Backup while it serves, then a second binary serves the copy.
    let copy = dir.path().join("copy.db");
    let out = run(&["backup", "--db", &db, "--to", copy.to_str().expect("utf8")]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["backup", "--db", &db, "--to", copy.to_str().expect("utf8")]).await;
    assert!(!out.status.success(), "refuses to overwrite");
    // SIGTERM: a graceful stop with exit status 0.
    let pid = child.id().expect("pid").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill runs");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("stops within 60 s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    let copy_dir = tempfile::tempdir().expect("tempdir");
    std::fs::rename(&copy, copy_dir.path().join("cp.db")).expect("move copy");
    // The copy's signing keys are sealed: it serves with the same
    // key-encryption key, which the backup does not hold.
    std::fs::copy(
        dir.path().join("cp.db.kek"),
        copy_dir.path().join("cp.db.kek"),
    )
    .expect("the key-encryption key");
    let h = common::start(copy_dir.path()).await;
    let c = common::client(&h);
    let again = c
        .enroll(&token, &k)
        .await
        .expect("the copy knows the node and token");
    assert_eq!(again.node_id, e.node_id);
    h.shutdown().await;
}

#[tokio::test]
async fn bad_flags_fail_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("cp.db").display());
    let missing = dir.path().join("missing.db");
    let missing_db = format!("sqlite://{}", missing.display());
    let to = dir.path().join("never.db");
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "backup",
                "--db",
                &missing_db,
                "--to",
                to.to_str().expect("utf8"),
            ],
            "does not exist",
        ),
        (
            &[
                "--db",
                "postgres://x",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ],
            "--key-encryption-key-file",
        ),
        (
            &[
                "--grpc-addr",
                "0.0.0.0:0",
                "--http-addr",
                "127.0.0.1:0",
                "--db",
                &db,
            ],
            "--insecure",
        ),
        (
            &[
                "--key-grace-secs",
                "10",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--db",
                &db,
            ],
            "--key-grace-secs",
        ),
        (
            &[
                "token",
                "create",
                "--db",
                &db,
                "--kind",
                "bootstrap",
                "--role",
                "member",
                "--max-uses",
                "0",
            ],
            "max_uses",
        ),
    ];
    for (args, needle) in cases {
        let out = run(args).await;
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(!missing.exists(), "a failed backup creates no database");
}

#[test]
fn version_prints_the_version_and_the_git_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentmesh-control-plane"))
        .arg("--version")
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "agentmesh-control-plane {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            agentmesh_runtime::cli::checkout_commit(std::path::Path::new(env!(
                "CARGO_MANIFEST_DIR"
            )))
        )
    );
}
