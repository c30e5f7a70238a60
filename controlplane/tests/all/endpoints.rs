//! A client given several control-plane endpoints (two replicas on one
//! database and a frozen one that accepts connections and never answers,
//! as a SIGSTOPped replica does): calls skip the endpoint that timed out,
//! proofs stay bound to the one logical URL both replicas serve as their
//! `--public-url`, and a replica that stops costs a retry, never an error.

use std::time::Duration;

use agentmesh_controlplane::{Client, ClientConfig, Connections, spawn};
use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};

use crate::common::{Backend, TestDb, token};

/// The name members and routers are configured with; it resolves nowhere:
/// only the endpoints are dialled.
const LOGICAL: &str = "http://agentmesh-control-plane.invalid:7400";

/// A replica of `db` serving the logical URL.
async fn replica(db: &TestDb) -> agentmesh_controlplane::Handle {
    let mut cfg = db.config();
    cfg.public_url = Some(LOGICAL.into());
    spawn(cfg).await.expect("a replica starts")
}

/// A listener that accepts and never answers, as a SIGSTOPped replica
/// does; its connections stay open until the returned task is aborted.
async fn frozen_replica() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = frozen.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = frozen.accept().await {
            conns.push(c);
        }
    });
    (addr, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_skip_a_frozen_or_stopped_replica_and_proofs_name_the_logical_url() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let (a, b) = (replica(&db).await, replica(&db).await);
    let (frozen_addr, held) = frozen_replica().await;
    let endpoints = [
        format!("http://{frozen_addr}"),
        format!("http://{}", a.grpc_addr()),
        format!("http://{}", b.grpc_addr()),
    ];
    let client = Client::with_endpoints(
        ClientConfig {
            url: LOGICAL.into(),
            retry_budget: Duration::from_secs(30),
            rpc_timeout: Duration::from_millis(500),
            ca_pem: None,
        },
        Connections::PerCall,
        &endpoints,
    )
    .expect("client");
    assert_eq!(client.public_url(), LOGICAL);

    // The frozen endpoint times out once; the call goes on to a.
    let keys = client
        .get_keys()
        .await
        .expect("keys past the frozen endpoint");
    assert!(!keys.keys.is_empty());

    // An enrollment's proof names the logical URL, which both serve.
    let token = token(&a, TokenKind::Bootstrap, Role::Member, &[], 10).await;
    let first = client
        .enroll(&token, &Keypair::generate_ed25519())
        .await
        .expect("enrolls through a");
    assert!(first.credential.is_some());

    // a stops: the next call costs a retry and lands on b (the frozen one
    // is skipped again after its timeout).
    a.shutdown().await;
    let again = client
        .enroll(&token, &Keypair::generate_ed25519())
        .await
        .expect("enrolls through b");
    assert!(again.credential.is_some());
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 2);
    b.shutdown().await;
    held.abort();
}

/// `dns+http://NAME:PORT` stands for every address NAME resolves to:
/// `localhost` (the hosts file, on any machine) becomes its loopback
/// address(es) at the first call, the proof still names the logical URL;
/// a name that resolves nowhere beside a real endpoint costs a failover,
/// never an error, and stays dialled as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_name_endpoint_is_dialled_as_the_addresses_it_resolves_to() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let a = replica(&db).await;
    let port = a.grpc_addr().port();
    let config = ClientConfig {
        url: LOGICAL.into(),
        retry_budget: Duration::from_secs(30),
        rpc_timeout: Duration::from_secs(5),
        ca_pem: None,
    };
    let by_name = Client::with_endpoints(
        config.clone(),
        Connections::PerCall,
        &[format!("dns+http://localhost:{port}")],
    )
    .expect("client");
    assert_eq!(
        by_name.endpoints(),
        [format!("http://localhost:{port}")],
        "before its first call: the name itself"
    );
    let token = token(&a, TokenKind::Bootstrap, Role::Member, &[], 10).await;
    let enrolled = by_name
        .enroll(&token, &Keypair::generate_ed25519())
        .await
        .expect("enrolls through the resolved address");
    assert!(enrolled.credential.is_some());
    let resolved = by_name.endpoints();
    assert!(
        resolved.contains(&format!("http://127.0.0.1:{port}")),
        "{resolved:?}"
    );
    assert!(
        resolved.iter().all(|e| !e.contains("localhost")),
        "the name is replaced by its addresses: {resolved:?}"
    );

    let nowhere = Client::with_endpoints(
        config,
        Connections::PerCall,
        &[
            format!("dns+http://agentmesh-control-plane.invalid:{port}"),
            format!("http://{}", a.grpc_addr()),
        ],
    )
    .expect("client");
    nowhere
        .get_keys()
        .await
        .expect("keys past a name that resolves nowhere");
    assert_eq!(
        nowhere.endpoints()[0],
        format!("http://agentmesh-control-plane.invalid:{port}"),
        "never resolved: kept as it is, never dropped to nothing"
    );
    a.shutdown().await;
}

#[test]
fn a_malformed_dns_endpoint_is_refused_at_start() {
    let Err(err) = Client::with_endpoints(
        ClientConfig {
            url: LOGICAL.into(),
            ..ClientConfig::default()
        },
        Connections::PerCall,
        &["dns+http://cp-without-a-port".to_string()],
    ) else {
        panic!("a dns+ endpoint without a port is refused");
    };
    assert!(err.to_string().contains("NAME:PORT"), "{err}");
}

/// A client made with a shorter attempt timeout (a router's lease) leaves
/// a frozen replica after that, not after the configured rpc timeout: the
/// call past the frozen endpoint ends well before one rpc timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_attempt_timeout_leaves_a_frozen_replica_before_the_rpc_timeout() {
    let db = TestDb::new(Backend::Sqlite).await.expect("sqlite");
    let a = replica(&db).await;
    let (frozen_addr, held) = frozen_replica().await;
    let rpc_timeout = Duration::from_secs(10);
    let client = Client::with_endpoints(
        ClientConfig {
            url: LOGICAL.into(),
            retry_budget: Duration::from_secs(60),
            rpc_timeout,
            ca_pem: None,
        },
        Connections::PerCall,
        &[
            format!("http://{frozen_addr}"),
            format!("http://{}", a.grpc_addr()),
        ],
    )
    .expect("client");
    let short = client.with_attempt_timeout(Duration::from_millis(300));
    assert_eq!(short.attempt_timeout(), Duration::from_millis(300));
    assert_eq!(
        client
            .with_attempt_timeout(Duration::from_secs(60))
            .attempt_timeout(),
        rpc_timeout,
        "never longer than the configured one"
    );
    let started = tokio::time::Instant::now();
    short
        .get_keys()
        .await
        .expect("keys past the frozen replica");
    assert!(
        started.elapsed() < rpc_timeout,
        "the frozen replica held the call {:?}, as long as a whole rpc timeout",
        started.elapsed()
    );
    held.abort();
    a.shutdown().await;
}
