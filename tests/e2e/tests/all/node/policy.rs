//! The member enforces the access policy (issue 18): default deny at the
//! provider (`NOT_GRANTED`, counted), a grant added lets the call through,
//! a grant removed closes the live call, a caller reaches only the provider
//! that owns a service and never an impostor exposing the same name, and a
//! policy push from a peer that is not an attached router is refused unread.
//!
//! The control plane starts with `--policy FILE` (in process, its config's
//! `policy`); changes go through the real `agentmesh-control-plane policy
//! apply FILE`. Until routers push, members learn a new version from their
//! directory refresh (1 s here): the tests wait for behaviour, never time.

use super::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentmesh_node::{CallError, NodeHandle};
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{Purpose, auth_response};
use agentmesh_proto::protocols::POLICY;
use futures::AsyncWriteExt as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const CP_BIN: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// Every member provides anything and may call only `other`: circuits
/// between members pass the router (a member of the group may provide
/// `other`), so a call of `echo` is refused by the provider itself (with no
/// grant at all the router refuses the circuit first: router::policy).
const DENY: &str = r#"format = 1
[groups]
members = { role = "member" }
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["members"]
to = ["other"]
"#;

/// As [`DENY`], plus members may call `echo`.
const GRANT_ECHO: &str = r#"format = 1
[groups]
members = { role = "member" }
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["members"]
to = ["echo", "other"]
"#;

/// Only team `db` may provide `db`; every member may call it.
const DB_OWNED: &str = r#"format = 1
[groups]
members = { role = "member" }
db_team = { labels = { team = "db" } }
[[owners]]
services = ["db"]
groups = ["db_team"]
[[grants]]
from = ["members"]
to = ["db"]
"#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write policy");
    p
}

/// A control plane started with `--policy` = `text`.
async fn cp_with_policy(dir: &Path, text: &str) -> Cp {
    let file = write(dir, "start.toml", text);
    start_cp_with(|c| {
        c.policy = Some(file);
        c.policy_allow_all = false;
    })
    .await
}

/// `agentmesh-control-plane policy apply FILE` against `cp`, as an operator runs it.
async fn apply(cp: &Cp, dir: &Path, name: &str, text: &str) {
    let file = write(dir, name, text);
    let token = write(dir, "admin-token", ADMIN);
    let out = tokio::process::Command::new(CP_BIN)
        .arg("policy")
        .arg("apply")
        .arg(&file)
        .args(["--control-plane", &cp.url, "--admin-token-file"])
        .arg(&token)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DEADLINE, out)
        .await
        .expect("policy apply in time")
        .expect("run policy apply");
    assert!(
        out.status.success(),
        "policy apply {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn metrics(node: &NodeHandle) -> String {
    http_get(node.metrics_addr().expect("metrics addr"), "/metrics")
        .await
        .1
}

async fn node_metric(node: &NodeHandle, series: &str) -> f64 {
    metric(&metrics(node).await, series)
}

/// Waits until `node` holds policy version `version` or later.
async fn holds(node: &NodeHandle, version: u64) {
    agentmesh_testkit::eventually(&format!("policy version {version}"), || async {
        (node_metric(node, "agentmesh_node_policy_version").await >= version as f64).then_some(())
    })
    .await;
}

const NOT_GRANTED: &str = r#"agentmesh_node_calls_total{direction="inbound",result="not_granted"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_deny_then_a_grant_lets_calls_through_and_its_removal_closes_the_live_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path(), DENY).await;
    let _r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(&cp, &member, |c| c, |c| c).await;
    holds(&a, 1).await;
    holds(&b, 1).await;

    // Default deny: no grant, so the provider refuses with NOT_GRANTED.
    let refused = agentmesh_testkit::eventually("a refusal by the provider", || async {
        match a.call("echo").await {
            Err(e @ CallError::Failed { refused: true, .. }) => Some(e.to_string()),
            Err(_) => None,
            Ok(_) => panic!("a call without a grant went through"),
        }
    })
    .await;
    assert!(refused.contains("grants none"), "{refused}");
    assert!(node_metric(&b, NOT_GRANTED).await >= 1.0);
    assert_eq!(
        node_metric(
            &b,
            r#"agentmesh_node_calls_total{direction="inbound",result="accepted"}"#
        )
        .await,
        0.0
    );

    // The grant added: calls go through once both members hold version 2.
    apply(&cp, dir.path(), "grant.toml", GRANT_ECHO).await;
    holds(&a, 2).await;
    holds(&b, 2).await;
    let mut s = call_until_found(&a, "echo").await;
    round_trip(&mut s, 4096).await;

    // A live call, then the grant removed: the provider closes it.
    let mut live = call_until_found(&a, "echo").await;
    live.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    live.read_exact(&mut buf)
        .await
        .expect("echo before the change");
    assert_eq!(&buf, b"ping");
    let refused_before = node_metric(&b, NOT_GRANTED).await;
    apply(&cp, dir.path(), "deny.toml", DENY).await;
    holds(&b, 3).await;
    let ended = tokio::time::timeout(DEADLINE, live.read(&mut buf)).await;
    assert!(
        matches!(ended, Ok(Ok(0)) | Ok(Err(_))),
        "the live call was not closed: {ended:?}"
    );
    assert_eq!(
        node_metric(
            &b,
            r#"agentmesh_node_policy_calls_closed_total{reason="not_granted"}"#
        )
        .await,
        1.0
    );
    // And new calls are refused again.
    holds(&a, 3).await;
    let e = a.call("echo").await.expect_err("refused after the removal");
    assert_eq!(e.result_label(), "refused", "{e}");
    assert!(node_metric(&b, NOT_GRANTED).await > refused_before);
}

/// A backend that writes `tag` to every connection and closes it,
/// counting connections.
async fn tag_backend(tag: &'static str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let _ = s.write_all(tag.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (addr, n)
}

fn team(name: &str) -> BTreeMap<String, String> {
    [("team".to_string(), name.to_string())].into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_reaches_only_the_owner_of_a_service_never_an_impostor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path(), DB_OWNED).await;
    let _r = start_router(&cp, "r1").await;
    let db_team = cp.token_labelled(Role::Member, &team("db")).await;
    let web_team = cp.token_labelled(Role::Member, &team("web")).await;
    let (owner_backend, owner_hits) = tag_backend("owner").await;
    let (impostor_backend, impostor_hits) = tag_backend("impostor").await;
    let (owner, _odir) = spawn_node(&cp, &db_team, "spawn owner", |mut c| {
        c.services.expose = vec![("db".into(), owner_backend)];
        c
    })
    .await;
    let (impostor, _idir) = spawn_node(&cp, &web_team, "spawn impostor", |mut c| {
        c.services.expose = vec![("db".into(), impostor_backend)];
        c
    })
    .await;
    let (caller, _cdir) = spawn_node(&cp, &web_team, "spawn caller", |c| c).await;
    ready(&owner, "owner").await;
    ready(&caller, "caller").await;
    holds(&caller, 1).await;
    // The impostor's record reached the router (or the router refused it):
    // either way it published before the calls below.
    agentmesh_testkit::eventually("the impostor published", || async {
        let t = metrics(&impostor).await;
        let answered = metric(&t, r#"agentmesh_node_publishes_total{result="ok"}"#)
            + metric(&t, r#"agentmesh_node_publishes_total{result="error"}"#);
        (answered >= 1.0).then_some(())
    })
    .await;
    let impostor_listed =
        node_metric(&impostor, r#"agentmesh_node_publishes_total{result="ok"}"#).await >= 1.0;

    for i in 0..10 {
        let mut s = call_until_found(&caller, "db").await;
        assert_eq!(s.route().provider, owner.peer_id(), "call {i}");
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"owner", "call {i}");
    }
    assert_eq!(owner_hits.load(Ordering::SeqCst), 10);
    assert_eq!(
        impostor_hits.load(Ordering::SeqCst),
        0,
        "the impostor's backend was reached"
    );
    let t = metrics(&impostor).await;
    for result in [
        "accepted",
        "not_granted",
        "not_allowed",
        "malformed",
        "bad_credential",
    ] {
        let series =
            format!(r#"agentmesh_node_calls_total{{direction="inbound",result="{result}"}}"#);
        assert_eq!(
            metric(&t, &series),
            0.0,
            "the impostor saw a call stream: {series}"
        );
    }
    if impostor_listed {
        // The router served its record: the caller skipped it, counted.
        let skipped = node_metric(
            &caller,
            r#"agentmesh_node_providers_skipped_total{reason="not_owner"}"#,
        )
        .await;
        assert!(skipped >= 10.0, "skipped {skipped}");
    }
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A protobuf length-delimited field `field` holding `bytes`.
fn field(field: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push((field << 3) | 2);
    varint(bytes.len(), out);
    out.extend_from_slice(bytes);
}

/// One `PolicyPush` frame as an attacker writes it by hand (a varint
/// length, then the message: `policy` = `SignedPolicy{document, signature}`).
fn forged_push_frame(document: &[u8], signature: &[u8]) -> Vec<u8> {
    let mut signed = Vec::new();
    field(1, document, &mut signed);
    field(2, signature, &mut signed);
    let mut push = Vec::new();
    field(1, &signed, &mut push);
    let mut out = Vec::new();
    varint(push.len(), &mut out);
    out.extend_from_slice(&push);
    out
}

/// A member (not a router we are attached to) connects to a node through
/// the router and pushes a forged policy: dropped unread, counted, and the
/// node's policy stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_push_from_a_peer_that_is_not_an_attached_router_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = cp_with_policy(dir.path(), GRANT_ECHO).await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |mut c| {
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    ready(&b, "b").await;
    holds(&b, 1).await;

    let mut x = TestPeer::with_key(Keypair::generate_ed25519());
    let cred = cp
        .client
        .enroll(&member, &x.key)
        .await
        .expect("enroll x")
        .credential
        .expect("credential");
    let router = r.handle.peer_id();
    let raddr = r.handle.listen_addrs()[0].clone();
    x.connect(router, raddr.clone()).await;
    let admitted = x.auth(router, cred, Purpose::Transit).await;
    assert!(
        matches!(admitted.result, Some(auth_response::Result::Admitted(_))),
        "{admitted:?}"
    );
    let circuit = raddr
        .with(Protocol::P2p(router))
        .with(Protocol::P2pCircuit)
        .with(Protocol::P2p(b.peer_id()));
    x.connect(b.peer_id(), circuit).await;

    let forged = forged_push_frame(DENY.as_bytes(), &[7; 64]);
    for _ in 0..3 {
        let mut s = x.open(b.peer_id(), POLICY).await;
        let _ = s.write_all(&forged).await;
        let _ = s.close().await;
    }
    agentmesh_testkit::eventually("the pushes counted not_attached", || async {
        let n = node_metric(
            &b,
            r#"agentmesh_node_policy_pushes_total{result="not_attached"}"#,
        )
        .await;
        (n >= 3.0).then_some(())
    })
    .await;
    let t = metrics(&b).await;
    assert_eq!(metric(&t, "agentmesh_node_policy_version"), 1.0);
    assert_eq!(
        metric(
            &t,
            r#"agentmesh_node_policy_pushes_total{result="accepted"}"#
        ),
        0.0
    );
    // The node still serves its granted caller.
    let (a, _adir) = spawn_node(&cp, &member, "spawn a", |c| c).await;
    ready(&a, "a").await;
    let mut s = call_until_found(&a, "echo").await;
    round_trip(&mut s, 1024).await;
}
