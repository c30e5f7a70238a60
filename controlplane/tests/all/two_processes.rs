//! The control plane on a real PostgreSQL server (a database of its own
//! per test, from `AGENTMESH_TEST_POSTGRES_URL`; skipped with `SKIPPED:`
//! outside CI without one, failed in CI): two control planes starting
//! together on an empty database share one signing key, a single-use token
//! presented to both at once enrolls exactly one member, and `store copy`
//! moves a mesh from SQLite so its member refreshes without enrolling again.

mod common;

use agentmesh_controlplane::{Config, Handle, spawn, store::testing};
use agentmesh_proto::identity::Keypair;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use common::{client, config, token};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh-control-plane");

/// A control plane on the PostgreSQL database `url`, sealing keys with `kek`.
fn pg_config(dir: &std::path::Path, url: &str, kek: &str) -> Config {
    Config {
        db: url.to_string(),
        key_encryption_key: Some(kek.to_string()),
        ..config(dir)
    }
}

fn kek() -> String {
    agentmesh_controlplane::store::Kek::generate_hex()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_starting_together_share_one_key_and_spend_a_token_once() {
    let Some(db) = testing::fresh_database().await else {
        return;
    };
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let kek = kek();
    let (a, b) = tokio::join!(
        spawn(pg_config(dir_a.path(), &db.url, &kek)),
        spawn(pg_config(dir_b.path(), &db.url, &kek))
    );
    let (a, b): (Handle, Handle) = (a.expect("a starts"), b.expect("b starts"));
    let (ka, kb) = (
        client(&a).get_keys().await.expect("a's keys"),
        client(&b).get_keys().await.expect("b's keys"),
    );
    assert_eq!(ka.keys.len(), 1, "{ka:?}");
    assert_eq!(ka, kb, "both serve the one key");
    let body = common::metrics(&a).await;
    let pool = |state: &str| {
        common::metric(
            &body,
            &format!("agentmesh_control_plane_db_pool_connections{{state=\"{state}\"}}"),
        )
    };
    assert_eq!(pool("max"), Some(16.0), "--db-pool-connections default");
    assert!(pool("open").is_some_and(|n| (1.0..=16.0).contains(&n)));

    // One single-use token, presented to both at once by two members.
    let tok = token(&a, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let (ca, cb) = (client(&a), client(&b));
    let (ma, mb) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let (ra, rb) = tokio::join!(ca.enroll(&tok, &ma), cb.enroll(&tok, &mb));
    assert!(
        ra.is_ok() ^ rb.is_ok(),
        "exactly one enrolls: {:?} / {:?}",
        ra.as_ref().map(|_| ()),
        rb.as_ref().map(|_| ())
    );
    let refused = ra.err().or(rb.err()).expect("one refusal");
    let status = refused.status().expect("a gRPC refusal");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("no uses left"), "{status:?}");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_copy_moves_a_member_from_sqlite_and_it_refreshes_without_enrolling() {
    let Some(db) = testing::fresh_database().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path()).await;
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[("team", "a")], 1).await;
    let member = Keypair::generate_ed25519();
    let enrolled = client(&h).enroll(&tok, &member).await.expect("enrolls");
    let cred = enrolled.credential.clone().expect("credential");
    h.shutdown().await;

    // The real binary copies every table; the target's KEK from the environment.
    let kek = kek();
    let sqlite = format!("sqlite://{}", dir.path().join("cp.db").display());
    let out = Command::new(BIN)
        .args(["store", "copy", "--from", &sqlite, "--to", &db.url])
        .env("AGENTMESH_KEY_ENCRYPTION_KEY", &kek)
        .output()
        .await
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("copied 1 rows of nodes"), "{stderr}");
    assert!(stderr.contains("copied 1 rows of signing_keys"), "{stderr}");
    // A second copy into the now full target is refused, naming why.
    let again = Command::new(BIN)
        .args(["store", "copy", "--from", &sqlite, "--to", &db.url])
        .env("AGENTMESH_KEY_ENCRYPTION_KEY", &kek)
        .output()
        .await
        .expect("runs");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("empty"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    let pg_dir = tempfile::tempdir().expect("tempdir");
    let p = spawn(pg_config(pg_dir.path(), &db.url, &kek))
        .await
        .expect("starts on PostgreSQL");
    let c = client(&p);
    assert_eq!(
        c.get_keys().await.expect("keys"),
        enrolled.keys.clone().expect("key set"),
        "the same signing key"
    );
    let refreshed = c
        .refresh(&cred, &member)
        .await
        .expect("the member refreshes on PostgreSQL without enrolling again");
    assert!(refreshed.credential.is_some());
    // The used-up token stayed used up: enrolling another key is refused.
    let other = Keypair::generate_ed25519();
    assert!(c.enroll(&tok, &other).await.is_err());
    // Re-enrolling the same key with its token needs no use: same node.
    let again = c.enroll(&tok, &member).await.expect("re-enrolls");
    assert_eq!(again.node_id, enrolled.node_id);
    p.shutdown().await;
}
