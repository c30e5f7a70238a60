//! The supervisor over real sockets: a long-lived task that dies outside a
//! drain or shutdown is named by the handle, `/readyz` stops answering
//! ready and names it, and the binary exits non-zero saying which task.

use std::net::SocketAddr;

use agentmesh_proto::pb::credential::Role;
use agentmesh_testkit::{DEADLINE, TestRouter, http_get};

use crate::support::cp::start_cp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_event_loop_is_named_and_readyz_turns_not_ready() {
    let cp = start_cp().await;
    let router = TestRouter::start(&cp, &[], |c| {
        c.metrics_addr = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let http: SocketAddr = router.handle.metrics_addr().expect("metrics listener");
    assert_eq!(http_get(http, "/readyz").await.0, 200);
    assert!(router.handle.failed().borrow().is_none());

    assert!(router.handle.stop_task_for_test("event_loop"));
    let mut failed = router.handle.failed();
    tokio::time::timeout(DEADLINE, failed.wait_for(Option::is_some))
        .await
        .expect("failure reported in time")
        .expect("failed channel");
    let failure = failed.borrow().clone().expect("failure");
    assert_eq!(failure.task, "event_loop");
    assert_eq!(failure.reason, "aborted");
    assert!(!*router.handle.ready().borrow());
    let (status, body) = http_get(http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("not ready: router task event_loop stopped"),
        "{body}"
    );
    assert!(!router.handle.stop_task_for_test("no_such_task"));
    router.handle.shutdown().await;
    cp.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_non_zero_naming_the_dead_task() {
    let cp = start_cp().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("router.token");
    std::fs::write(&token_file, format!("{}\n", cp.token(Role::Router).await)).expect("token");
    let child = crate::support::router_binary(&cp.url, &token_file, dir.path())
        .args(["--lease-interval-secs", "1"])
        .args(["--test-stop-task-when-ready", "trim"])
        .spawn()
        .expect("start router binary");
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("router exits in time")
        .expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "non-zero exit: {:?}\n{log}",
        out.status
    );
    assert!(
        log.contains("router task trim stopped: aborted"),
        "the exit names the task:\n{log}"
    );
    cp.handle.shutdown().await;
}
