//! Revocation by token with real members (issue 18): `agentmesh-control-plane
//! token revoke ID` refuses every member enrolled through that token (one
//! entry, however many), their router drops them and their live calls end,
//! the token enrolls no one again, and a member of another token keeps
//! calling.

use super::support;

use std::path::Path;
use std::time::Duration;

use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use libp2p::identity::Keypair;
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const CP_BIN: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// A member token: (secret, id).
async fn member_token(cp: &Cp) -> (String, String) {
    let r = cp
        .client
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Member as i32,
                labels: vec![],
                max_uses: 100,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("create token");
    (r.token, r.token_id)
}

/// `agentmesh-control-plane token revoke ID`, as an operator runs it.
async fn revoke(cp: &Cp, dir: &Path, token_id: &str) {
    let admin = dir.join("admin-token");
    std::fs::write(&admin, ADMIN).expect("admin token file");
    let out = tokio::process::Command::new(CP_BIN)
        .args(["token", "revoke", token_id, "--reason", "leaked"])
        .args(["--control-plane", &cp.url, "--admin-token-file"])
        .arg(&admin)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DEADLINE, out)
        .await
        .expect("token revoke in time")
        .expect("run token revoke");
    assert!(
        out.status.success(),
        "token revoke: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_members_lose_their_router_and_calls_and_it_enrolls_no_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cp = start_cp().await;
    // Two routers: a revoked member asks one of them, not each in turn.
    let r = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let (leaked, leaked_id) = member_token(&cp).await;
    let (kept, _) = member_token(&cp).await;
    let backend = echo_backend().await;
    // Two providers through the leaked token, one caller through the other.
    let (p1, _d1) = spawn_node(&cp, &leaked, "spawn p1", |mut c| {
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    let (p2, _d2) = spawn_node(&cp, &leaked, "spawn p2", |mut c| {
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    let (caller, _d3) = spawn_node(&cp, &kept, "spawn caller", |c| c).await;
    for (n, what) in [(&p1, "p1"), (&p2, "p2"), (&caller, "caller")] {
        ready(n, what).await;
    }
    let attached = || {
        r.metric("agentmesh_router_attached_members")
            + r2.metric("agentmesh_router_attached_members")
    };
    agentmesh_testkit::eventually("three members attached", || async {
        (attached() == 3.0).then_some(())
    })
    .await;
    let mut live = call_until_found(&caller, "echo").await;
    live.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    live.read_exact(&mut buf).await.expect("echo before");
    assert_eq!(&buf, b"ping");

    revoke(&cp, dir.path(), &leaked_id).await;

    // Both of the token's members are dropped by the router; the caller stays.
    agentmesh_testkit::eventually("the token's members dropped", || async {
        (attached() == 1.0).then_some(())
    })
    .await;
    // The live call to either provider ends.
    let ended = tokio::time::timeout(DEADLINE, live.read(&mut buf)).await;
    assert!(
        matches!(ended, Ok(Ok(0)) | Ok(Err(_))),
        "the live call was not closed: {ended:?}"
    );
    // Each revoked member learns it from the control plane's signed list
    // (its directory, fetched every second here, or the fetch a router's
    // "revoked" starts) and then asks no router: at most one refused it,
    // where before it asked each router in turn.
    for (n, what) in [(&p1, "p1"), (&p2, "p2")] {
        let addr = n.metrics_addr().expect("metrics");
        let read = |name: &'static str| async move {
            let (_, m) = http_get(addr, "/metrics").await;
            metric(&m, name)
        };
        agentmesh_testkit::eventually(&format!("{what} knows it is revoked"), || async {
            (read("agentmesh_node_credential_revoked").await == 1.0).then_some(())
        })
        .await;
        assert!(!n.is_ready(), "{what} is ready while revoked");
    }
    // Long enough for a member that asked each router in turn to have
    // asked the second (its top-up runs every tick): none does.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (n, what) in [(&p1, "p1"), (&p2, "p2")] {
        let (_, m) = http_get(n.metrics_addr().expect("metrics"), "/metrics").await;
        let refusals = metric(&m, "agentmesh_node_router_revoked_refusals_total");
        assert!(refusals <= 1.0, "{what} asked {refusals} routers");
        assert_eq!(metric(&m, "agentmesh_node_credential_revoked"), 1.0);
    }
    let refused = r.metric(r#"agentmesh_router_auth_total{purpose="attach",result="revoked"}"#)
        + r2.metric(r#"agentmesh_router_auth_total{purpose="attach",result="revoked"}"#);
    assert!(
        refused <= 2.0,
        "routers refused {refused} attaches as revoked"
    );
    // No call reaches a revoked provider again.
    for _ in 0..3 {
        assert!(
            caller.call("echo").await.is_err(),
            "a revoked provider answered"
        );
    }
    assert!(
        caller.is_ready(),
        "the other token's member keeps its router"
    );
    // The token enrolls no one.
    let e = cp
        .client
        .enroll(&leaked, &Keypair::generate_ed25519())
        .await
        .expect_err("a revoked token enrolls no one");
    assert_eq!(
        e.status().map(|s| s.code()),
        Some(tonic::Code::PermissionDenied),
        "{e}"
    );
    // One revocation entry, however many members it covers, in a list the
    // control plane signed.
    let dir_resp = cp.client.get_directory().await.expect("directory");
    let trust = agentmesh_proto::credential::Trust::new(&cp.client.get_keys().await.expect("keys"));
    let list = agentmesh_proto::revocations::verify_revocations(
        dir_resp
            .revocations
            .as_ref()
            .expect("the directory carries the list"),
        &trust,
        agentmesh_proto::unix_now(),
    )
    .expect("signed by the control plane");
    let by_token: Vec<_> = list
        .entries
        .iter()
        .filter(|rv| rv.token_id == leaked_id)
        .collect();
    assert_eq!(by_token.len(), 1, "{:?}", list.entries);
    assert!(by_token[0].peer_id.is_empty());
}
