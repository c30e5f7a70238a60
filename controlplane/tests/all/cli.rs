//! The real `agentmesh-control-plane` binary: `token create` and serving on
//! both backends, `backup` while serving on SQLite (PostgreSQL is backed up
//! with `pg_dump`), and refusing bad flags with a clear message.

use agentmesh_proto::{credential::peek_claims, identity::Keypair, pb::credential::Role};

use crate::common::{
    self, TestDb,
    binary::{BIN, run, serve},
};

async fn token_create_then_enroll_and_backup_while_serving(db: TestDb) {
    let env = db.binary_env();
    let out = run(
        &[
            "token",
            "create",
            "--db",
            db.url(),
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
        ],
        &env,
    )
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
    assert_eq!(db.count("SELECT COUNT(*) FROM tokens").await, 1);
    let stored = db
        .count(&format!(
            "SELECT COUNT(*) FROM tokens WHERE digest = {}",
            db.blob(token.as_bytes())
        ))
        .await;
    assert_eq!(stored, 0);

    // A control plane (the real binary) serving that database; its log
    // names the bound addresses.
    let served = serve(db.url(), &[], &env).await;
    // The binary's /metrics carries the process-wide gauges: jemalloc's
    // (read at the scrape, so resident bytes are never 0) and the watchdog's.
    let (status, body) = common::http_get(served.http_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        common::metric(&body, "agentmesh_runtime_allocator_resident_bytes ")
            .is_some_and(|v| v > 0.0),
        "{body}"
    );
    assert!(body.contains("agentmesh_runtime_stalls_total"), "{body}");
    let client = agentmesh_controlplane::Client::new(agentmesh_controlplane::ClientConfig {
        url: served.url.clone(),
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

    // SQLite: a backup while it serves, then a second binary serves the copy.
    let copy = db.dir().join("copy.db");
    if db.sqlite_path().is_some() {
        let to = copy.to_str().expect("utf8");
        let out = run(&["backup", "--db", db.url(), "--to", to], &env).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(&["backup", "--db", db.url(), "--to", to], &env).await;
        assert!(!out.status.success(), "refuses to overwrite");
    }
    // SIGTERM: a graceful stop with exit status 0.
    let status = served.terminate().await;
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    if db.sqlite_path().is_none() {
        return;
    }
    let copy_dir = tempfile::tempdir().expect("tempdir");
    std::fs::rename(&copy, copy_dir.path().join("cp.db")).expect("move copy");
    // The copy's signing keys are sealed: it serves with the same
    // key-encryption key, which the backup does not hold.
    std::fs::copy(
        db.dir().join("cp.db.kek"),
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

on_both!(
    #[tokio::test]
    token_create_then_enroll_and_backup_while_serving,
);

/// `token create --out FILE` writes the token to a new file of mode 0600
/// (not a shell redirect's 0644), and refuses an existing file before it
/// mints anything unless `--overwrite` is given.
#[tokio::test]
async fn token_create_out_writes_a_private_file_and_overwrites_only_when_asked() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = common::TestDb::new(common::Backend::Sqlite)
        .await
        .expect("sqlite");
    let env = db.binary_env();
    let out_file = db.dir().join("member.token");
    let path = out_file.to_str().expect("utf8");
    let create = |extra: &'static [&'static str]| {
        let mut args = vec![
            "token",
            "create",
            "--db",
            db.url(),
            "--kind",
            "bootstrap",
            "--role",
            "member",
            "--out",
            path,
        ];
        args.extend_from_slice(extra);
        args
    };
    let out = run(&create(&[]), &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "the token is not printed");
    assert!(
        stderr.contains("written to") && stderr.contains(path),
        "{stderr}"
    );
    let token = std::fs::read_to_string(&out_file).expect("token file");
    assert!(token.trim().starts_with("amt_"), "{token}");
    let mode = std::fs::metadata(&out_file)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(db.count("SELECT COUNT(*) FROM tokens").await, 1);

    // Again: refused, nothing minted, the file as it was.
    let out = run(&create(&[]), &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "overwrote {path}");
    assert!(
        stderr.contains("already exists") && stderr.contains(path),
        "{stderr}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM tokens").await,
        1,
        "no token minted"
    );
    assert_eq!(std::fs::read_to_string(&out_file).expect("read"), token);

    // Asked: replaced, still 0600.
    let out = run(&create(&["--overwrite"]), &env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = std::fs::read_to_string(&out_file).expect("read");
    assert_ne!(again, token);
    let mode = std::fs::metadata(&out_file)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(db.count("SELECT COUNT(*) FROM tokens").await, 2);
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
        let out = run(args, &[]).await;
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(!missing.exists(), "a failed backup creates no database");
}

#[test]
fn version_prints_the_version_and_the_git_commit() {
    let out = std::process::Command::new(BIN)
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
