//! Every namespace goes away: on drop, while a test panics, and as a killed
//! run's leftover at the next run; another live run's never does.

use std::path::Path;
use std::time::Duration;

use agentmesh_netns::sweep::NETNS_DIR;
use agentmesh_netns::{NatKind, Prefix, Testbed, testbed_or_skip};

use super::support::*;

fn exists(ns: &str) -> bool {
    Path::new(NETNS_DIR).join(ns).exists()
}

async fn build(tb: &Testbed) {
    let nat = tb.nat("gw", NatKind::EndpointDependent).await.expect("nat");
    tb.host_behind(&nat, "in").await.expect("in");
    tb.public_host("pub").await.expect("pub");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_testbed_removes_its_namespaces_and_their_processes() {
    let Some(tb) = testbed_or_skip("drop_removes").await else {
        return;
    };
    build(&tb).await;
    let h = tb.public_host("runner").await.expect("runner");
    let mut p = h
        .program("sleeper", "sleep")
        .arg("600")
        .spawn()
        .await
        .expect("spawn");
    let pid = p.pid().expect("pid");
    let names = tb.namespaces();
    assert_eq!(names.len(), 5, "internet, gw, in, pub, runner: {names:?}");
    for n in &names {
        assert!(exists(n), "{n}");
        assert_eq!(Prefix::of_namespace(n), Some(tb.prefix()), "{n}");
    }
    let logs = tb.logs_dir().to_path_buf();
    // A developer keeping every run's logs keeps this one's too.
    let keep = std::env::var(agentmesh_netns::KEEP_LOGS_ENV).is_ok_and(|v| v == "1");
    drop(tb);
    for n in &names {
        assert!(!exists(n), "{n} left behind");
    }
    assert_eq!(logs.exists(), keep, "log directory kept only when asked");
    let status = p.wait(DEADLINE).await.expect("the program was killed");
    assert!(!status.success());
    assert!(
        !Path::new("/proc")
            .join(pid.to_string())
            .join("exe")
            .exists()
    );
}

#[test]
fn a_panicking_test_still_removes_its_namespaces_and_keeps_its_logs() {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let panicked = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let Some(tb) = testbed_or_skip("panic_removes").await else {
                tx.send(None).expect("send");
                return;
            };
            build(&tb).await;
            tx.send(Some((tb.namespaces(), tb.logs_dir().to_path_buf())))
                .expect("send");
            panic!("a test failing with its testbed up");
        });
    })
    .join();
    let Some((names, logs)) = rx.recv().expect("recv") else {
        return;
    };
    assert!(panicked.is_err(), "the thread panicked");
    for n in &names {
        assert!(!exists(n), "{n} left behind");
    }
    assert!(
        logs.join("KEEP").exists(),
        "logs kept for whoever reads the failure"
    );
    std::fs::remove_dir_all(&logs).expect("remove kept logs");
}

/// Runs `ip args…` (set-up of the namespaces a crashed run would leave).
fn ip(args: &[&str]) {
    let ok = std::process::Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_leftovers_are_swept_and_a_live_runs_are_not() {
    if let Some(why) = agentmesh_netns::unavailable() {
        if !agentmesh_netns::required() {
            eprintln!("SKIPPED: leftovers_swept: {why}");
            return;
        }
        panic!("leftovers_swept: {why}");
    }
    // A run that will be killed (its pid then dead), and one that stays alive.
    let mut crashed = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let mut live = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let (dead_pid, live_pid) = (crashed.id(), live.id());
    let dead_ns = Prefix::new(dead_pid, 0).namespace("x").expect("name");
    let live_ns = Prefix::new(live_pid, 0).namespace("x").expect("name");
    // Not ours, however close: a wrong separator.
    let stranger = format!("{}_x", Prefix::new(dead_pid, 1));
    for ns in [&dead_ns, &live_ns, &stranger] {
        ip(&["netns", "add", ns]);
    }
    // The run's program, running in its namespace while the run is alive
    // (other tests' sweeps leave it alone until then)...
    let mut orphan = std::process::Command::new("ip")
        .args(["netns", "exec", &dead_ns, "sleep", "600"])
        .spawn()
        .expect("orphan");
    let inode = std::os::unix::fs::MetadataExt::ino(
        &std::fs::metadata(Path::new(NETNS_DIR).join(&dead_ns)).expect("namespace"),
    );
    let end = std::time::Instant::now() + DEADLINE;
    while std::fs::read_link(format!("/proc/{}/ns/net", orphan.id()))
        .is_ok_and(|l| l.to_string_lossy() != format!("net:[{inode}]"))
    {
        assert!(
            std::time::Instant::now() < end,
            "the orphan joined its namespace"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // ... and outliving the run when it is killed.
    crashed.kill().expect("kill");
    crashed.wait().expect("reap");

    let tb = Testbed::new().await.expect("testbed");
    assert!(!exists(&dead_ns), "the dead run's namespace was swept");
    let end = std::time::Instant::now() + DEADLINE;
    while orphan.try_wait().expect("try_wait").is_none() {
        assert!(std::time::Instant::now() < end, "its program was killed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(exists(&live_ns), "a live run's namespace is never touched");
    assert!(
        exists(&stranger),
        "a name that is not ours is never touched"
    );
    drop(tb);
    assert!(exists(&live_ns), "nor when a testbed ends");

    for ns in [&live_ns, &stranger] {
        ip(&["netns", "delete", ns]);
    }
    live.kill().expect("kill");
    live.wait().expect("wait");
}
