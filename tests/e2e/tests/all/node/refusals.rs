//! A provider refuses bad callers with a reason and a counter, and bad
//! input costs one stream only: a raw libp2p peer, admitted for transit at
//! the router with its own valid credential, presents forged, foreign,
//! missing and revoked credentials and garbage to a real node.

use super::support;

use std::time::Duration;

use agentmesh_proto::credential::{peek_claims, sign};
use agentmesh_proto::pb::credential::{Credential, Role};
use agentmesh_proto::pb::mesh::{CallRefusal, CallRequest, Purpose, auth_response};
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use support::*;
use tokio::time::Instant;

fn request(credential: Option<Credential>) -> CallRequest {
    CallRequest {
        service: "echo".into(),
        credential,
        probe: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_refuses_bad_credentials_with_reasons_and_counters() {
    let cp = start_cp().await;
    // The router reads revocations slowly here, so the provider sees the
    // revocation before the router drops the revoked caller.
    let r = start_router_with(&cp, "r1", Duration::from_secs(30)).await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |mut base| {
        base.services.expose = vec![("echo".into(), backend)];
        base.control_plane.credential_skew = Duration::ZERO;
        base
    })
    .await;
    ready(&b, "b").await;

    // X: enrolled, admitted for transit, connected to B through the router.
    let mut x = TestPeer::with_key(Keypair::generate_ed25519());
    let cred_x = cp
        .client
        .enroll(&member, &x.key)
        .await
        .expect("enroll x")
        .credential
        .expect("credential");
    let router = r.handle.peer_id();
    let raddr = r.handle.listen_addrs()[0].clone();
    x.connect(router, raddr.clone()).await;
    let admitted = x.auth(router, cred_x.clone(), Purpose::Transit).await;
    assert!(
        matches!(admitted.result, Some(auth_response::Result::Admitted(_))),
        "{admitted:?}"
    );
    let circuit = raddr
        .with(Protocol::P2p(router))
        .with(Protocol::P2pCircuit)
        .with(Protocol::P2p(b.peer_id()));
    x.connect(b.peer_id(), circuit).await;

    // A valid call works.
    let back = x
        .call_echo(b.peer_id(), request(Some(cred_x.clone())), b"valid caller")
        .await;
    assert_eq!(back, b"valid caller");

    // Forged: X's claims signed by a key the control plane never had.
    let forged = sign(
        &peek_claims(&cred_x).expect("claims"),
        &libp2p::identity::ed25519::Keypair::generate(),
    );
    let resp = x.call(b.peer_id(), request(Some(forged))).await;
    assert!(!resp.accepted);
    assert_eq!(resp.refusal, CallRefusal::BadCredential as i32, "{resp:?}");
    assert!(resp.detail.contains("signature"), "{}", resp.detail);

    // Another member's (valid) credential.
    let y = Keypair::generate_ed25519();
    let cred_y = cp
        .client
        .enroll(&member, &y)
        .await
        .expect("enroll y")
        .credential
        .expect("credential");
    let resp = x.call(b.peer_id(), request(Some(cred_y))).await;
    assert_eq!(resp.refusal, CallRefusal::BadCredential as i32, "{resp:?}");
    assert!(resp.detail.contains("another peer"), "{}", resp.detail);

    // No credential; then garbage instead of a request frame.
    let resp = x.call(b.peer_id(), request(None)).await;
    assert_eq!(resp.refusal, CallRefusal::Malformed as i32, "{resp:?}");
    let resp = x
        .call_garbage(b.peer_id(), vec![0x05, 0xff, 0xff, 0xff, 0xff, 0xff])
        .await;
    if let Some(resp) = resp {
        assert_eq!(resp.refusal, CallRefusal::Malformed as i32, "{resp:?}");
    }
    // An unknown service.
    let resp = x
        .call(
            b.peer_id(),
            CallRequest {
                service: "nope".into(),
                credential: Some(cred_x.clone()),
                probe: false,
            },
        )
        .await;
    assert_eq!(resp.refusal, CallRefusal::UnknownService as i32, "{resp:?}");

    // Bad input cost one stream each: the same connection still carries a valid call.
    let back = x
        .call_echo(b.peer_id(), request(Some(cred_x.clone())), b"still fine")
        .await;
    assert_eq!(back, b"still fine");

    // A go-away from anyone but an attached router is ignored and counted.
    let router_before = b.status().borrow().reserved.clone();
    assert!(
        !x.send_goaway(b.peer_id()).await,
        "go-away from a member acknowledged"
    );
    assert_eq!(b.status().borrow().reserved, router_before);
    assert!(b.status().borrow().ready);

    // Revoked: once B's directory poll carries the revocation, X is refused.
    cp.client
        .revoke_node(ADMIN, &x.peer_id, "test")
        .await
        .expect("revoke");
    let end = Instant::now() + DEADLINE;
    loop {
        let resp = x.call(b.peer_id(), request(Some(cred_x.clone()))).await;
        if !resp.accepted {
            assert_eq!(resp.refusal, CallRefusal::Revoked as i32, "{resp:?}");
            break;
        }
        assert!(
            Instant::now() < end,
            "revocation never reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (_, m) = http_get(b.metrics_addr().expect("metrics"), "/metrics").await;
    let series = |r: &str| {
        metric(
            &m,
            &format!(r#"agentmesh_node_calls_total{{direction="inbound",result="{r}"}}"#),
        )
    };
    assert_eq!(series("bad_credential"), 2.0, "{m}");
    assert!(series("malformed") >= 1.0, "{m}");
    assert_eq!(series("unknown_service"), 1.0, "{m}");
    assert_eq!(series("revoked"), 1.0, "{m}");
    assert!(series("accepted") >= 2.0, "{m}");
    assert_eq!(
        metric(&m, r#"agentmesh_node_goaways_total{result="ignored"}"#),
        1.0,
        "{m}"
    );

    b.shutdown().await;
    r.handle.shutdown().await;
}
