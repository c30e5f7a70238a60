//! `--grpc-max-connection-age-secs`: an idle member's connection is closed
//! after its age (so the control plane holds nothing per idle member), and
//! the member's client connects again at its next call. SQLite only: the
//! database plays no part.

use std::time::Duration;

use agentmesh_controlplane::{Config, spawn};
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
