//! gRPC over TLS (rustls through tonic) with a CA the client is given, on
//! both backends (the enrollment over TLS is stored).

use std::time::Duration;

use agentmesh_controlplane::{Client, ClientConfig, ClientError, spawn};
use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};

use crate::common::{self, TestDb};

async fn enroll_over_tls_and_plaintext_is_not_answered(db: TestDb) {
    let dir = db.dir();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("self-signed cert");
    let cert_pem = cert.cert.pem();
    let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_path, &cert_pem).expect("write cert");
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).expect("write key");
    let mut cfg = db.config();
    cfg.tls_cert = Some(cert_path);
    cfg.tls_key = Some(key_path);
    let h = spawn(cfg).await.expect("starts with TLS");
    assert!(
        h.public_url().starts_with("https://127.0.0.1:"),
        "{}",
        h.public_url()
    );

    let tok = common::token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let tls = Client::new(ClientConfig {
        url: h.public_url().to_string(),
        ca_pem: Some(cert_pem.into_bytes()),
        ..ClientConfig::default()
    })
    .expect("client");
    let k = Keypair::generate_ed25519();
    let e = tls.enroll(&tok, &k).await.expect("enrolls over TLS");
    assert!(e.credential.is_some());

    // A plaintext client gets no answer; with a short budget it reports the
    // last transport failure.
    let plain = Client::new(ClientConfig {
        url: h.public_url().replace("https://", "http://"),
        ca_pem: None,
        retry_budget: Duration::from_secs(2),
        rpc_timeout: Duration::from_secs(1),
    })
    .expect("client");
    match plain.get_keys().await {
        Err(ClientError::BudgetExhausted { last, attempts, .. }) => {
            // A transport failure, retried until the budget was spent.
            assert!(
                matches!(last.code(), tonic::Code::Unknown | tonic::Code::Unavailable),
                "{last:?}"
            );
            assert!(attempts >= 2, "{attempts}");
        }
        other => panic!("plaintext must not get keys: {other:?}"),
    }
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    enroll_over_tls_and_plaintext_is_not_answered,
);
