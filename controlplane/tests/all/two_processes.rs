//! Two `agentmesh-control-plane` processes (the real binary) on one
//! database, on both backends, as two replicas would run: started together
//! on an empty database, both come up serving exactly one signing key; a
//! single-use token presented by two enrollments at once, one to each
//! process, enrolls exactly one member; one of the two holds the reaper's
//! duty.

use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};

use crate::common::{
    self, Backend, TestDb,
    binary::{member_token, serve, until_live_replicas},
    client_at,
};

async fn two_processes_starting_together_share_one_key_and_spend_a_token_once(db: TestDb) {
    let env = db.binary_env();
    let (a, b) = tokio::join!(serve(db.url(), &[], &env), serve(db.url(), &[], &env));
    assert_eq!(
        db.count("SELECT COUNT(*) FROM signing_keys").await,
        1,
        "one key made by the two"
    );
    let (ca, cb) = (client_at(&a.url), client_at(&b.url));
    let (ka, kb) = (
        ca.get_keys().await.expect("a's keys"),
        cb.get_keys().await.expect("b's keys"),
    );
    assert_eq!(ka.keys.len(), 1, "{ka:?}");
    assert_eq!(ka, kb, "both serve the one key");
    let (status, body) = common::http_get(a.http_addr, "/metrics").await;
    assert_eq!(status, 200);
    let pool = |state: &str| {
        common::metric(
            &body,
            &format!("agentmesh_control_plane_db_pool_connections{{state=\"{state}\"}}"),
        )
    };
    match db.backend() {
        Backend::Postgres => {
            assert_eq!(pool("max"), Some(16.0), "--db-pool-connections default");
            assert!(pool("open").is_some_and(|n| (1.0..=16.0).contains(&n)));
        }
        Backend::Sqlite => assert_eq!(pool("max"), Some(0.0), "no pool on SQLite"),
    }
    // The reaper's duty: exactly one of the two holds it (each claimed it
    // at start, one conditional upsert on the database's clock won).
    let (_, body_b) = common::http_get(b.http_addr, "/metrics").await;
    let held = |body: &str| {
        common::metric(body, "agentmesh_control_plane_duty_held{duty=\"reaper\"}")
            .expect("duty_held is pre-created")
    };
    assert_eq!(
        held(&body) + held(&body_b),
        1.0,
        "one reaper between two replicas"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM duty_leases WHERE duty = 'reaper'")
            .await,
        1
    );
    // Each counts the other within a few heartbeats (2 s each; bounded
    // wait), and so serves half of every shared budget.
    until_live_replicas(&[&a, &b], 2.0).await;

    // One single-use token (from `token create`, a third process), presented
    // at once by two members, one to each control plane.
    let tok = member_token(db.url(), 1, &env).await;
    let (ma, mb) = (Keypair::generate_ed25519(), Keypair::generate_ed25519());
    let (ra, rb) = tokio::join!(ca.enroll(&tok, &ma), cb.enroll(&tok, &mb));
    assert!(
        ra.is_ok() ^ rb.is_ok(),
        "exactly one enrolls: {:?} / {:?}",
        ra.as_ref().map(|_| ()),
        rb.as_ref().map(|_| ())
    );
    let refused = ra
        .as_ref()
        .err()
        .or(rb.as_ref().err())
        .expect("one refusal");
    let status = refused.status().expect("a gRPC refusal");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("no uses left"), "{status:?}");
    assert_eq!(db.count("SELECT uses FROM tokens").await, 1);
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 1);
    // The one that enrolled is a member, with the token's role.
    let enrolled = ra.or(rb).expect("one enrolled");
    let claims =
        agentmesh_proto::credential::peek_claims(enrolled.credential.as_ref().expect("credential"))
            .expect("claims");
    assert_eq!(claims.role, Role::Member as i32);
    assert_eq!(claims.token_kind, TokenKind::Bootstrap as i32);

    for served in [a, b] {
        let status = served.terminate().await;
        assert!(status.success(), "exit status after SIGTERM: {status:?}");
    }
}

on_both!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    two_processes_starting_together_share_one_key_and_spend_a_token_once,
);
