//! The gRPC listener's bounds, met with real connections: at most
//! `--grpc-max-connections` open (more are closed at accept and counted;
//! shared fairly by sources when all are open),
//! and at most `--grpc-max-concurrent-streams-per-connection` calls in flight
//! on one connection (more are refused with RESOURCE_EXHAUSTED + retry-after
//! and counted), in plaintext and over TLS; a connection that sends no call
//! within `--grpc-handshake-timeout-secs` is closed; a request over
//! `--grpc-max-message-bytes` is refused. On SQLite only: the calls these
//! tests make (`GetKeys`, served from memory, and requests refused before
//! they are read or their proof is checked) never reach the database.

use std::time::Duration;

use crate::common::{self, metric, metrics};
use agentmesh_controlplane::{Client, ClientConfig, ClientError, Config, Handle, spawn};
use agentmesh_proto::{
    credential::sign,
    identity::{Keypair, ed25519},
    pb::{
        controlplane::{
            GetKeysRequest, ProofOfPossession, RouterLeaseRequest, RouterLoad,
            control_plane_client::ControlPlaneClient,
        },
        credential::{Claims, Label},
    },
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A silent TCP connection from `ip` (no TLS, no HTTP/2 preface): it holds
/// a slot until the handshake timeout.
async fn silent_from(h: &Handle, ip: [u8; 4]) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((ip, 0)))
        .expect("bind a loopback source");
    socket.connect(h.grpc_addr()).await.expect("connect")
}

/// The connection bound is shared fairly by sources: one host may hold every
/// slot while nobody else asks; a connection from another source then takes
/// the host's oldest (closed, counted), and the host, holding its share, is
/// refused more.
#[tokio::test]
async fn a_host_holding_every_connection_yields_its_oldest_to_another_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(Config {
        grpc_max_connections: 4,
        ..common::config(dir.path())
    })
    .await
    .expect("starts");
    let conns = "agentmesh_control_plane_grpc_connections ";
    let refused = "agentmesh_control_plane_grpc_connections_refused_total ";
    let preempted = "agentmesh_control_plane_grpc_connections_preempted_total ";
    assert_eq!(sample(&h, preempted).await, 0.0);
    let attacker = [127, 0, 0, 77];
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(silent_from(&h, attacker).await);
        // In order, so the first is the oldest.
        let n = held.len() as f64;
        wait_for("the silent connection's slot", || async {
            sample(&h, conns).await == n
        })
        .await;
    }
    // A member from 127.0.0.1 gets in and is served.
    let member = channel(&h, None).await.expect("a member connects");
    get_keys(&member).await.expect("the member is served");
    assert_eq!(sample(&h, preempted).await, 1.0);
    assert_eq!(sample(&h, refused).await, 0.0);
    // The attacker's oldest is closed.
    closed_by_server(&mut held[0]).await;
    // The attacker, holding three of four, is refused a fifth.
    let mut more = silent_from(&h, attacker).await;
    closed_by_server(&mut more).await;
    assert_eq!(sample(&h, refused).await, 1.0);
    // A third source still gets in, from the attacker's share again.
    let mut other = common::raw_client_from(&h, [127, 0, 0, 2]).await;
    other
        .get_keys(GetKeysRequest {})
        .await
        .expect("another source is served");
    assert_eq!(sample(&h, preempted).await, 2.0);
    get_keys(&member).await.expect("the member is still served");
    // Silent connections would hold the graceful shutdown for its grace.
    drop(held);
    h.shutdown().await;
}

async fn streams_per_connection(tls: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config {
        grpc_max_concurrent_streams_per_connection: 2,
        ..common::config(dir.path())
    };
    let ca = tls.then(|| with_tls(&mut cfg, dir.path()));
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

/// Writes a self-signed certificate for 127.0.0.1 into `dir`, sets it on
/// `cfg` and returns its PEM (the CA clients trust).
fn with_tls(cfg: &mut Config, dir: &std::path::Path) -> String {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&c, cert.cert.pem()).expect("write cert");
    std::fs::write(&k, cert.key_pair.serialize_pem()).expect("write key");
    cfg.tls_cert = Some(c);
    cfg.tls_key = Some(k);
    cert.cert.pem()
}

/// Reads until the server closes the connection; panics after the deadline.
async fn closed_by_server(s: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(DEADLINE, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server never closed the silent connection"
    );
}

/// The HTTP/2 client preface and an empty SETTINGS frame: a client that
/// finished its handshake and then never calls.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

async fn silent_connections_lose_their_slot(tls: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config {
        grpc_max_connections: 2,
        grpc_handshake_timeout_secs: 1,
        ..common::config(dir.path())
    };
    let ca = tls.then(|| with_tls(&mut cfg, dir.path()));
    let h = spawn(cfg).await.expect("starts");
    let timeouts = "agentmesh_control_plane_grpc_handshake_timeouts_total ";
    let conns = "agentmesh_control_plane_grpc_connections ";
    assert_eq!(sample(&h, timeouts).await, 0.0);

    // A client that calls keeps its connection past the handshake timeout.
    let served = channel(&h, ca.as_deref()).await.expect("connection");
    get_keys(&served).await.expect("served");

    // A socket that never sends a byte, and (plaintext) one that sends the
    // HTTP/2 preface but no call, fill the other slot in turn; each is closed.
    let mut silent = tokio::net::TcpStream::connect(h.grpc_addr())
        .await
        .expect("connect");
    closed_by_server(&mut silent).await;
    if !tls {
        let mut preface_only = tokio::net::TcpStream::connect(h.grpc_addr())
            .await
            .expect("connect");
        preface_only.write_all(PREFACE).await.expect("preface");
        closed_by_server(&mut preface_only).await;
        // Plaintext: both went past our deadline (over TLS tonic's own TLS
        // handshake timeout, set to the same value, may close first).
        wait_for("both timeouts counted", || async {
            sample(&h, timeouts).await == 2.0
        })
        .await;
    }
    wait_for("the silent connections' slots", || async {
        sample(&h, conns).await == 1.0
    })
    .await;
    // The freed slot takes a real client; the first connection was never
    // closed (its deadline passed before the silent ones' did).
    let fresh = channel(&h, ca.as_deref()).await.expect("a new connection");
    get_keys(&fresh).await.expect("served in the freed slot");
    get_keys(&served).await.expect("still served");
    assert_eq!(sample(&h, conns).await, 2.0);
    if !tls {
        assert_eq!(sample(&h, timeouts).await, 2.0, "only the silent ones");
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_connection_without_a_call_is_closed_after_the_handshake_timeout() {
    silent_connections_lose_their_slot(false).await;
}

#[tokio::test]
async fn a_silent_connection_is_closed_over_tls_too() {
    silent_connections_lose_their_slot(true).await;
}

/// The largest lease the control plane accepts field by field: 32
/// addresses of 512 bytes, 32 labels, a credential carrying 32 labels.
fn largest_lease() -> RouterLeaseRequest {
    let labels: Vec<Label> = (0..agentmesh_controlplane::admin::MAX_TOKEN_LABELS)
        .map(|i| Label {
            key: format!("{i:0>63}"),
            value: "v".repeat(agentmesh_controlplane::admin::MAX_LABEL_VALUE_LEN),
        })
        .collect();
    let member = Keypair::generate_ed25519();
    let claims = Claims {
        subject: member.public().to_peer_id().to_bytes(),
        node_id: format!("n-{}", "f".repeat(16)),
        role: i32::MAX,
        token_kind: i32::MAX,
        labels: labels.clone(),
        issued_at_unix_secs: i64::MAX,
        expires_at_unix_secs: i64::MAX,
        key_id: "k".repeat(64),
        token_id: String::new(),
    };
    RouterLeaseRequest {
        credential: Some(sign(&claims, &ed25519::Keypair::generate())),
        proof: Some(ProofOfPossession {
            public_key: member.public().encode_protobuf(),
            timestamp_unix_secs: i64::MAX,
            signature: vec![0xff; 64],
        }),
        addrs: vec![
            "a".repeat(agentmesh_controlplane::directory::MAX_ADDR_LEN);
            agentmesh_controlplane::directory::MAX_LEASE_ADDRS
        ],
        labels,
        load: Some(RouterLoad {
            attached_members: u32::MAX,
            transit_connections: u32::MAX,
            high_watermark: u32::MAX,
            low_watermark: u32::MAX,
        }),
        draining: true,
    }
}

#[tokio::test]
async fn an_oversized_request_is_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(common::config(dir.path())).await.expect("starts");
    let ch = channel(&h, None).await.expect("connection");
    let mut c = ControlPlaneClient::new(ch.clone());

    // The largest legitimate request is read (and refused for its junk proof).
    let s = c
        .router_lease(largest_lease())
        .await
        .expect_err("junk proof");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");

    // One byte over the default bound is refused before it is read.
    let big = RouterLeaseRequest {
        addrs: vec!["a".repeat(agentmesh_controlplane::config::DEFAULT_GRPC_MAX_MESSAGE_BYTES)],
        ..RouterLeaseRequest::default()
    };
    let s = c.router_lease(big).await.expect_err("oversized");
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    assert!(s.message().contains("too large"), "{s:?}");
    // Health and reflection hold the same bound.
    let s = HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: "x".repeat(100 * 1024),
        })
        .await
        .expect_err("oversized health check");
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");

    // The same connection and the server go on serving.
    get_keys(&ch)
        .await
        .expect("still served on that connection");
    let again = channel(&h, None).await.expect("a new connection");
    get_keys(&again).await.expect("a new connection is served");
    h.shutdown().await;
}

#[tokio::test]
async fn the_message_bound_is_a_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = spawn(Config {
        grpc_max_message_bytes: 1024,
        ..common::config(dir.path())
    })
    .await
    .expect("starts");
    let ch = channel(&h, None).await.expect("connection");
    let mut c = ControlPlaneClient::new(ch.clone());
    let req = RouterLeaseRequest {
        addrs: vec!["a".repeat(2048)],
        ..RouterLeaseRequest::default()
    };
    let s = c.router_lease(req).await.expect_err("over 1 KiB");
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    get_keys(&ch).await.expect("still served");
    h.shutdown().await;
}
