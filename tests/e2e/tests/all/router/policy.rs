//! The router's policy enforcement (issue 18) against a real control plane
//! started with a policy file, a real router, and members that are raw
//! libp2p peers speaking our protocols (the node's own side of the policy
//! is built elsewhere; these tests depend on none of it):
//!
//! - an impostor member publishing a service its groups do not own (with
//!   its own credential, a stolen one, or none) is refused at the router,
//!   counted, and a lookup never returns it; the owner's record is served;
//! - a circuit between two members with no grant between them is refused
//!   (counted), one with a grant carries bytes, and once a new policy
//!   removes the grant the live circuit is closed (counted);
//! - a policy applied at the control plane reaches the router (directory
//!   poll: this branch's control plane answers Watch UNIMPLEMENTED), which
//!   pushes it to its attached member over `/agentmesh/policy/1`; the
//!   member (a test client that verifies the push and answers an ack)
//!   acknowledges it and the router counts the ack; a member attaching
//!   with no policy gets it in its admission answer.

use super::support;

use std::collections::BTreeMap;

use agentmesh_hostile::member::Member;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::enforce::HeldPolicy;
use agentmesh_proto::pb::controlplane::ApplyPolicyRequest;
use agentmesh_proto::pb::credential::{Credential, Role};
use agentmesh_proto::pb::mesh::{
    AuthRequest, AuthResponse, CatalogRequest, CatalogResponse, Lookup, PolicyAck, PolicyPush,
    Purpose, ServiceRecord, auth_response, catalog_request, catalog_response,
};
use agentmesh_proto::protocols::{AUTH, MAX_POLICY_FRAME_BYTES, POLICY};
use agentmesh_proto::record::sign_record;
use agentmesh_proto::unix_now;
use futures::StreamExt as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use support::cp::{ADMIN, Cp, start_cp_with};
use support::{Ev, TestPeer, TestRouter, eventually};

/// Payments owns `payments/*`; web may call `payments/api`; ops may call
/// nothing.
const V1: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }
ops = { labels = { team = "ops" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api"]
"#;

/// V1 without the grant.
const V2: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }
ops = { labels = { team = "ops" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]
"#;

/// A control plane started with [`V1`] from a file (no allow-all), and
/// the temp dir holding the file.
async fn cp_with_v1() -> (Cp, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, V1).expect("write policy");
    let cp = start_cp_with(|c| {
        c.policy = Some(file);
        c.policy_allow_all = false;
    })
    .await;
    (cp, dir)
}

/// A router that holds the control plane's policy (at least `version`).
async fn router_holding(
    cp: &Cp,
    version: f64,
    adjust: impl FnOnce(&mut agentmesh_router::Config),
) -> TestRouter {
    let r = TestRouter::start(cp, &[], adjust).await;
    wait_version(&r, version).await;
    r
}

async fn wait_version(r: &TestRouter, version: f64) {
    eventually("the router holds the policy", || async {
        (r.metric("agentmesh_router_policy_version") >= version).then_some(())
    })
    .await;
}

async fn team_token(cp: &Cp, team: &str) -> String {
    let labels = BTreeMap::from([("team".to_string(), team.to_string())]);
    cp.token_labelled(Role::Member, &labels).await
}

fn admitted(resp: &AuthResponse) -> bool {
    matches!(resp.result, Some(auth_response::Result::Admitted(_)))
}

/// A member of `team`, connected to `r` and admitted with `purpose`.
async fn member(cp: &Cp, r: &TestRouter, team: &str, purpose: Purpose) -> (TestPeer, Credential) {
    let token = team_token(cp, team).await;
    let (peer, cred) = TestPeer::enrolled_and_connected(cp, &token, r).await;
    let resp = peer.auth(r.id(), Some(cred.clone()), purpose).await;
    assert!(admitted(&resp), "{team} admitted: {resp:?}");
    (peer, cred)
}

/// A record of `services` by `key`'s peer carrying `credential`, valid
/// five minutes (well within any credential's life).
fn record(key: &Keypair, services: &[&str], credential: Option<Credential>) -> CatalogRequest {
    let now = unix_now();
    let r = ServiceRecord {
        provider: key.public().to_peer_id().to_bytes(),
        services: services.iter().map(|s| s.to_string()).collect(),
        issued_at_unix_secs: now,
        expires_at_unix_secs: now + 300,
        credential,
        ..Default::default()
    };
    CatalogRequest {
        op: Some(catalog_request::Op::Publish(sign_record(&r, key))),
    }
}

fn refusal(resp: &CatalogResponse) -> Option<&str> {
    match &resp.result {
        Some(catalog_response::Result::Error(e)) => Some(&e.reason),
        _ => None,
    }
}

fn providers(resp: &CatalogResponse) -> Vec<PeerId> {
    match &resp.result {
        Some(catalog_response::Result::Providers(l)) => l
            .records
            .iter()
            .filter_map(|r| {
                let (rec, _) = agentmesh_proto::record::verify_record(r, unix_now()).ok()?;
                PeerId::from_bytes(&rec.provider).ok()
            })
            .collect(),
        _ => vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impostor_publishing_a_service_it_does_not_own_is_refused_and_never_served() {
    let (cp, _dir) = cp_with_v1().await;
    let r = router_holding(&cp, 1.0, |_| {}).await;
    let (owner, owner_cred) = member(&cp, &r, "payments", Purpose::Attach).await;
    let (impostor, impostor_cred) = member(&cp, &r, "web", Purpose::Attach).await;
    let refused = |reason: &str| {
        r.metric(&format!(
            "agentmesh_router_catalog_refused_total{{reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(refused("not_owner"), 0.0, "pre-created at 0");

    // Its own credential: web owns nothing.
    let resp = impostor
        .catalog(
            r.id(),
            record(&impostor.key, &["payments/api"], Some(impostor_cred)),
        )
        .await;
    let why = refusal(&resp).expect("refused");
    assert!(why.starts_with("not_owner"), "{why}");
    // The owner's credential, stolen: not the publisher's.
    let resp = impostor
        .catalog(
            r.id(),
            record(&impostor.key, &["payments/api"], Some(owner_cred.clone())),
        )
        .await;
    let why = refusal(&resp).expect("refused");
    assert!(why.starts_with("wrong_subject"), "{why}");
    // No credential (as an old provider would publish): judged by the
    // claims it was admitted with.
    let resp = impostor
        .catalog(r.id(), record(&impostor.key, &["payments/api"], None))
        .await;
    let why = refusal(&resp).expect("refused");
    assert!(why.starts_with("not_owner"), "{why}");
    assert_eq!(refused("not_owner"), 2.0);
    assert_eq!(refused("wrong_subject"), 1.0);

    // The owner publishes; a lookup returns the owner only.
    let resp = owner
        .catalog(
            r.id(),
            record(&owner.key, &["payments/api"], Some(owner_cred)),
        )
        .await;
    assert!(
        refusal(&resp).is_none(),
        "owner's record accepted: {resp:?}"
    );
    let lookup = CatalogRequest {
        op: Some(catalog_request::Op::Lookup(Lookup {
            service: "payments/api".into(),
            limit: 0,
        })),
    };
    let found = providers(&impostor.catalog(r.id(), lookup).await);
    assert_eq!(found, vec![owner.peer_id], "only the owner is served");
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_without_a_grant_is_refused_and_a_removed_grant_closes_the_live_one() {
    let (cp, _dir) = cp_with_v1().await;
    let r = router_holding(&cp, 1.0, |_| {}).await;
    let v1 = r.metric("agentmesh_router_policy_version");
    let circuit: Multiaddr = r
        .addr
        .clone()
        .with(Protocol::P2p(r.id()))
        .with(Protocol::P2pCircuit);
    // The destination: payments, with a reservation and an echo service.
    let (mut pay, _) = member(&cp, &r, "payments", Purpose::Attach).await;
    let c = circuit.clone();
    pay.with_swarm(move |s| s.listen_on(c).expect("listen on circuit"))
        .await;
    pay.wait(
        "reservation accepted",
        |e| matches!(e, Ev::ListenAddr(a) if a.iter().any(|p| p == Protocol::P2pCircuit)),
    )
    .await;
    let _echo = pay.serve_echo("/test/echo/1");
    let to = pay.peer_id;
    let not_granted =
        || r.metric("agentmesh_router_policy_circuits_refused_total{reason=\"not_granted\"}");
    let closed =
        || r.metric("agentmesh_router_policy_circuits_closed_total{reason=\"not_granted\"}");
    assert_eq!((not_granted(), closed()), (0.0, 0.0), "pre-created at 0");

    // ops is granted nothing payments owns: refused, counted.
    let (mut ops, _) = member(&cp, &r, "ops", Purpose::Transit).await;
    ops.dial_through(&circuit, to).await;
    let ev = ops
        .wait(
            "the circuit from ops refused",
            |e| matches!(e, Ev::DialFailed { peer: Some(p), .. } if *p == to),
        )
        .await;
    // Refused as a policy refusal (the relay's HOP status
    // PERMISSION_DENIED), not a broken exchange (MALFORMED_MESSAGE).
    let Ev::DialFailed { error, .. } = ev else {
        unreachable!()
    };
    assert!(error.contains("Remote denied permission"), "{error}");
    assert!(!error.contains("MALFORMED"), "{error}");
    assert!(!ops.is_connected(to).await);
    eventually("the refusal counted", || async {
        (not_granted() >= 1.0).then_some(())
    })
    .await;

    // web is granted payments/api: the circuit carries bytes.
    let (mut web, _) = member(&cp, &r, "web", Purpose::Transit).await;
    web.dial_through(&circuit, to).await;
    let ev = web
        .wait(
            "relayed connection to payments",
            |e| matches!(e, Ev::Connected { peer, .. } if *peer == to),
        )
        .await;
    assert!(matches!(ev, Ev::Connected { relayed: true, .. }), "{ev:?}");
    let data = vec![7u8; 4096];
    assert_eq!(web.echo(to, "/test/echo/1", &data).await, data);
    assert_eq!(closed(), 0.0);

    // The grant is removed at the control plane: the live circuit closes.
    apply(&cp, V2).await;
    wait_version(&r, v1 + 1.0).await;
    web.wait(
        "the circuit closed",
        |e| matches!(e, Ev::Closed { peer, .. } if *peer == to),
    )
    .await;
    assert!(closed() >= 1.0, "the cut counted");
    assert!(!web.is_connected(to).await);
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_applied_at_the_control_plane_is_pushed_to_members_and_their_ack_counted() {
    let (cp, _dir) = cp_with_v1().await;
    // A short push deadline, so the silent member below costs little.
    let r = router_holding(&cp, 1.0, |c| {
        c.policy.push_deadline = std::time::Duration::from_millis(500);
    })
    .await;
    let v1 = r.metric("agentmesh_router_policy_version");
    let acked = || r.metric("agentmesh_router_policy_push_total{outcome=\"acked\"}");
    assert_eq!(acked(), 0.0, "pre-created at 0");
    let trust = Trust::new(&cp.client.get_keys().await.expect("keys"));

    // A member that speaks the push protocol: it verifies each push with
    // the control plane's keys and acks the version it then holds.
    let key = Keypair::generate_ed25519();
    let cred = cp.member_credential(&key).await;
    let m = Member::new(key).expect("member");
    m.connect(r.id(), r.addr.clone(), support::DEADLINE)
        .await
        .expect("connected");
    let mut incoming = m
        .control()
        .accept(StreamProtocol::new(POLICY))
        .expect("register the push protocol");
    // Attaching with no policy: the admission answer carries it.
    let mut s = m
        .control()
        .open_stream(r.id(), StreamProtocol::new(AUTH))
        .await
        .expect("auth stream");
    let req = AuthRequest {
        credential: Some(cred),
        purpose: Purpose::Attach as i32,
        ..Default::default()
    };
    agentmesh_wire::frame::write_frame(&mut s, &req)
        .await
        .expect("auth request");
    let resp: AuthResponse = agentmesh_wire::frame::read_frame(&mut s, MAX_POLICY_FRAME_BYTES)
        .await
        .expect("auth answer");
    let Some(auth_response::Result::Admitted(a)) = resp.result else {
        panic!("not admitted: {resp:?}");
    };
    let signed = a
        .policy
        .and_then(|p| p.policy)
        .expect("the admission carries the policy");
    let mut held = HeldPolicy::accept(&signed, &trust, None).expect("it verifies");
    assert_eq!(held.version as f64, v1);

    // A hostile member takes its push stream and never answers: its push
    // ends at the deadline (counted), the honest member's is unaffected.
    let silent_key = Keypair::generate_ed25519();
    let silent_cred = cp.member_credential(&silent_key).await;
    let silent = Member::new(silent_key).expect("member");
    silent
        .connect(r.id(), r.addr.clone(), support::DEADLINE)
        .await
        .expect("connected");
    let mut silent_in = silent
        .control()
        .accept(StreamProtocol::new(POLICY))
        .expect("register the push protocol");
    silent
        .authenticate(r.id(), silent_cred, Purpose::Attach, support::DEADLINE)
        .await
        .expect("admitted");
    let held_streams = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(s) = silent_in.next().await {
            held.push(s);
        }
    });
    let timeouts = || r.metric("agentmesh_router_policy_push_total{outcome=\"timeout\"}");
    assert_eq!(timeouts(), 0.0);

    // A new version at the control plane reaches the router, then the member.
    apply(&cp, V2).await;
    wait_version(&r, v1 + 1.0).await;
    let (_, mut s) = tokio::time::timeout(support::DEADLINE, incoming.next())
        .await
        .expect("pushed in time")
        .expect("a push stream");
    let push: PolicyPush = agentmesh_wire::frame::read_frame(&mut s, MAX_POLICY_FRAME_BYTES)
        .await
        .expect("push frame");
    let signed = push.policy.expect("the push carries the policy");
    held = HeldPolicy::accept(&signed, &trust, Some(&held)).expect("newer and verified");
    assert_eq!(held.version as f64, v1 + 1.0);
    let ack = PolicyAck {
        epoch: held.epoch,
        version: held.version,
        ..Default::default()
    };
    agentmesh_wire::frame::write_frame(&mut s, &ack)
        .await
        .expect("ack");
    eventually("the ack counted", || async {
        (acked() >= 1.0).then_some(())
    })
    .await;
    // The router holds the control plane's watch (the poll stays as the
    // fallback, so either may have brought the version first).
    eventually("the router holds the watch", || async {
        (r.metric("agentmesh_router_policy_watch_up") == 1.0).then_some(())
    })
    .await;
    eventually("the silent member's push timed out", || async {
        (timeouts() >= 1.0).then_some(())
    })
    .await;
    assert_eq!(
        r.metric("agentmesh_router_policy_push_in_flight"),
        0.0,
        "nothing left open"
    );
    held_streams.abort();
    // Both versions were applied, each by whichever of the watch and the
    // poll brought it first.
    assert!(
        r.metric("agentmesh_router_policy_applied_total{source=\"directory\"}")
            + r.metric("agentmesh_router_policy_applied_total{source=\"watch\"}")
            >= 2.0
    );
    assert_eq!(
        r.metric("agentmesh_router_policy_push_lag_seconds_count"),
        acked(),
        "a lag recorded per ack"
    );
    r.handle.shutdown().await;
}

/// Applies `text` as the next policy version (admin).
async fn apply(cp: &Cp, text: &str) {
    cp.client
        .apply_policy(
            ADMIN,
            ApplyPolicyRequest {
                text: text.into(),
                dry_run: false,
                author: "router policy test".into(),
            },
        )
        .await
        .expect("policy applied");
}
