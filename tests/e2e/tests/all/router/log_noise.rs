//! A router's log does not grow with what one source sends it: the router
//! binary (its own default log filter, stderr read to the end) and one
//! enrolled peer that presents a forged credential 200 times on one
//! connection. Each is refused with its reason and counted, and logged at
//! most once a minute per source and kind (`auth_refused`), the rest
//! counted in `agentmesh_router_log_suppressed_total{kind="auth_refused"}`.
//! Before, every refusal was an INFO line.

use super::support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use agentmesh_proto::credential::{peek_claims, sign};
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{AuthRefusal, Purpose, auth_response};
use libp2p::{Multiaddr, PeerId};
use support::cp::start_cp;
use support::{TestPeer, eventually, http_get, metric};
use tokio::io::AsyncBufReadExt as _;

/// Forged credentials presented.
const ATTEMPTS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_auths_from_one_source_are_logged_once_a_minute() {
    let cp = start_cp().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("router.token");
    std::fs::write(&tokens, cp.token(Role::Router).await).expect("token");
    let mut router = tokio::process::Command::new(env!("CARGO_BIN_EXE_e2e-agentmesh-router"))
        .args(["--control-plane", &cp.url])
        .arg("--token-file")
        .arg(&tokens)
        .arg("--key-path")
        .arg(dir.path().join("router.key"))
        .args(["--listen", "/ip4/127.0.0.1/tcp/0"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--lease-interval-secs", "1"])
        // The filter an operator gets.
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("router binary");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let stderr = router.stderr.take().expect("stderr");
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(l)) = r.next_line().await {
                sink.lock().expect("lines").push(l);
            }
        })
    };
    let find =
        |f: &dyn Fn(&str) -> Option<String>| lines.lock().expect("lines").iter().find_map(|l| f(l));
    let (id, listen, metrics) = eventually("the router's addresses logged", || async {
        let started = find(&|l: &str| l.contains("router started").then(|| l.to_string()))?;
        let id: PeerId = started
            .split_once("peer_id=")?
            .1
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let start = started.find("/ip4/")?;
        let rest = &started[start..];
        let end = rest.find([']', ',', ' ']).unwrap_or(rest.len());
        let listen: Multiaddr = rest[..end].parse().ok()?;
        let metrics =
            find(&|l: &str| Some(l.split_once("metrics on http://")?.1.trim().to_string()))?;
        let metrics: SocketAddr = metrics.parse().ok()?;
        Some((id, listen, metrics))
    })
    .await;
    eventually("the router ready", || async {
        (http_get(metrics, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    let token = cp.token(Role::Member).await;
    let mut peer = TestPeer::new();
    let cred = cp.enroll(&token, &peer.key).await;
    let forged = sign(
        &peek_claims(&cred).expect("claims"),
        &libp2p::identity::ed25519::Keypair::generate(),
    );
    peer.connect(id, listen).await;
    let mut refused = 0;
    for _ in 0..ATTEMPTS {
        let resp = peer.auth(id, Some(forged.clone()), Purpose::Attach).await;
        if let Some(auth_response::Result::Refused(r)) = resp.result {
            assert_eq!(r.reason, AuthRefusal::BadSignature as i32);
            refused += 1;
        }
    }
    assert_eq!(refused, ATTEMPTS, "every forged credential refused");
    let (_, m) = http_get(metrics, "/metrics").await;
    let counted = metric(
        &m,
        r#"agentmesh_router_auth_total{purpose="attach",result="bad_signature"}"#,
    );
    assert_eq!(counted, ATTEMPTS as f64, "every refusal counted");
    let held = metric(
        &m,
        r#"agentmesh_router_log_suppressed_total{kind="auth_refused"}"#,
    );

    router.kill().await.expect("kill");
    reader.await.expect("reader");
    let logged = lines
        .lock()
        .expect("lines")
        .iter()
        .filter(|l| l.contains("auth refused"))
        .count();
    eprintln!("{logged} 'auth refused' lines, {held} held back, of {ATTEMPTS} refusals");
    // Once, and once more should the attempts straddle a minute.
    assert!((1..=2).contains(&logged), "{logged} lines");
    assert!(held >= (ATTEMPTS - 2) as f64, "{held} held back");
}
