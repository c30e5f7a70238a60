//! Requests that do not decode, sent by a raw gRPC client (a tonic client
//! with a codec that sends bytes as they are) to every RPC of the
//! ControlPlane service, admin ones included: each is answered
//! INVALID_ARGUMENT naming the method, counted in `rpc_total` and
//! `malformed_requests_total{reason}`, is a failure of its source for the
//! failure guard (enough of them trip it) and spends the source's share of
//! the unauthenticated budget; callers from another source are unaffected.
//! The limiters read a frozen clock, so windows and budgets never refill
//! under the test.

use crate::common::{self, TestDb, client, metric, metrics};

use std::{sync::Arc, time::Duration};

use agentmesh_controlplane::{
    Handle,
    clock::{Clock, SleepFuture},
    spawn_with_clock,
};
use agentmesh_proto::{
    identity::Keypair,
    pb::credential::{Role, TokenKind},
};
use bytes::{Buf, BufMut};
use tonic::{
    Code, Request, Status,
    client::Grpc,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::http::uri::PathAndQuery,
    transport::{Channel, Endpoint},
};

const SERVICE: &str = "agentmesh.controlplane.v1.ControlPlane";
/// Every RPC of the service.
const METHODS: &[&str] = &[
    "Enroll",
    "Refresh",
    "GetKeys",
    "GetDirectory",
    "RouterLease",
    "CreateToken",
    "RevokeNode",
    "RotateKeyNow",
    "ApplyPolicy",
    "GetPolicy",
    "RevokeToken",
    "Watch",
];
/// Field 1 with wire type 7, which does not exist.
const BAD_WIRE_TYPE: &[u8] = &[0x0f, 0x01];
/// Field 1, 5 bytes long, with one byte.
const TRUNCATED: &[u8] = &[0x0a, 0x05, 0x01];

/// A clock that never moves.
#[derive(Debug)]
struct Frozen;

impl Clock for Frozen {
    fn now(&self) -> Duration {
        Duration::from_secs(1_000)
    }
    fn sleep(&self, _: Duration) -> SleepFuture {
        Box::pin(std::future::ready(()))
    }
}

/// Sends and receives bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

/// A raw client whose connection comes from `ip`.
async fn raw_from(h: &Handle, ip: [u8; 4]) -> Grpc<Channel> {
    let ch = Endpoint::from_shared(h.public_url().to_string())
        .expect("url")
        .local_address(Some(std::net::IpAddr::from(ip)))
        .connect_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect");
    Grpc::new(ch)
}

/// Sends `body` as the request of `method`; the refusal.
async fn send(g: &mut Grpc<Channel>, method: &str, body: &[u8]) -> Status {
    g.ready().await.expect("channel ready");
    let path = PathAndQuery::try_from(format!("/{SERVICE}/{method}")).expect("path");
    match g.unary(Request::new(body.to_vec()), path, Raw).await {
        Ok(r) => panic!(
            "{method} answered {:?} to bytes that do not decode",
            r.into_inner()
        ),
        Err(s) => s,
    }
}

fn counter(m: &str, name: &str, labels: &str) -> f64 {
    metric(m, &format!("agentmesh_control_plane_{name}{{{labels}}}"))
        .unwrap_or_else(|| panic!("{name}{{{labels}}} pre-created"))
}

async fn malformed_requests_are_refused_counted_and_trip_the_guard_of_their_source(db: TestDb) {
    let h = spawn_with_clock(db.config(), Arc::new(Frozen))
        .await
        .expect("starts");
    let mut attacker = raw_from(&h, [127, 0, 0, 5]).await;

    // One of each RPC, then one too large: all refused before a handler.
    for method in METHODS {
        let s = send(&mut attacker, method, BAD_WIRE_TYPE).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{method}: {s:?}");
        assert!(
            s.message()
                .contains(&format!("the {method} request could not be read")),
            "{method}: {}",
            s.message()
        );
    }
    let s = send(&mut attacker, "Refresh", &vec![0x0a; 70 * 1024]).await;
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    // 13 failures so far; 47 more reach the guard's 60.
    for i in 0..47 {
        let body = if i % 2 == 0 { TRUNCATED } else { BAD_WIRE_TYPE };
        let s = send(&mut attacker, "Refresh", body).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    }
    // Over its limit: the guard refuses the source's next ones, saying why.
    for method in ["Refresh", "Enroll", "Watch", "RotateKeyNow", "GetKeys"] {
        let s = send(&mut attacker, method, BAD_WIRE_TYPE).await;
        assert_eq!(s.code(), Code::ResourceExhausted, "{method}: {s:?}");
        assert!(s.message().starts_with("failure_guard"), "{}", s.message());
        assert!(s.message().contains("could not be read"), "{}", s.message());
        assert!(agentmesh_controlplane::retry_after(&s).is_some(), "{s:?}");
    }

    // A member from another source is served meanwhile.
    let c = client(&h);
    let tok = common::token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    let key = Keypair::generate_ed25519();
    let cred = c
        .enroll(&tok, &key)
        .await
        .expect("enrolls from another source")
        .credential
        .expect("credential");
    c.refresh(&cred, &key).await.expect("refreshes");

    let m = metrics(&h).await;
    for method in METHODS {
        let expected = match *method {
            "Refresh" => 1.0 + 47.0 + 1.0,
            "Enroll" | "Watch" | "RotateKeyNow" | "GetKeys" => 2.0,
            _ => 1.0,
        };
        assert_eq!(
            counter(
                &m,
                "malformed_requests_total",
                &format!(r#"method="{method}",reason="undecodable""#)
            ),
            expected,
            "{method}"
        );
    }
    assert_eq!(
        counter(
            &m,
            "malformed_requests_total",
            r#"method="Refresh",reason="too_large""#
        ),
        1.0
    );
    assert_eq!(
        counter(
            &m,
            "rpc_total",
            r#"method="Refresh",code="InvalidArgument""#
        ),
        48.0
    );
    assert_eq!(
        counter(&m, "rpc_total", r#"method="Refresh",code="OutOfRange""#),
        1.0
    );
    assert_eq!(
        counter(
            &m,
            "rpc_total",
            r#"method="Refresh",code="ResourceExhausted""#
        ),
        1.0
    );
    assert_eq!(
        counter(
            &m,
            "rpc_total",
            r#"method="CreateToken",code="InvalidArgument""#
        ),
        1.0,
        "admin RPCs too"
    );
    assert_eq!(
        counter(&m, "rpc_total", r#"method="Refresh",code="Internal""#),
        0.0
    );
    assert_eq!(
        counter(&m, "rpc_total", r#"method="Refresh",code="Ok""#),
        1.0
    );
    assert_eq!(
        counter(&m, "limiter_refusals_total", r#"limiter="failure_guard""#),
        5.0
    );
    assert_eq!(
        counter(&m, "source_table_sources", r#"table="failure_guard""#),
        1.0,
        "only the attacker's source failed"
    );
    h.shutdown().await;
}

/// Decoding is work done before the caller is known: a request that does
/// not decode takes a token of its source's unauthenticated share, so a
/// flood of them is held to it like any other unauthenticated request.
#[tokio::test]
async fn malformed_requests_spend_their_source_s_unauthenticated_share() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = agentmesh_controlplane::Config {
        unauth_rate_per_sec: 1,
        unauth_burst: 10,
        ..common::config(dir.path())
    };
    let h = spawn_with_clock(cfg, Arc::new(Frozen))
        .await
        .expect("starts");
    let mut attacker = raw_from(&h, [127, 0, 0, 6]).await;
    for _ in 0..10 {
        let s = send(&mut attacker, "GetKeys", TRUNCATED).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    }
    let s = send(&mut attacker, "GetKeys", TRUNCATED).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(s.message().starts_with("unauth"), "{}", s.message());
    assert!(agentmesh_controlplane::retry_after(&s).is_some());
    let m = metrics(&h).await;
    assert_eq!(
        counter(&m, "limiter_refusals_total", r#"limiter="unauth""#)
            + counter(
                &m,
                "limiter_refusals_total",
                r#"limiter="unauth_source_share""#
            ),
        1.0
    );
    assert_eq!(
        counter(
            &m,
            "malformed_requests_total",
            r#"method="GetKeys",reason="undecodable""#
        ),
        11.0
    );
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    malformed_requests_are_refused_counted_and_trip_the_guard_of_their_source,
);

/// A caller gone mid-request (its connection dropped after the request's
/// headers, before its message) sent nothing malformed: tonic answers it
/// "missing request message", but it is counted `Cancelled`, not
/// `malformed_requests_total`, and costs its source nothing. Members behind
/// one NAT share a source, so a few hundred members restarting or timing
/// out their calls at once would otherwise trip the failure guard for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_mid_request_is_cancelled_not_malformed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = agentmesh_controlplane::Config {
        unauth_rate_per_sec: 1,
        unauth_burst: 2,
        ..common::config(dir.path())
    };
    let h = spawn_with_clock(cfg, Arc::new(Frozen))
        .await
        .expect("starts");
    const GONE: usize = 5;
    for _ in 0..GONE {
        let mut g = raw_from(&h, [127, 0, 0, 7]).await;
        g.ready().await.expect("channel ready");
        let path = PathAndQuery::try_from(format!("/{SERVICE}/GetDirectory")).expect("path");
        // Headers go out; the message never does.
        let body = futures::stream::pending::<Vec<u8>>();
        let call = g.streaming(Request::new(body), path, Raw);
        // Gone once the server has the headers: it answers only at the
        // end of the body, so the call cannot finish first.
        let gone = tokio::time::timeout(Duration::from_millis(300), call).await;
        assert!(gone.is_err(), "answered a request with no message yet");
        drop(g);
    }
    // The server counts each call when it notices the caller gone.
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(&h).await;
        let done: f64 = ["Cancelled", "InvalidArgument", "Internal", "Unknown"]
            .iter()
            .map(|c| {
                counter(
                    &m,
                    "rpc_total",
                    &format!(r#"method="GetDirectory",code="{c}""#),
                )
            })
            .sum();
        if done >= GONE as f64 || tokio::time::Instant::now() > end {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        counter(&m, "rpc_total", r#"method="GetDirectory",code="Cancelled""#),
        GONE as f64,
        "{m}"
    );
    assert_eq!(
        counter(
            &m,
            "malformed_requests_total",
            r#"method="GetDirectory",reason="undecodable""#
        ),
        0.0
    );
    assert_eq!(
        counter(&m, "source_table_sources", r#"table="failure_guard""#),
        0.0,
        "a caller gone is not a failure of its source"
    );
    // Its source's unauthenticated share (2) is untouched: two malformed
    // requests still get INVALID_ARGUMENT, the third is over the share.
    let mut g = raw_from(&h, [127, 0, 0, 7]).await;
    for _ in 0..2 {
        let s = send(&mut g, "GetKeys", TRUNCATED).await;
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    }
    let s = send(&mut g, "GetKeys", TRUNCATED).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    h.shutdown().await;
}
