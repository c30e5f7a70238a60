//! The gRPC listener's bounds, met with real connections: at most
//! `--grpc-max-connections` open (more are closed at accept and counted),
//! and at most `--grpc-max-concurrent-streams-per-connection` calls in flight
//! on one connection (more are refused with RESOURCE_EXHAUSTED + retry-after
//! and counted), in plaintext and over TLS.

mod common;

use std::time::Duration;

use agentmesh_controlplane::{Client, ClientConfig, ClientError, Config, Handle, spawn};
use agentmesh_proto::pb::controlplane::{GetKeysRequest, control_plane_client::ControlPlaneClient};
use common::{metric, metrics};
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const DEADLINE: Duration = Duration::from_secs(60);

/// A new connection (each call makes its own channel, so its own TCP connection).
async fn channel(h: &Handle, ca_pem: Option<&str>) -> Result<Channel, tonic::transport::Error> {
    let mut e = Endpoint::from_shared(h.public_url().to_string())
        .expect("url")
        .timeout(Duration::from_secs(30));
    if let Some(pem) = ca_pem {
        agentmesh_controlplane::tls::ensure_crypto_provider();
        e = e.tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))?;
    }
    e.connect().await
}

async fn get_keys(ch: &Channel) -> Result<(), tonic::Status> {
    ControlPlaneClient::new(ch.clone())
        .get_keys(GetKeysRequest {})
        .await
        .map(|_| ())
}

async fn sample(h: &Handle, name: &str) -> f64 {
    metric(&metrics(h).await, name).unwrap_or_else(|| panic!("{name} is exported"))
}

/// Polls `cond` every 50 ms until it holds; panics after the deadline.
async fn wait_for<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !cond().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn connections_past_the_bound_are_closed_at_accept_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(Config {
        grpc_max_connections: 2,
        ..common::config(dir.path())
    })
    .await
    .expect("starts");
    let conns = "agentmesh_control_plane_grpc_connections ";
    let refused = "agentmesh_control_plane_grpc_connections_refused_total ";
    assert_eq!(sample(&h, conns).await, 0.0);
    assert_eq!(sample(&h, refused).await, 0.0);

    let a = channel(&h, None).await.expect("first connection");
    get_keys(&a).await.expect("first connection served");
    let b = channel(&h, None).await.expect("second connection");
    get_keys(&b).await.expect("second connection served");
    assert_eq!(sample(&h, conns).await, 2.0);

    // The third is accepted and closed at once: the client sees a transport
    // failure (retryable), never an answer.
    let third = match channel(&h, None).await {
        Ok(c) => get_keys(&c).await.map_err(|s| s.code()),
        Err(_) => Err(Code::Unavailable),
    };
    assert!(
        matches!(
            third,
            Err(Code::Unavailable | Code::Unknown | Code::Cancelled)
        ),
        "{third:?}"
    );
    assert!(sample(&h, refused).await >= 1.0, "the refusal is counted");
    // Our client takes that as retryable: it keeps trying (each attempt a
    // new connection, refused and counted) until its budget is spent.
    let before = sample(&h, refused).await;
    let client = Client::new(ClientConfig {
        url: h.public_url().to_string(),
        retry_budget: Duration::from_secs(2),
        ..ClientConfig::default()
    })
    .expect("client");
    match client.get_keys().await {
        Err(ClientError::BudgetExhausted { attempts, .. }) => {
            assert!(attempts >= 2, "retried: {attempts}")
        }
        other => panic!("expected retries until the budget, got {other:?}"),
    }
    assert!(sample(&h, refused).await >= before + 2.0);
    assert_eq!(sample(&h, conns).await, 2.0);
    // Those two keep being served.
    get_keys(&a).await.expect("still served");

    // One closes; its slot frees and a new connection gets in.
    drop(a);
    wait_for("the closed connection's slot", || async {
        sample(&h, conns).await == 1.0
    })
    .await;
    let d = channel(&h, None).await.expect("a new connection");
    get_keys(&d).await.expect("served after a slot freed");
    get_keys(&b).await.expect("still served");
    h.shutdown().await;
}

async fn streams_per_connection(tls: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config {
        grpc_max_concurrent_streams_per_connection: 2,
        ..common::config(dir.path())
    };
    let ca = tls.then(|| {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&c, cert.cert.pem()).expect("write cert");
        std::fs::write(&k, cert.key_pair.serialize_pem()).expect("write key");
        cfg.tls_cert = Some(c);
        cfg.tls_key = Some(k);
        cert.cert.pem()
    });
    let h = spawn(cfg).await.expect("starts");
    let refused =
        "agentmesh_control_plane_limiter_refusals_total{limiter=\"streams_per_connection\"}";
    assert_eq!(sample(&h, refused).await, 0.0);

    // Two health watches are two calls in flight for as long as they stream.
    let one = channel(&h, ca.as_deref()).await.expect("connection");
    let mut health = HealthClient::new(one.clone());
    let watch = || HealthCheckRequest {
        service: String::new(),
    };
    let w1 = health.watch(watch()).await.expect("first watch");
    let w2 = health.watch(watch()).await.expect("second watch");

    // A third call on that connection is refused, saying why and when to retry.
    let s = health.watch(watch()).await.expect_err("third call refused");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().contains("streams_per_connection"), "{s:?}");
    assert_eq!(
        agentmesh_controlplane::retry_after(&s),
        Some(Duration::from_secs(1))
    );
    let s = get_keys(&one).await.expect_err("a unary call too");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(sample(&h, refused).await, 2.0);

    // The bound is per connection: another connection is served.
    let other = channel(&h, ca.as_deref()).await.expect("second connection");
    get_keys(&other)
        .await
        .expect("served on another connection");

    // Ending one watch frees its slot.
    drop(w1);
    wait_for("the ended watch's slot", || async {
        get_keys(&one).await.is_ok()
    })
    .await;
    drop(w2);
    h.shutdown().await;
}

#[tokio::test]
async fn calls_past_the_per_connection_bound_are_refused_with_retry_after() {
    streams_per_connection(false).await;
}

#[tokio::test]
async fn the_per_connection_bound_holds_over_tls() {
    streams_per_connection(true).await;
}
