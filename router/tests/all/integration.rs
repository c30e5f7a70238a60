//! Cross-program tests on loopback: a real control plane (SQLite in a temp
//! dir), routers started with `spawn`, raw libp2p test peers.

use crate::support;

use std::time::Duration;

use agentmesh_proto::credential::{peek_claims, sign};
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{
    AuthRefusal, CatalogRequest, Lookup, Purpose, ServiceRecord, auth_response, catalog_request,
    catalog_response,
};
use agentmesh_proto::record::sign_record;
use agentmesh_proto::unix_now;
use agentmesh_router::Config;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use support::cp::{ADMIN, Cp};
use support::{Ev, TestPeer, TestRouter, eventually};

/// A control plane whose credentials live `credential_ttl_secs`.
async fn start_cp(credential_ttl_secs: u64) -> Cp {
    start_cp_with(credential_ttl_secs, |_| {}).await
}

async fn start_cp_with(
    credential_ttl_secs: u64,
    adjust: impl FnOnce(&mut agentmesh_controlplane::Config),
) -> Cp {
    support::cp::start_cp_with(|c| {
        c.credential_ttl_secs = credential_ttl_secs;
        c.key_grace_secs = credential_ttl_secs + 3600;
        adjust(c);
    })
    .await
}

type Router = TestRouter;

async fn start_router(cp: &Cp) -> Router {
    start_router_with(cp, |_| {}).await
}

/// A router with metrics on, a 2 s auth deadline and a 10 s control-plane
/// retry budget; `adjust` changes anything else.
async fn start_router_with(cp: &Cp, adjust: impl FnOnce(&mut Config)) -> Router {
    TestRouter::start(cp, &[], |c| {
        c.metrics_addr = Some("127.0.0.1:0".parse().expect("addr"));
        c.auth.deadline = Duration::from_secs(2);
        c.control_plane.retry_budget = Duration::from_secs(10);
        adjust(c);
    })
    .await
}

/// The auth counter these tests read.
trait AuthCount {
    fn auth_count(&self, purpose: &str, result: &str) -> f64;
}

impl AuthCount for TestRouter {
    fn auth_count(&self, purpose: &str, result: &str) -> f64 {
        self.metric(&format!(
            "agentmesh_router_auth_total{{purpose=\"{purpose}\",result=\"{result}\"}}"
        ))
    }
}

fn refusal(resp: &agentmesh_proto::pb::mesh::AuthResponse) -> Option<AuthRefusal> {
    match &resp.result {
        Some(auth_response::Result::Refused(r)) => AuthRefusal::try_from(r.reason).ok(),
        _ => None,
    }
}

fn admitted(resp: &agentmesh_proto::pb::mesh::AuthResponse) -> bool {
    matches!(resp.result, Some(auth_response::Result::Admitted(_)))
}

/// The whole response to a GET of `path`.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    support::http_get(addr, path).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_is_ready_and_serves_metrics() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let m = r.handle.metrics_addr().expect("metrics addr");
    let ready = http_get(m, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let health = http_get(m, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = http_get(m, "/metrics").await;
    // Label values exist before anything happened.
    assert!(
        metrics.contains("agentmesh_router_auth_total{purpose=\"router\",result=\"wrong_role\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("agentmesh_router_ready 1"), "{metrics}");
    assert!(r.metric("agentmesh_router_lease_total{result=\"ok\"}") >= 1.0);
    // The external address on loopback is the bound one.
    assert_eq!(r.handle.external_addrs(), r.handle.listen_addrs());
    r.handle.shutdown().await;
    drop(cp.handle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_outage_does_not_make_a_ready_router_unready() {
    let cp = start_cp(3600).await;
    let r = start_router_with(&cp, |c| {
        c.control_plane.retry_budget = Duration::from_secs(1);
        c.control_plane.rpc_timeout = Duration::from_secs(1);
    })
    .await;
    let member_token = cp.token(Role::Member).await;
    let mut a = TestPeer::new();
    let cred = cp.enroll(&member_token, &a.key).await;
    cp.handle.shutdown().await;
    eventually("a lease fails", || async {
        (r.metric("agentmesh_router_lease_total{result=\"error\"}") >= 1.0).then_some(())
    })
    .await;
    assert!(
        *r.handle.ready().borrow(),
        "still ready without the control plane"
    );
    let ready = http_get(r.handle.metrics_addr().expect("metrics"), "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    // Credentials still verify offline.
    a.connect(r.id(), r.addr.clone()).await;
    assert!(admitted(&a.auth(r.id(), Some(cred), Purpose::Attach).await));
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_and_refusals_with_reasons_and_counters() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let member_token = cp.token(Role::Member).await;

    let (a, cred_a) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;

    // Good credential: admitted, until = its expiry.
    let resp = a.auth(r.id(), Some(cred_a.clone()), Purpose::Attach).await;
    let Some(auth_response::Result::Admitted(adm)) = resp.result else {
        panic!("expected admitted, got {resp:?}");
    };
    let claims = peek_claims(&cred_a).expect("claims");
    assert_eq!(adm.until_unix_secs, claims.expires_at_unix_secs);
    assert_eq!(r.auth_count("attach", "admitted"), 1.0);

    // Forged: the same claims signed by another key.
    let forged = sign(&claims, &libp2p::identity::ed25519::Keypair::generate());
    let resp = a.auth(r.id(), Some(forged), Purpose::Attach).await;
    assert_eq!(refusal(&resp), Some(AuthRefusal::BadSignature), "{resp:?}");
    assert_eq!(r.auth_count("attach", "bad_signature"), 1.0);

    // A member token cannot act as a router.
    let resp = a.auth(r.id(), Some(cred_a.clone()), Purpose::Router).await;
    assert_eq!(refusal(&resp), Some(AuthRefusal::WrongRole), "{resp:?}");
    assert_eq!(r.auth_count("router", "wrong_role"), 1.0);

    // Members never get the router DHT, admitted or not.
    let kad = a.try_open(r.id(), agentmesh_router::KAD_PROTOCOL).await;
    assert!(
        kad.is_err_and(|e| e.contains("not support")),
        "kad refused to members"
    );
    // Nor identify: members do not speak it, and the router keeps no
    // identify state per member.
    for proto in ["/ipfs/id/1.0.0", "/ipfs/id/push/1.0.0"] {
        let id = a.try_open(r.id(), proto).await;
        assert!(
            id.is_err_and(|e| e.contains("not support")),
            "{proto} refused to members"
        );
    }

    // Another peer presenting A's credential.
    let mut b = TestPeer::new();
    b.connect(r.id(), r.addr.clone()).await;
    let resp = b.auth(r.id(), Some(cred_a.clone()), Purpose::Attach).await;
    assert_eq!(refusal(&resp), Some(AuthRefusal::WrongPeer), "{resp:?}");
    assert_eq!(r.auth_count("attach", "wrong_peer"), 1.0);

    // Garbage on the auth stream: a refusal for that stream, the connection lives on.
    let junk = b.auth_raw(r.id(), &[5, 0xff, 0xff, 0xff, 0xff, 0xff]).await;
    assert!(!junk.is_empty(), "a malformed request gets an answer");
    assert_eq!(r.auth_count("attach", "malformed"), 1.0);
    assert!(b.is_connected(r.id()).await);
    // B's own credential still works on the same connection.
    let cred_b = cp.enroll(&member_token, &b.key).await;
    assert!(admitted(
        &b.auth(r.id(), Some(cred_b), Purpose::Transit).await
    ));
    assert_eq!(r.auth_count("transit", "admitted"), 1.0);

    eventually("gauges show one attached, one transit", || async {
        (r.metric("agentmesh_router_attached_members") == 1.0
            && r.metric("agentmesh_router_transit_connections") == 1.0)
            .then_some(())
    })
    .await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_signing_key_is_fetched_once_and_the_member_admitted() {
    // New keys sign at once, and the router syncs keys only through its
    // unknown-key path: its periodic sync is an hour away, and its Watch is
    // off (a rotation's key set pushed over the Watch would race the
    // member's auth and leave the path untested).
    let cp = start_cp_with(3600, |c| {
        c.key_publish_ahead_secs = 0;
        c.key_check_interval_secs = 1;
    })
    .await;
    let started = unix_now();
    let r = start_router_with(&cp, |c| {
        c.control_plane.lease_interval = Duration::from_secs(3600);
        c.policy.watch = false;
    })
    .await;
    // The start-up sync has fetched the keys once; nothing else will.
    let fetched_before = eventually("start-up key sync", || async {
        let n = r.metric("agentmesh_router_key_fetch_total{result=\"ok\"}");
        (n >= 1.0).then_some(n)
    })
    .await;
    // A key activated in a later second than the first one signs from now
    // on, once the control plane has loaded it.
    let mut a = TestPeer::new();
    let cred = cp.credential_from_a_new_key(&a.key, started).await;
    a.connect(r.id(), r.addr.clone()).await;
    let resp = a.auth(r.id(), Some(cred), Purpose::Attach).await;
    assert!(admitted(&resp), "{resp:?}");
    assert_eq!(
        r.metric("agentmesh_router_key_fetch_total{result=\"ok\"}"),
        fetched_before + 1.0
    );
    assert_eq!(r.auth_count("attach", "unknown_key"), 0.0);
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connection_is_closed_at_the_auth_deadline() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let mut p = TestPeer::new();
    p.connect(r.id(), r.addr.clone()).await;
    let rid = r.id();
    p.wait(
        "router closes the connection",
        |e| matches!(e, Ev::Closed { peer, remaining: 0 } if *peer == rid),
    )
    .await;
    assert_eq!(
        r.metric("agentmesh_router_connections_closed_total{reason=\"auth_deadline\"}"),
        1.0
    );
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_needs_admission_and_carries_a_mebibyte() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let member_token = cp.token(Role::Member).await;
    let circuit: Multiaddr = r
        .addr
        .clone()
        .with(Protocol::P2p(r.id()))
        .with(Protocol::P2pCircuit);

    // Not admitted: the reservation is denied and counted.
    let mut a = TestPeer::new();
    a.connect(r.id(), r.addr.clone()).await;
    let c2 = circuit.clone();
    a.with_swarm(move |s| s.listen_on(c2).expect("listen on circuit"))
        .await;
    a.wait("reservation refused", |e| {
        matches!(e, Ev::ListenerClosed(_))
    })
    .await;
    // The relay reports the denial to the router's loop after answering.
    eventually("denied reservation counted", || async {
        (r.metric("agentmesh_router_reservation_requests_total{result=\"denied\"}") == 1.0)
            .then_some(())
    })
    .await;

    // Admitted to attach: the reservation is accepted.
    let cred_a = cp.enroll(&member_token, &a.key).await;
    assert!(admitted(
        &a.auth(r.id(), Some(cred_a), Purpose::Attach).await
    ));
    let c2 = circuit.clone();
    a.with_swarm(move |s| s.listen_on(c2).expect("listen on circuit"))
        .await;
    a.wait(
        "reservation accepted",
        |e| matches!(e, Ev::ListenAddr(addr) if addr.iter().any(|p| p == Protocol::P2pCircuit)),
    )
    .await;
    tracing::info!("step: reservation accepted");
    let _echo = a.serve_echo("/test/echo/1");

    // A caller admitted only for transit opens a circuit to A.
    let (mut b, cred_b) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
    assert!(admitted(
        &b.auth(r.id(), Some(cred_b), Purpose::Transit).await
    ));
    let to_a = circuit.clone().with(Protocol::P2p(a.peer_id));
    b.with_swarm(move |s| s.dial(to_a).expect("dial through relay"))
        .await;
    let aid = a.peer_id;
    let ev = b
        .wait(
            "relayed connection to A",
            |e| matches!(e, Ev::Connected { peer, .. } if *peer == aid),
        )
        .await;
    assert!(matches!(ev, Ev::Connected { relayed: true, .. }), "{ev:?}");
    tracing::info!("step: relayed connection up");
    let data: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let back = b.echo(a.peer_id, "/test/echo/1", &data).await;
    assert!(back == data, "1 MiB came back byte-identical");
    eventually("accepted circuit counted", || async {
        (r.metric("agentmesh_router_circuit_requests_total{result=\"accepted\"}") >= 1.0)
            .then_some(())
    })
    .await;

    tracing::info!("step: echo done");
    // An unadmitted caller is denied a circuit.
    let mut c = TestPeer::new();
    c.connect(r.id(), r.addr.clone()).await;
    let to_a = circuit.clone().with(Protocol::P2p(a.peer_id));
    c.with_swarm(move |s| s.dial(to_a).expect("dial through relay"))
        .await;
    eventually("circuit denied", || async {
        (r.metric("agentmesh_router_circuit_requests_total{result=\"denied\"}") >= 1.0)
            .then_some(())
    })
    .await;
    assert!(!c.is_connected(a.peer_id).await);
    r.handle.shutdown().await;
}

/// `agentmesh_router_reservations` counts reservations held: connections
/// that close without one (a denied reservation, a transit member) must not
/// move it (libp2p-relay reports `ReservationClosed` for every closed
/// connection; the gauge read -529 in a ladder run). At the
/// `--relay-max-reservations` cap an admitted member is refused and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_gauge_counts_only_reservations_held() {
    let cp = start_cp(3600).await;
    let r = start_router_with(&cp, |c| c.relay.max_reservations = Some(1)).await;
    let member_token = cp.token(Role::Member).await;
    let circuit: Multiaddr = r
        .addr
        .clone()
        .with(Protocol::P2p(r.id()))
        .with(Protocol::P2pCircuit);
    let open = |r: &Router| {
        ["admitted", "unauthenticated"]
            .iter()
            .map(|s| {
                r.metric(&format!(
                    r#"agentmesh_router_connections{{state="{s}",direction="inbound"}}"#
                ))
            })
            .sum::<f64>()
    };
    {
        // Denied a reservation (not admitted), then gone.
        let mut x = TestPeer::new();
        x.connect(r.id(), r.addr.clone()).await;
        let c2 = circuit.clone();
        x.with_swarm(move |s| s.listen_on(c2).expect("listen on circuit"))
            .await;
        x.wait("reservation refused", |e| {
            matches!(e, Ev::ListenerClosed(_))
        })
        .await;
        // Admitted for transit only, then gone.
        let (t, cred) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
        assert!(admitted(
            &t.auth(r.id(), Some(cred), Purpose::Transit).await
        ));
        eventually("denied reservation counted", || async {
            (r.metric("agentmesh_router_reservation_requests_total{result=\"denied\"}") == 1.0)
                .then_some(())
        })
        .await;
    }
    eventually("both connections closed", || async {
        (open(&r) == 0.0).then_some(())
    })
    .await;

    // One member reserves: the gauge reads exactly one.
    let (a, cred) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
    assert!(admitted(&a.auth(r.id(), Some(cred), Purpose::Attach).await));
    let c2 = circuit.clone();
    a.with_swarm(move |s| s.listen_on(c2).expect("listen on circuit"))
        .await;
    eventually("accepted reservation counted", || async {
        (r.metric("agentmesh_router_reservation_requests_total{result=\"accepted\"}") == 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(r.metric("agentmesh_router_reservations"), 1.0);

    // The cap (1) is reached: another admitted member is refused, counted
    // as a system-wide reservation refusal.
    let (mut b, cred) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
    assert!(admitted(&b.auth(r.id(), Some(cred), Purpose::Attach).await));
    let c2 = circuit.clone();
    b.with_swarm(move |s| s.listen_on(c2).expect("listen on circuit"))
        .await;
    b.wait("reservation refused at the cap", |e| {
        matches!(e, Ev::ListenerClosed(_))
    })
    .await;
    let refused = r#"agentmesh_router_refused_total{resource="reservation",scope="system",protocol="relay_hop"}"#;
    eventually("refusal at the cap counted", || async {
        (r.metric(refused) == 1.0).then_some(())
    })
    .await;
    assert_eq!(r.metric("agentmesh_router_reservations"), 1.0);
    drop(b);

    // It leaves: back to zero, not below.
    drop(a);
    eventually("the reservation ended", || async {
        (open(&r) == 0.0 && r.metric("agentmesh_router_reservations") == 0.0).then_some(())
    })
    .await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_member_is_dropped_and_refused() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let member_token = cp.token(Role::Member).await;
    let (mut a, cred) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
    assert!(admitted(
        &a.auth(r.id(), Some(cred.clone()), Purpose::Attach).await
    ));

    cp.client
        .revoke_node(ADMIN, &a.peer_id, "test")
        .await
        .expect("revoke");
    let rid = r.id();
    a.wait(
        "router drops the revoked member",
        |e| matches!(e, Ev::Closed { peer, remaining: 0 } if *peer == rid),
    )
    .await;
    assert_eq!(r.metric("agentmesh_router_revocations_enforced_total"), 1.0);

    a.connect(r.id(), r.addr.clone()).await;
    let resp = a.auth(r.id(), Some(cred), Purpose::Attach).await;
    assert_eq!(refusal(&resp), Some(AuthRefusal::Revoked), "{resp:?}");
    assert_eq!(r.auth_count("attach", "revoked"), 1.0);
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_credential_is_refused() {
    let cp = start_cp(3).await;
    let r = start_router(&cp).await;
    let member_token = cp.token(Role::Member).await;
    let mut a = TestPeer::new();
    let cred = cp.enroll(&member_token, &a.key).await;
    let exp = peek_claims(&cred).expect("claims").expires_at_unix_secs;
    a.connect(r.id(), r.addr.clone()).await;
    assert!(admitted(
        &a.auth(r.id(), Some(cred.clone()), Purpose::Attach).await
    ));
    // Admission ends with the credential: the router drops the member.
    let rid = r.id();
    a.wait(
        "router drops the member when its credential expires",
        |e| matches!(e, Ev::Closed { peer, remaining: 0 } if *peer == rid),
    )
    .await;
    assert!(unix_now() > exp);
    assert_eq!(
        r.metric("agentmesh_router_connections_closed_total{reason=\"expired\"}"),
        1.0
    );
    // Presenting the expired credential again is refused with the reason.
    a.connect(r.id(), r.addr.clone()).await;
    let resp = a.auth(r.id(), Some(cred), Purpose::Attach).await;
    assert_eq!(refusal(&resp), Some(AuthRefusal::Expired), "{resp:?}");
    assert_eq!(r.auth_count("attach", "expired"), 1.0);
    r.handle.shutdown().await;
}

fn record(
    key: &Keypair,
    services: &[&str],
    routers: &[PeerId],
) -> agentmesh_proto::pb::mesh::SignedRecord {
    let now = unix_now();
    sign_record(
        &ServiceRecord {
            provider: key.public().to_peer_id().to_bytes(),
            services: services.iter().map(|s| s.to_string()).collect(),
            routers: routers.iter().map(|r| r.to_bytes()).collect(),
            issued_at_unix_secs: now,
            expires_at_unix_secs: now + 600,
            credential: None,
        },
        key,
    )
}

fn lookup(service: &str) -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::Lookup(Lookup {
            service: service.into(),
            limit: 10,
        })),
    }
}

fn providers(resp: &agentmesh_proto::pb::mesh::CatalogResponse) -> Vec<PeerId> {
    match &resp.result {
        Some(catalog_response::Result::Providers(p)) => p
            .records
            .iter()
            .filter_map(|r| agentmesh_proto::record::verify_record(r, unix_now()).ok())
            .map(|(_, p)| p)
            .collect(),
        _ => vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_publish_needs_attach_and_records_leave_with_the_member() {
    let cp = start_cp(3600).await;
    let r = start_router(&cp).await;
    let member_token = cp.token(Role::Member).await;
    let mut a = TestPeer::new();
    a.connect(r.id(), r.addr.clone()).await;
    let publish = CatalogRequest {
        op: Some(catalog_request::Op::Publish(record(
            &a.key,
            &["echo"],
            &[r.id()],
        ))),
    };
    // Before admission a peer gets no catalog stream at all: closed
    // unanswered, counted with its reason.
    let before = a.try_catalog(r.id(), publish.clone()).await;
    assert!(before.is_err(), "publish before admission: {before:?}");
    let refused = r#"agentmesh_router_slots_refused_total{budget="catalog",reason="not_admitted"}"#;
    assert_eq!(r.metric(refused), 1.0);
    let cred = cp.enroll(&member_token, &a.key).await;
    assert!(admitted(&a.auth(r.id(), Some(cred), Purpose::Attach).await));
    // A record signed for another provider is refused.
    let other = Keypair::generate_ed25519();
    let resp = a
        .catalog(
            r.id(),
            CatalogRequest {
                op: Some(catalog_request::Op::Publish(record(&other, &["echo"], &[]))),
            },
        )
        .await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Error(_))),
        "{resp:?}"
    );
    let resp = a.catalog(r.id(), publish.clone()).await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Ack(_))),
        "{resp:?}"
    );
    assert_eq!(
        providers(&a.catalog(r.id(), lookup("echo")).await),
        vec![a.peer_id]
    );
    assert_eq!(
        r.metric("agentmesh_router_catalog_requests_total{op=\"publish\",result=\"ok\"}"),
        1.0
    );

    // Withdraw drops it; publishing again restores it.
    let resp = a
        .catalog(
            r.id(),
            CatalogRequest {
                op: Some(catalog_request::Op::Withdraw(
                    agentmesh_proto::pb::mesh::Withdraw {},
                )),
            },
        )
        .await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Ack(_))),
        "{resp:?}"
    );
    assert!(providers(&a.catalog(r.id(), lookup("echo")).await).is_empty());
    let resp = a.catalog(r.id(), publish.clone()).await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Ack(_))),
        "{resp:?}"
    );

    // The member leaves: its record goes with it.
    let b = {
        let (b, cred_b) = TestPeer::enrolled_and_connected(&cp, &member_token, &r).await;
        assert!(admitted(
            &b.auth(r.id(), Some(cred_b), Purpose::Attach).await
        ));
        b
    };
    drop(a);
    eventually("record dropped with its member", || async {
        providers(&b.catalog(r.id(), lookup("echo")).await)
            .is_empty()
            .then_some(())
    })
    .await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_mesh_and_a_lookup_on_one_finds_a_record_on_the_other() {
    let cp = start_cp(3600).await;
    let r1 = start_router(&cp).await;
    let r2 = start_router(&cp).await;
    routers_admit_each_other(&r1, &r2).await;
    assert!(r1.auth_count("router", "admitted") + r2.auth_count("router", "admitted") >= 2.0);

    let member_token = cp.token(Role::Member).await;
    // A publishes on R2.
    let (a, cred_a) = TestPeer::enrolled_and_connected(&cp, &member_token, &r2).await;
    assert!(admitted(
        &a.auth(r2.id(), Some(cred_a), Purpose::Attach).await
    ));
    let resp = a
        .catalog(
            r2.id(),
            CatalogRequest {
                op: Some(catalog_request::Op::Publish(record(
                    &a.key,
                    &["echo"],
                    &[r2.id()],
                ))),
            },
        )
        .await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Ack(_))),
        "{resp:?}"
    );

    // B, attached to R1 only, looks it up there.
    let (b, cred_b) = TestPeer::enrolled_and_connected(&cp, &member_token, &r1).await;
    assert!(admitted(
        &b.auth(r1.id(), Some(cred_b), Purpose::Attach).await
    ));
    let aid = a.peer_id;
    eventually("lookup on R1 finds A's record on R2", || async {
        let found = providers(&b.catalog(r1.id(), lookup("echo")).await);
        tracing::info!(?found, "lookup on R1");
        found.contains(&aid).then_some(())
    })
    .await;
    assert!(
        r2.metric("agentmesh_router_catalog_requests_total{op=\"local_lookup\",result=\"ok\"}")
            >= 1.0
    );
    // Members cannot use the router-only local lookup.
    let resp = b
        .catalog(
            r1.id(),
            CatalogRequest {
                op: Some(catalog_request::Op::LocalLookup(Lookup {
                    service: "echo".into(),
                    limit: 10,
                })),
            },
        )
        .await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Error(_))),
        "{resp:?}"
    );
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}

/// Waits until two routers have admitted each other.
async fn routers_admit_each_other(r1: &Router, r2: &Router) {
    eventually("routers admit each other", || async {
        tracing::info!(
            r1 = r1.metric("agentmesh_router_admitted_routers"),
            r2 = r2.metric("agentmesh_router_admitted_routers"),
            "admitted routers"
        );
        (r1.metric("agentmesh_router_admitted_routers") == 1.0
            && r2.metric("agentmesh_router_admitted_routers") == 1.0)
            .then_some(())
    })
    .await;
}

/// A member enrolled with `token` and admitted on `router` to attach.
async fn attached_member(cp: &Cp, token: &str, router: &Router) -> TestPeer {
    let (p, cred) = TestPeer::enrolled_and_connected(cp, token, router).await;
    assert!(admitted(
        &p.auth(router.id(), Some(cred), Purpose::Attach).await
    ));
    p
}

/// `p` publishes an echo record on `router`, which acknowledges it.
async fn publish_echo(p: &TestPeer, router: &Router) {
    let req = CatalogRequest {
        op: Some(catalog_request::Op::Publish(record(
            &p.key,
            &["echo"],
            &[router.id()],
        ))),
    };
    let resp = p.catalog(router.id(), req).await;
    assert!(
        matches!(resp.result, Some(catalog_response::Result::Ack(_))),
        "{resp:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_answers_local_records_when_the_remote_budget_runs_out() {
    let cp = start_cp(3600).await;
    // R1 may not spend any time on other routers: every lookup there is
    // answered from its own records and counted as partial.
    let r1 = start_router_with(&cp, |c| c.catalog.remote_lookup_budget = Duration::ZERO).await;
    let r2 = start_router(&cp).await;
    routers_admit_each_other(&r1, &r2).await;
    let member_token = cp.token(Role::Member).await;
    // A provides echo on R2, C on R1.
    let a = attached_member(&cp, &member_token, &r2).await;
    publish_echo(&a, &r2).await;
    let c = attached_member(&cp, &member_token, &r1).await;
    publish_echo(&c, &r1).await;

    let b = attached_member(&cp, &member_token, &r1).await;
    let found = providers(&b.catalog(r1.id(), lookup("echo")).await);
    assert_eq!(found, vec![c.peer_id], "R1's own record only");
    assert!(
        r1.metric("agentmesh_router_catalog_requests_total{op=\"lookup\",result=\"partial\"}")
            >= 1.0
    );
    // R2, with the default budget, finds both.
    let aid = a.peer_id;
    let cid = c.peer_id;
    let d = attached_member(&cp, &member_token, &r2).await;
    eventually("a lookup on R2 finds A's and C's records", || async {
        let found = providers(&d.catalog(r2.id(), lookup("echo")).await);
        (found.contains(&aid) && found.contains(&cid)).then_some(())
    })
    .await;
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_reuse_a_recent_provider_search_instead_of_querying_the_dht_again() {
    let cp = start_cp(3600).await;
    // A ttl no test run outlasts, so reuse does not depend on timing.
    let r1 = start_router_with(&cp, |c| {
        c.catalog.provider_cache = Duration::from_secs(3600);
    })
    .await;
    let r2 = start_router(&cp).await;
    routers_admit_each_other(&r1, &r2).await;
    let member_token = cp.token(Role::Member).await;
    let a = attached_member(&cp, &member_token, &r2).await;
    publish_echo(&a, &r2).await;
    let b = attached_member(&cp, &member_token, &r1).await;
    let aid = a.peer_id;
    let started = "agentmesh_router_catalog_provider_searches_total{outcome=\"started\"}";
    let cached = "agentmesh_router_catalog_provider_searches_total{outcome=\"cached\"}";
    assert_eq!(r1.metric(cached), 0.0, "pre-created at 0");
    // Until R2's provider record reaches the DHT the search finds nobody,
    // and an empty answer is not remembered: each attempt searches again.
    eventually("a lookup on R1 finds A's record on R2", || async {
        let found = providers(&b.catalog(r1.id(), lookup("echo")).await);
        found.contains(&aid).then_some(())
    })
    .await;
    let searches = r1.metric(started);
    assert!(searches >= 1.0, "{searches}");
    for _ in 0..5 {
        let found = providers(&b.catalog(r1.id(), lookup("echo")).await);
        assert_eq!(found, vec![aid], "answered through the remembered routers");
    }
    assert_eq!(r1.metric(started), searches, "no new DHT search");
    assert_eq!(r1.metric(cached), 5.0);
    // The gauge is refreshed every second.
    eventually("no provider search left running", || async {
        (r1.metric("agentmesh_router_table_entries{table=\"provider_searches\"}") == 0.0)
            .then_some(())
    })
    .await;
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}
