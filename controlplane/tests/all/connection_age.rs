//! `--grpc-max-connection-age-secs`: an idle member's connection is closed
//! after its age (so the control plane holds nothing per idle member), and
//! the member's client connects again at its next call; a client with a
//! connection per call (what members use) leaves none open between calls.
//! SQLite only: the database plays no part.

use std::time::Duration;

use agentmesh_controlplane::{Client, ClientConfig, Config, Connections, spawn};
use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};

use crate::common::{self, client, metric, metrics, token};

async fn connections(h: &agentmesh_controlplane::Handle) -> f64 {
    metric(
        &metrics(h).await,
        "agentmesh_control_plane_grpc_connections ",
    )
    .expect("gauge")
}

/// Polls the gauge until it is `want` (bounded by attempts, not asserted on time).
async fn until_connections(h: &agentmesh_controlplane::Handle, want: f64) -> bool {
    for _ in 0..200 {
        if connections(h).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn an_idle_connection_is_closed_at_its_age_and_the_client_reconnects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(Config {
        grpc_max_connection_age_secs: 1,
        ..common::config(dir.path())
    })
    .await
    .expect("starts");
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 2).await;
    let c = client(&h);
    let key = Keypair::generate_ed25519();
    let e = c.enroll(&tok, &key).await.expect("enrolls");
    assert!(
        until_connections(&h, 1.0).await,
        "the member's connection is open"
    );
    assert!(
        until_connections(&h, 0.0).await,
        "the idle connection is closed after its age"
    );
    // The same client calls again: a new connection, the call succeeds.
    c.refresh(e.credential.as_ref().expect("credential"), &key)
        .await
        .expect("refreshes over a new connection");
    h.shutdown().await;
}

#[tokio::test]
async fn a_client_with_a_connection_per_call_leaves_none_open_between_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No connection age: only the client can close its connections here.
    let h = spawn(Config {
        grpc_max_connection_age_secs: 0,
        ..common::config(dir.path())
    })
    .await
    .expect("starts");
    let tok = token(&h, TokenKind::Bootstrap, Role::Member, &[], 2).await;
    let cfg = ClientConfig {
        url: h.public_url().to_string(),
        retry_budget: Duration::from_secs(20),
        rpc_timeout: Duration::from_secs(10),
        ca_pem: None,
    };
    let per_call = Client::with_connections(cfg.clone(), Connections::PerCall).expect("client");
    let key = Keypair::generate_ed25519();
    let e = per_call.enroll(&tok, &key).await.expect("enrolls");
    per_call.get_keys().await.expect("keys");
    per_call
        .refresh(e.credential.as_ref().expect("credential"), &key)
        .await
        .expect("refreshes");
    assert!(
        until_connections(&h, 0.0).await,
        "no connection stays open after the calls of a per-call client"
    );
    // The held client, against the same server, keeps its one connection:
    // the gauge can show an open one, so the 0 above is the client's doing.
    let held = Client::with_connections(cfg, Connections::Held).expect("client");
    held.get_keys().await.expect("keys");
    held.get_keys().await.expect("keys again");
    assert!(
        until_connections(&h, 1.0).await,
        "a held client keeps one connection"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(connections(&h).await, 1.0, "and only one");
    h.shutdown().await;
}
