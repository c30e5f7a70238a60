//! One mixed-version step of a rolling upgrade (issue 18, "Rolling
//! upgrades"): routers of this build, members of older builds, as raw
//! libp2p peers speaking the old protocols against a real control plane
//! and real routers:
//!
//! - a member from before the push slot (its auth request has no
//!   `policy_push_slot`) still gets every version pushed at once, by every
//!   router it is attached to, as before;
//! - a member from before policies (it does not speak
//!   `/agentmesh/policy/1`) costs its router one failed push, counted, and
//!   stays admitted: its next admission answer carries the policy, which
//!   it ignores.

use super::support;

use agentmesh_hostile::member::Member;
use agentmesh_proto::pb::controlplane::ApplyPolicyRequest;
use agentmesh_proto::pb::mesh::{AuthRequest, PolicyAck, PolicyPush, Purpose, auth_response};
use agentmesh_proto::policy::peek_version;
use agentmesh_proto::protocols::{AUTH, MAX_POLICY_FRAME_BYTES, POLICY};
use futures::StreamExt as _;
use libp2p::StreamProtocol;
use libp2p::identity::Keypair;
use support::cp::{ADMIN, Cp, start_cp_with};
use support::{DEADLINE, TestRouter, eventually};
use tokio::sync::mpsc;

fn policy(granted: &str) -> String {
    format!(
        r#"format = 1
[groups]
members = {{ role = "member" }}
[[owners]]
services = ["*"]
groups = ["members"]
[[grants]]
from = ["members"]
to = ["{granted}"]
"#
    )
}

async fn apply(cp: &Cp, granted: &str) {
    cp.client
        .apply_policy(
            ADMIN,
            ApplyPolicyRequest {
                text: policy(granted),
                dry_run: false,
                author: "mixed step test".into(),
            },
        )
        .await
        .expect("policy applied");
}

fn decisions(r: &TestRouter, decision: &str) -> f64 {
    r.metric(&format!(
        "agentmesh_router_policy_push_decisions_total{{decision=\"{decision}\"}}"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_from_before_the_push_slot_or_before_policies_keep_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, policy("v1")).expect("write policy");
    let cp = start_cp_with(|c| {
        c.policy = Some(file);
        c.policy_allow_all = false;
    })
    .await;
    let r1 = TestRouter::start(&cp, &[("name", "r1")], |_| {}).await;
    let r2 = TestRouter::start(&cp, &[("name", "r2")], |_| {}).await;
    for r in [&r1, &r2] {
        eventually("the router holds version 1", || async {
            (r.metric("agentmesh_router_policy_version") >= 1.0).then_some(())
        })
        .await;
    }

    // Before the push slot: it speaks the push protocol, names no slot,
    // and attaches to both routers. Each push it gets is acked with the
    // version it carries and reported to the test.
    let key = Keypair::generate_ed25519();
    let cred = cp.member_credential(&key).await;
    let old = Member::new(key).expect("member");
    let mut incoming = old
        .control()
        .accept(StreamProtocol::new(POLICY))
        .expect("register the push protocol");
    for r in [&r1, &r2] {
        old.connect(r.id(), r.addr.clone(), DEADLINE)
            .await
            .expect("connected");
        old.authenticate(r.id(), cred.clone(), Purpose::Attach, DEADLINE)
            .await
            .expect("admitted without a push slot");
    }
    let (bodies_tx, mut bodies) = mpsc::channel::<(libp2p::PeerId, u64)>(8);
    let answering = tokio::spawn(async move {
        while let Some((router, mut s)) = incoming.next().await {
            let push: PolicyPush =
                agentmesh_wire::frame::read_frame(&mut s, MAX_POLICY_FRAME_BYTES)
                    .await
                    .expect("push frame");
            let (epoch, version) = push
                .policy
                .as_ref()
                .and_then(peek_version)
                .expect("a member with no slot is sent the body");
            let ack = PolicyAck {
                epoch,
                version,
                ..Default::default()
            };
            agentmesh_wire::frame::write_frame(&mut s, &ack)
                .await
                .expect("ack");
            let _ = bodies_tx.send((router.peer, version)).await;
        }
    });

    // Before policies: no push protocol at all, attached to r1 only.
    let key = Keypair::generate_ed25519();
    let ancient_cred = cp.member_credential(&key).await;
    let ancient = Member::new(key).expect("member");
    ancient
        .connect(r1.id(), r1.addr.clone(), DEADLINE)
        .await
        .expect("connected");
    ancient
        .authenticate(r1.id(), ancient_cred.clone(), Purpose::Attach, DEADLINE)
        .await
        .expect("admitted");

    apply(&cp, "v2").await;
    let mut from = Vec::new();
    for _ in 0..2 {
        let (router, version) = tokio::time::timeout(DEADLINE, bodies.recv())
            .await
            .expect("pushed in time")
            .expect("a push");
        assert_eq!(version, 2);
        from.push(router);
    }
    from.sort();
    let mut both = vec![r1.id(), r2.id()];
    both.sort();
    assert_eq!(from, both, "each router pushed it at once, as before");
    // Each router counts once the ack (or the failure) is in.
    let acked = |r: &TestRouter| r.metric("agentmesh_router_policy_push_total{outcome=\"acked\"}");
    let failed =
        |r: &TestRouter| r.metric("agentmesh_router_policy_push_total{outcome=\"failed\"}");
    eventually("both routers counted their pushes", || async {
        (decisions(&r1, "pushed") >= 2.0 && decisions(&r2, "pushed") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(decisions(&r1, "pushed"), 2.0, "both of r1's members");
    assert_eq!(decisions(&r2, "pushed"), 1.0);
    assert_eq!(decisions(&r1, "probed") + decisions(&r2, "probed"), 0.0);
    assert_eq!(
        (acked(&r1), failed(&r1)),
        (1.0, 1.0),
        "the ancient one's failed"
    );
    assert_eq!((acked(&r2), failed(&r2)), (1.0, 0.0));

    // The member from before policies is still attached, and re-admitted
    // as before; the answer carries the policy (it ignores the field).
    assert!(ancient.is_connected(&r1.id()), "not cut off for it");
    let mut s = ancient
        .control()
        .open_stream(r1.id(), StreamProtocol::new(AUTH))
        .await
        .expect("auth stream");
    let req = AuthRequest {
        credential: Some(ancient_cred),
        purpose: Purpose::Attach as i32,
        ..Default::default()
    };
    agentmesh_wire::frame::write_frame(&mut s, &req)
        .await
        .expect("auth request");
    let resp: agentmesh_proto::pb::mesh::AuthResponse =
        agentmesh_wire::frame::read_frame(&mut s, MAX_POLICY_FRAME_BYTES)
            .await
            .expect("auth answer");
    let Some(auth_response::Result::Admitted(a)) = resp.result else {
        panic!("not admitted: {resp:?}");
    };
    let carried = a
        .policy
        .and_then(|p| p.policy)
        .expect("the policy rides along");
    assert_eq!(peek_version(&carried).map(|v| v.1), Some(2));
    answering.abort();
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}
