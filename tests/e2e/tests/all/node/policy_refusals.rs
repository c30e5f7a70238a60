//! Refusals that say why, as an operator sees them through the real
//! `agentmesh-node` binary:
//! - a caller with no grant runs `agentmesh-node call` (and `ping`): the router refuses
//!   the circuit by policy (its muxer answers the relay PERMISSION_DENIED
//!   in the provider's place), the caller names the policy version, its
//!   groups and the service on ONE line (no backtrace, `RUST_BACKTRACE=1`
//!   set) and exits non-zero, and the router counts exactly one refused
//!   circuit: nothing was retried on another route;
//! - a revoked caller's `call` says so on one line;
//! - a provider whose records the router refuses (`not_owner`): `status`
//!   (text and JSON) names the reason and the service.
//!
//! Before: about 2 KB of `Failed to negotiate transport protocol(s) …
//! MALFORMED_MESSAGE`, retried three times, and "records not yet
//! accepted" with no reason.

use super::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use agentmesh_proto::credential::map_to_labels;
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use support::binary::*;
use support::*;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

const CP_BIN: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// Team `payments` owns and may call `payments/*`; team `ops` is granted
/// nothing (so no circuit from ops to a payments member passes the router)
/// and owns nothing.
const POLICY: &str = r#"format = 1
[groups]
payments = { labels = { team = "payments" } }
ops = { labels = { team = "ops" } }
[[owners]]
services = ["payments/*"]
groups = ["payments"]
[[grants]]
from = ["payments"]
to = ["payments/*"]
"#;

const SERVICE: &str = "payments/admin";
const REFUSED: &str = r#"agentmesh_router_policy_circuits_refused_total{reason="not_granted"}"#;

async fn cp_with_policy(dir: &Path) -> Cp {
    let file = dir.join("policy.toml");
    std::fs::write(&file, POLICY).expect("write policy");
    start_cp_with(|c| {
        c.policy = Some(file);
        c.policy_allow_all = false;
    })
    .await
}

/// A member token of `team`: (secret, id).
async fn team_token(cp: &Cp, team: &str) -> (String, String) {
    let labels: BTreeMap<String, String> = [("team".to_string(), team.to_string())].into();
    let r = cp
        .client
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Member as i32,
                labels: map_to_labels(&labels),
                max_uses: 10,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("create token");
    (r.token, r.token_id)
}

/// `agentmesh-node status --json` of the node at `data`, parsed.
async fn status_json(data: &Path) -> serde_json::Value {
    let (ok, out, err) = node_cli(&["status", "--json"], data).await;
    assert!(ok, "{err}");
    serde_json::from_str(&out).expect("status JSON")
}

/// Waits until the node binary at `data` holds a policy.
async fn holds_policy(data: &Path) {
    eventually("the caller holds the policy", || async {
        // A string: 64-bit ids are strings in the status JSON.
        let v = status_json(data).await["policy_version"]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok());
        (v >= Some(1)).then_some(())
    })
    .await;
}

/// `agentmesh-node call SERVICE` with `RUST_BACKTRACE=1`, empty stdin:
/// (success, stdout, stderr).
async fn call_once(data: &Path) -> (bool, String, String) {
    let mut child = Command::new(NODE_EXE)
        .args(["call", SERVICE, "--data-dir"])
        .arg(data)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run call");
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"hello\n").await;
    drop(stdin);
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("call ends in time")
        .expect("call output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Asserts `err` is one line, with no backtrace and none of libp2p's
/// nested negotiation text.
fn one_clean_line(err: &str) {
    let err = err.trim_end();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    for noise in ["backtrace", "Caused by", "MALFORMED", "Failed to negotiate"] {
        assert!(!err.contains(noise), "{noise}: {err}");
    }
    assert!(err.starts_with("agentmesh-node: "), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a_grant_gets_one_line_naming_the_policy_and_it_is_not_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path()).await;
    let r = start_router(&cp, "r1").await;
    let (payments, _) = team_token(&cp, "payments").await;
    let (ops, _) = team_token(&cp, "ops").await;
    let backend = echo_backend().await;
    let (provider, _pdir) = spawn_node(&cp, &payments, "spawn provider", |mut c| {
        c.services.expose = vec![(SERVICE.into(), backend)];
        c
    })
    .await;
    // Ready: its record is accepted by the router the caller asks.
    ready(&provider, "provider").await;

    let token = token_file(dir.path(), &ops).await;
    let data = dir.path().join("caller");
    let mut caller = run_node(&cp, &token, &data, &[]);
    socket_ready(&data).await;
    holds_policy(&data).await;
    assert_eq!(r.metric(REFUSED), 0.0, "pre-created at 0");

    let (ok, out, err) = call_once(&data).await;
    assert!(!ok, "a call without a grant succeeded: {out}");
    assert!(out.is_empty(), "{out}");
    one_clean_line(&err);
    println!("the caller says: {err}");
    for says in [
        "refused",
        "access policy (version 1)",
        r#"this caller's groups ["ops"]"#,
        r#"the service "payments/admin""#,
        "not retried",
    ] {
        assert!(err.contains(says), "{says}: {err}");
    }
    // One circuit refused, counted by the router: no retry on another
    // route or provider.
    assert_eq!(r.metric(REFUSED), 1.0, "{err}");

    // `ping` says the same: refused, typed `denied`, why on one line, a
    // failing exit; one more circuit refused, again not retried.
    let (ok, out, err) = node_cli(&["ping", SERVICE, "--count", "1"], &data).await;
    assert!(!ok, "a ping without a grant succeeded: {out}");
    assert!(
        out.starts_with(&format!("{SERVICE} refused (denied): ")),
        "{out}"
    );
    one_clean_line(&err);
    assert!(err.contains("not granted; last: refused (denied)"), "{err}");
    assert!(err.contains(r#"this caller's groups ["ops"]"#), "{err}");
    assert_eq!(r.metric(REFUSED), 2.0, "{err}");
    // Nothing reached the provider.
    let t = http_get(provider.metrics_addr().expect("metrics"), "/metrics")
        .await
        .1;
    assert_eq!(
        metric(
            &t,
            r#"agentmesh_node_calls_total{direction="inbound",result="accepted"}"#
        ),
        0.0
    );
    sigterm(&mut caller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_caller_is_told_so_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path()).await;
    let _r = start_router(&cp, "r1").await;
    let (payments, payments_id) = team_token(&cp, "payments").await;
    let token = token_file(dir.path(), &payments).await;
    let data = dir.path().join("caller");
    let mut caller = run_node(&cp, &token, &data, &[]);
    socket_ready(&data).await;

    let admin = dir.path().join("admin-token");
    std::fs::write(&admin, ADMIN).expect("admin token file");
    let out = tokio::time::timeout(
        DEADLINE,
        Command::new(CP_BIN)
            .args(["token", "revoke", &payments_id, "--reason", "leaked"])
            .args(["--control-plane", &cp.url, "--admin-token-file"])
            .arg(&admin)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("token revoke in time")
    .expect("run token revoke");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The router drops the caller and refuses it again as revoked.
    let err = eventually("the call says the caller is revoked", || async {
        let (ok, _, err) = call_once(&data).await;
        assert!(!ok, "a revoked caller's call succeeded");
        err.to_lowercase().contains("revoked").then_some(err)
    })
    .await;
    one_clean_line(&err);
    println!("the revoked caller says: {err}");
    assert!(err.contains("not ready"), "{err}");
    sigterm(&mut caller).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_refusal_of_records_the_policy_does_not_let_us_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path()).await;
    let r = start_router(&cp, "r1").await;
    let (ops, _) = team_token(&cp, "ops").await;
    let token = token_file(dir.path(), &ops).await;
    let data = dir.path().join("provider");
    let backend = echo_backend().await;
    let expose = format!("{SERVICE}={backend}");
    let mut provider = run_node(&cp, &token, &data, &["--expose", &expose]);
    let router = r.handle.peer_id().to_string();

    let report = eventually("status names the refusal", || async {
        // Nothing answers until the node has its socket up.
        let (ok, out, _) = node_cli(&["status", "--json"], &data).await;
        let j: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        j["records_refused"].as_str().is_some().then_some(j)
    })
    .await;
    assert_eq!(report["ready"], serde_json::Value::Bool(false), "{report}");
    let refused = report["records_refused"].as_str().expect("string");
    for says in [router.as_str(), "not_owner", SERVICE] {
        assert!(refused.contains(says), "{says}: {refused}");
    }
    let readiness = report["readiness"].as_str().expect("readiness");
    assert!(
        readiness.contains("records refused") && readiness.contains("not_owner"),
        "{readiness}"
    );
    let routers = report["routers"].as_array().expect("routers");
    assert!(
        routers.iter().any(|r| r["records_refused"]
            .as_str()
            .is_some_and(|w| w.contains("not_owner") && w.contains(SERVICE))),
        "{report}"
    );

    let (ok, text, err) = node_cli(&["status"], &data).await;
    assert!(ok, "{err}");
    println!("status:\n{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("records "))
        .unwrap_or_else(|| panic!("no records line: {text}"));
    for says in [router.as_str(), "not_owner", SERVICE] {
        assert!(line.contains(says), "{says}: {line}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("readiness") && l.contains("not_owner")),
        "{text}"
    );
    assert!(r.metric(r#"agentmesh_router_catalog_refused_total{reason="not_owner"}"#) >= 1.0);
    sigterm(&mut provider).await;
}
