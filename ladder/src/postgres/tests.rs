use super::*;

/// Whether a missing PostgreSQL fails the test (as in the control plane's
/// storage tests: `CI` set, or `AGENTMESH_REQUIRE_POSTGRES=1`).
fn required() -> bool {
    std::env::var_os("CI").is_some()
        || std::env::var("AGENTMESH_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

/// True (after `SKIPPED:`) when no server can start here and none is required.
fn skip(test: &str) -> bool {
    let Some(why) = unavailable(None) else {
        return false;
    };
    assert!(
        !required(),
        "{test}: {why}; PostgreSQL is required here (CI or AGENTMESH_REQUIRE_POSTGRES=1)"
    );
    eprintln!("SKIPPED: {test}: {why}");
    true
}

/// A real server with its cluster under a temp dir of the test's own.
async fn started() -> (tempfile::TempDir, Postgres) {
    let parent = tempfile::tempdir().expect("tempdir");
    // The server's user must reach the cluster dir: the tempdir is 0700.
    std::fs::set_permissions(
        parent.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let log = parent.path().join("postgres.log");
    let pg = Postgres::start_in(parent.path(), None, &log, Duration::from_secs(120))
        .await
        .expect("start");
    (parent, pg)
}

#[test]
fn the_sqlite_version_is_read_from_the_file_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    let mut header = vec![0u8; 100];
    header[..16].copy_from_slice(b"SQLite format 3\0");
    header[96..100].copy_from_slice(&3_046_001u32.to_be_bytes());
    std::fs::write(&path, &header).expect("write");
    assert_eq!(sqlite_file_version(&path).as_deref(), Some("3.46.1"));
    std::fs::write(&path, b"not a database").expect("write");
    assert_eq!(sqlite_file_version(&path), None);
    assert_eq!(sqlite_file_version(&dir.path().join("missing")), None);
}

#[test]
fn leftovers_of_runs_that_are_gone_are_removed_and_others_kept() {
    let parent = tempfile::tempdir().expect("tempdir");
    let gone = parent.path().join(format!("{DIR_PREFIX}{}", u32::MAX));
    let alive = parent
        .path()
        .join(format!("{DIR_PREFIX}{}", std::process::id()));
    let other = parent.path().join("agentmesh-ladder-pg.x");
    for d in [&gone, &alive, &other] {
        std::fs::create_dir_all(d.join("data")).expect("mkdir");
    }
    // A postmaster.pid naming a process that is not this cluster's server
    // (this test's own pid): never signalled, the dir still removed.
    std::fs::write(
        gone.join("data/postmaster.pid"),
        format!("{}\n", std::process::id()),
    )
    .expect("write");
    let removed = remove_leftovers(parent.path(), |pid| pid == std::process::id());
    assert_eq!(removed, vec![format!("{DIR_PREFIX}{}", u32::MAX)]);
    assert!(!gone.exists() && alive.exists() && other.exists());
}

/// A real server: started, reachable on its port, and, left running as a
/// killed ladder would leave it, stopped and removed by the next run's sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_left_over_server_is_stopped_and_its_cluster_removed() {
    if skip("a_left_over_server_is_stopped_and_its_cluster_removed") {
        return;
    }
    let (parent, pg) = started().await;
    let record = pg.record();
    let dir = PathBuf::from(record.cluster_dir.clone().expect("dir"));
    assert!(
        record
            .version
            .as_deref()
            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit())),
        "{record:?}"
    );
    assert!(pg.url().ends_with(&format!("/{DATABASE}")), "{}", pg.url());
    let server = postmaster_of(&dir).expect("the postmaster runs");
    // A killed ladder runs no destructor: the server and its dir stay.
    std::mem::forget(pg);
    let removed = remove_leftovers(parent.path(), |pid| pid != std::process::id());
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(!dir.exists(), "cluster dir left");
    assert!(
        !Path::new(&format!("/proc/{server}/cmdline")).exists()
            || std::fs::read(format!("/proc/{server}/cmdline")).is_ok_and(|c| c.is_empty()),
        "postmaster {server} still runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_removes_the_cluster() {
    if skip("stop_removes_the_cluster") {
        return;
    }
    let (_parent, pg) = started().await;
    let dir = PathBuf::from(pg.record().cluster_dir.expect("dir"));
    let server = postmaster_of(&dir).expect("the postmaster runs");
    pg.stop().await;
    assert!(!dir.exists(), "cluster dir left");
    assert!(
        std::fs::read(format!("/proc/{server}/cmdline")).map_or(true, |c| c.is_empty()),
        "postmaster {server} still runs"
    );
}
