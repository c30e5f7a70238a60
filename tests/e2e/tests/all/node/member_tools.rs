//! The member's tools, through the real `agentmesh-node` binary:
//! - `ping SERVICE` against a running node (a probe the provider answers
//!   without touching its backend): granted (the route names the
//!   router the circuit went through, a round trip, text and `--json`),
//!   refused by the provider with its typed reason (one line, non-zero
//!   exit), and the call-duration histogram the pings land in, with a
//!   service past `--max-call-metric-services` counted as `other`;
//! - `call --wait-ready-secs` started before the node exists, succeeding
//!   once the node is up; and timing out with one clear line when no node
//!   comes (as does `wait`);
//! - `status --json`: every 64-bit id a string, labels and groups; the text
//!   with RFC 3339 times.
//!
//! A ping refused by a router's policy is in `policy_refusals.rs`; one
//! through a transit route in `mesh.rs`.

use super::support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use support::binary::*;
use support::*;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

/// `agentmesh-node ping ARGS --data-dir DATA` with `RUST_BACKTRACE=1`:
/// (success, stdout, stderr).
async fn ping(args: &[&str], data: &Path) -> (bool, String, String) {
    let out = tokio::time::timeout(
        DEADLINE,
        Command::new(NODE_EXE)
            .arg("ping")
            .args(args)
            .arg("--data-dir")
            .arg(data)
            .env("RUST_BACKTRACE", "1")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ping ends in time")
    .expect("run ping");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_names_route_round_trip_and_verdict_and_pings_land_in_the_histogram() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let quiet = SilentBackend::start().await;
    let quiet_addr = quiet.addr;
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut c| {
        c.services.expose = vec![
            ("echo".into(), backend),
            // Counts the connections it gets: a ping must make none.
            ("quiet".into(), quiet_addr),
            // Only members labelled team=nobody may call it: the provider
            // refuses ours.
            ("guarded".into(), backend),
        ];
        c.services.allow = vec!["guarded=label:team=nobody".parse().expect("allow rule")];
        c
    })
    .await;
    ready(&provider, "provider").await;
    // The caller is configured to call `echo` (a --forward), and gives one
    // service a label of its own in the histogram.
    let (caller, cdir) = spawn_node(&cp, &member, "spawn caller", |mut c| {
        c.local.forward = vec![("127.0.0.1:0".parse().expect("addr"), "echo".into())];
        c.calls.max_metric_services = 1;
        c
    })
    .await;
    ready(&caller, "caller").await;
    let data = cdir.path();
    let router = r.handle.peer_id().to_string();
    let provider_id = provider.peer_id().to_string();

    // Granted, three times: one line each, naming provider, router, path.
    let (ok, out, err) = eventually("a granted ping", || async move {
        let (ok, out, err) = ping(&["echo", "--count", "3", "--interval-ms", "10"], data).await;
        ok.then_some((ok, out, err))
    })
    .await;
    assert!(ok, "{err}");
    println!("ping says:\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for l in &lines {
        assert!(
            l.starts_with(&format!(
                "echo granted by {provider_id} via router {router} (relayed) in "
            )),
            "{l}"
        );
        assert!(l.ends_with(" ms)"), "{l}");
    }
    // The same as JSON: one object per attempt.
    let (ok, out, err) = ping(&["echo", "--count", "1", "--json"], data).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim_end()).expect("ping JSON");
    assert_eq!(v["verdict"], "granted", "{v}");
    assert_eq!(v["route"]["path"], "relayed", "{v}");
    assert_eq!(v["route"]["router"], router.as_str(), "{v}");
    assert_eq!(v["route"]["transit"], false, "{v}");
    assert_eq!(v["route"]["provider"], provider_id.as_str(), "{v}");
    let (rtt, setup) = (
        v["rtt_ms"].as_f64().expect("rtt"),
        v["setup_ms"].as_f64().expect("setup"),
    );
    assert!(rtt > 0.0 && rtt <= setup, "{v}");

    // A ping is judged as a call but never reaches the backend: the
    // provider answers it itself (counted as a probe).
    let (ok, out, err) = ping(&["quiet", "--count", "2"], data).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.starts_with("quiet granted by "), "{out}");
    assert_eq!(quiet.accepted(), 0, "the backend saw a connection");
    let (_, pm) = http_get(provider.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &pm,
            r#"agentmesh_node_calls_total{direction="inbound",result="probe"}"#
        ) >= 2.0,
        "{pm}"
    );

    // Refused by the provider (its --allow): the typed reason, one line on
    // stderr, a failing exit, no backtrace.
    let (ok, out, err) = ping(&["guarded", "--count", "1"], data).await;
    assert!(!ok, "a refused ping succeeded: {out}");
    assert!(
        out.starts_with("guarded refused (not_allowed): "),
        "{out}\n{err}"
    );
    let err = err.trim_end();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!err.contains("backtrace"), "{err}");
    assert!(
        err.starts_with(
            "agentmesh-node: ping guarded: 1 of 1 not granted; last: refused (not_allowed): "
        ),
        "{err}"
    );
    // Nobody provides it: failed, with its reason.
    let (ok, out, _) = ping(&["nosuch", "--count", "1", "--json"], data).await;
    assert!(!ok);
    let v: serde_json::Value = serde_json::from_str(out.trim_end()).expect("ping JSON");
    assert_eq!(v["verdict"], "failed", "{v}");
    assert_eq!(v["reason"], "no_providers", "{v}");

    // The histogram: `echo` (configured) by name, the rest past the cap
    // of one as `other`.
    let (_, m) = http_get(caller.metrics_addr().expect("metrics"), "/metrics").await;
    let count = |service: &str, result: &str| {
        metric(
            &m,
            &format!(
                r#"agentmesh_node_call_duration_seconds_count{{service="{service}",result="{result}"}}"#
            ),
        )
    };
    assert!(count("echo", "ok") >= 4.0, "{m}");
    assert!(
        m.contains(
            r#"agentmesh_node_call_duration_seconds_count{service="echo",result="denied"} 0"#
        ),
        "pre-created: {m}"
    );
    assert_eq!(count("other", "refused"), 1.0, "{m}");
    assert_eq!(count("other", "no_providers"), 1.0, "{m}");
    assert!(!m.contains(r#"service="guarded""#), "{m}");
    assert!(!m.contains(r#"service="nosuch""#), "{m}");

    caller.shutdown().await;
    provider.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_wait_ready_started_before_the_node_calls_once_it_is_up() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut c| {
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    ready(&provider, "provider").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("caller");
    // The call starts first: no data dir, no socket, no node yet.
    let mut call = Command::new(NODE_EXE)
        .args(["call", "echo", "--wait-ready-secs", "60", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run call");
    let mut stdin = call.stdin.take().expect("stdin");
    stdin.write_all(b"before the node\n").await.expect("stdin");
    drop(stdin);
    // Still waiting, not failed: no node to find.
    assert!(call.try_wait().expect("try_wait").is_none());
    let token = token_file(dir.path(), &member).await;
    let mut node = run_node(&cp, &token, &data, &[]);
    let out = tokio::time::timeout(DEADLINE, call.wait_with_output())
        .await
        .expect("the call ends once the node is ready")
        .expect("call output");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"before the node\n");

    // The status JSON of that node: 64-bit ids as strings, labels, groups.
    let (ok, json, err) = node_cli(&["status", "--json"], &data).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    for id in [
        "policy_version",
        "policy_epoch",
        "revocations_epoch",
        "revocations_generation",
    ] {
        let s = v[id]
            .as_str()
            .unwrap_or_else(|| panic!("{id} is not a string: {json}"));
        s.parse::<u64>()
            .unwrap_or_else(|e| panic!("{id} {s:?} is not a u64: {e}"));
    }
    assert!(
        v["policy_version"].as_str() != Some("0"),
        "holds a policy: {json}"
    );
    assert!(v["labels"].is_object(), "{json}");
    assert!(v["groups"].is_array(), "{json}");
    assert!(
        v["node_id"].as_str().is_some_and(|s| !s.is_empty()),
        "{json}"
    );
    assert_eq!(v["role"], "member", "{json}");
    assert!(
        v["credential_expires_in_secs"]
            .as_i64()
            .is_some_and(|s| s > 0),
        "{json}"
    );
    // The text: RFC 3339 and how long ago / until.
    let (ok, text, err) = node_cli(&["status"], &data).await;
    assert!(ok, "{err}");
    let cred = text
        .lines()
        .find(|l| l.starts_with("credential  expires at "))
        .unwrap_or_else(|| panic!("{text}"));
    // `expires at 2025-…Z (in 59m58s), issued at 2025-…Z (2s ago)`.
    let (expires, issued) = cred
        .split_once(", issued at ")
        .unwrap_or_else(|| panic!("{cred}"));
    assert!(
        expires.contains("T") && expires.contains("Z (in "),
        "{cred}"
    );
    assert!(
        issued.contains("T") && (issued.ends_with(" ago)") || issued.ends_with("Z (now)")),
        "{cred}"
    );
    assert!(text.contains("\ngroups      "), "{text}");

    sigterm(&mut node).await;
    provider.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test]
async fn waiting_for_a_node_that_never_comes_ends_with_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("nobody");
    let started = std::time::Instant::now();
    let mut call = Command::new(NODE_EXE)
        .args(["call", "echo", "--wait-ready-secs", "1", "--data-dir"])
        .arg(&data)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run call");
    let status = tokio::time::timeout(DEADLINE, call.wait())
        .await
        .expect("the wait is bounded")
        .expect("wait");
    assert!(!status.success());
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut call.stderr.take().expect("stderr"), &mut err)
        .await
        .expect("stderr");
    let err = err.trim_end();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with(&format!(
            "agentmesh-node: call echo: the node at {} was not ready within 1s: no node listens on ",
            data.display()
        )),
        "{err}"
    );
    // `wait` says the same.
    let (ok, _, err) = node_cli(&["wait", "--timeout-secs", "1"], &data).await;
    assert!(!ok);
    assert!(
        err.trim_end().starts_with(&format!(
            "agentmesh-node: the node at {} was not ready within 1s",
            data.display()
        )),
        "{err}"
    );
    // Both gave up at their deadline, not at the test's.
    assert!(started.elapsed() < Duration::from_secs(30));
}
