//! A compromised router against the revocations members enforce
//! (`docs/security.md`, threat 3): a real control plane, two honest real
//! routers, an honest provider and a member attached to K = 3 routers, the
//! third the hostile harness's lying router (a real router credential from
//! a router token, its address leased in the directory, 127.0.0.70).
//!
//! The lying router tells the member, in its admission answer and in
//! pushes on `/agentmesh/policy/1`:
//! - a list naming the honest provider, newer than the control plane's,
//!   under the control plane's key id but signed by another key, then the
//!   same list with no signature at all: the member refuses both
//!   (`bad_signature`, counted) and still calls the provider; before
//!   signed lists a member added any pushed revocation to its own and
//!   skipped the provider (`providers_skipped{reason="revoked"}`);
//! - the control plane's own list from before a token was revoked,
//!   genuinely signed (a rollback): the member refuses it (`stale`,
//!   counted), keeps the newer list and still refuses the revoked token's
//!   member.
//!
//! The member reads the directory once, at start, so what it learns after
//! comes through routers.

use super::support;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use agentmesh_hostile::lying_router::{LyingRouter, Setup};
use agentmesh_node::NodeHandle;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::identity::ed25519;
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{
    Revocation, RevocationList, Role, SignedRevocations, TokenKind,
};
use agentmesh_proto::revocations::{sign_revocations, verify_revocations};
use agentmesh_proto::unix_now;
use libp2p::identity::Keypair;
use support::*;

/// Where the lying router listens.
const LIAR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 70);

async fn node_metric(node: &NodeHandle, series: &str) -> f64 {
    let text = http_get(node.metrics_addr().expect("metrics addr"), "/metrics")
        .await
        .1;
    metric(&text, series)
}

fn ignored(reason: &str) -> String {
    format!("agentmesh_node_revocations_ignored_total{{reason=\"{reason}\"}}")
}

/// The control plane's signed list now, and what it says.
async fn signed_list(cp: &Cp) -> (SignedRevocations, RevocationList) {
    let trust = Trust::new(&cp.client.get_keys().await.expect("keys"));
    let signed = cp
        .client
        .get_directory()
        .await
        .expect("directory")
        .revocations
        .expect("the directory carries the list");
    let list =
        verify_revocations(&signed, &trust, unix_now()).expect("signed by the control plane");
    (signed, list)
}

/// The lying router at [`LIAR`], enrolled with a router token of `cp`,
/// leased in its directory, telling `lie` (if any).
async fn start_liar(cp: &Cp, lie: Option<SignedRevocations>) -> LyingRouter {
    LyingRouter::start(
        Setup {
            control_plane: cp.url.clone(),
            token: cp.token(Role::Router).await,
            listen_ip: IpAddr::V4(LIAR),
            step_deadline: DEADLINE,
        },
        lie,
    )
    .await
    .expect("the lying router enrolls, listens and leases")
}

/// A member token: (secret, id).
async fn member_token(cp: &Cp) -> (String, String) {
    let r = cp
        .client
        .create_token(
            ADMIN,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Member as i32,
                labels: vec![],
                max_uses: 10,
                ttl_secs: 3600,
            },
        )
        .await
        .expect("create token");
    (r.token, r.token_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_router_can_neither_forge_nor_roll_back_a_members_revocations() {
    let cp = start_cp().await;
    let (_r1, _r2) = (start_router(&cp, "r1").await, start_router(&cp, "r2").await);
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    // The honest provider holds the two honest routers (the liar is not
    // in the directory yet).
    let (provider, _pdir) = spawn_node(&cp, &member, "spawn provider", |mut c| {
        c.routers.count = 2;
        c.services.expose = vec![("echo".into(), backend)];
        c
    })
    .await;
    ready(&provider, "provider").await;
    eventually("the provider on both honest routers", || async {
        on_k(&provider, &Default::default()).then_some(())
    })
    .await;

    // A member of a token, and the list before and after the token's
    // revocation.
    let (bad, bad_id) = member_token(&cp).await;
    let revoked = cp.enroll(&bad, &Keypair::generate_ed25519()).await;
    let (before, old) = signed_list(&cp).await;
    cp.client
        .revoke_token(ADMIN, &bad_id, "leaked")
        .await
        .expect("revoked");
    let (_, now_list) = signed_list(&cp).await;
    assert_eq!(now_list.epoch, old.epoch);
    assert!(now_list.generation > old.generation);
    assert!(now_list.entries.iter().any(|r| r.token_id == bad_id));
    assert!(!old.entries.iter().any(|r| r.token_id == bad_id));
    let current = (now_list.epoch, now_list.generation);

    // The forgery: newer than the control plane's, naming the provider,
    // under its key id, signed by a key that is not the control plane's.
    let mut forged_list = now_list.clone();
    forged_list.generation += 100;
    forged_list.issued_at_unix_secs = unix_now();
    forged_list.entries.push(Revocation {
        peer_id: provider.peer_id().to_bytes(),
        until_unix_secs: unix_now() + 3600,
        reason: "forged".into(),
        token_id: String::new(),
    });
    let forged = sign_revocations(&forged_list, &ed25519::Keypair::generate());
    let liar = start_liar(&cp, Some(forged.clone())).await;

    // The member attaches to all three routers; the liar's admission
    // answer carries the forgery.
    let (victim, _vdir) = spawn_node(&cp, &member, "spawn victim", |mut c| {
        c.routers.count = 3;
        c.control_plane.directory_interval = Duration::from_secs(3600);
        c
    })
    .await;
    ready(&victim, "victim").await;
    liar.admitted(victim.peer_id(), DEADLINE)
        .await
        .expect("the victim attached to the liar");
    eventually("the forged admission answer refused", || async {
        (node_metric(&victim, &ignored("bad_signature")).await >= 1.0).then_some(())
    })
    .await;
    // Pushed, forged and then unsigned.
    let ack = liar.push(victim.peer_id(), DEADLINE).await.expect("acked");
    assert_eq!(ack.revocations_ignored, "bad_signature", "{ack:?}");
    liar.tell(SignedRevocations {
        list: forged.list.clone(),
        signature: Vec::new(),
    });
    let ack = liar.push(victim.peer_id(), DEADLINE).await.expect("acked");
    assert_eq!(ack.revocations_ignored, "bad_signature", "{ack:?}");
    assert_eq!(
        (ack.revocations_epoch, ack.revocations_generation),
        current,
        "the member holds the control plane's list"
    );
    assert!(node_metric(&victim, &ignored("bad_signature")).await >= 3.0);
    // The honest provider is still called.
    let mut s = call_until_found(&victim, "echo").await;
    assert_eq!(exchange(&mut s, b"honest").await.expect("echo"), b"honest");
    let skipped = r#"agentmesh_node_providers_skipped_total{reason="revoked"}"#;
    assert_eq!(node_metric(&victim, skipped).await, 0.0);

    // The rollback: the control plane's own list from before the token's
    // revocation.
    liar.tell(before);
    let ack = liar.push(victim.peer_id(), DEADLINE).await.expect("acked");
    assert_eq!(ack.revocations_ignored, "stale", "{ack:?}");
    assert_eq!((ack.revocations_epoch, ack.revocations_generation), current);
    assert_eq!(victim.revocations_generation(), current);
    assert!(node_metric(&victim, &ignored("stale")).await >= 1.0);
    assert!(
        victim.refuses_as_revoked(&revoked),
        "the revoked token's member stays revoked"
    );
    let mut s = call_until_found(&victim, "echo").await;
    assert_eq!(exchange(&mut s, b"still").await.expect("echo"), b"still");

    let report = liar.report();
    tracing::info!(%report, "lying router");
    assert!(report.admitted >= 1 && report.acks == 3, "{report}");
    assert_eq!(report.acks_refusing_list, 3, "{report}");
    cp.handle.shutdown().await;
}

/// A router that refuses every member as revoked (a lie) costs a member one
/// directory fetch: the control plane's signed list there does not name
/// it, so it neither believes it is revoked nor stops asking routers; it
/// holds the honest router and passes over only the liar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_lying_that_a_member_is_revoked_keeps_it_from_no_other_router() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let liar = start_liar(&cp, None).await;
    liar.refuse_as_revoked();
    let member = cp.token(Role::Member).await;
    // K = 2: a first start asks both routers at once.
    let (victim, _vdir) = spawn_node(&cp, &member, "spawn victim", |mut c| {
        c.routers.count = 2;
        c
    })
    .await;
    ready(&victim, "victim").await;
    eventually("the liar refused the victim as revoked", || async {
        (liar.report().refused_as_revoked >= 1).then_some(())
    })
    .await;
    eventually("the victim counted the liar's refusal", || async {
        let n = node_metric(&victim, "agentmesh_node_router_revoked_refusals_total").await;
        (n >= 1.0).then_some(())
    })
    .await;
    eventually("the honest router holds the victim", || async {
        (r1.metric("agentmesh_router_attached_members") == 1.0).then_some(())
    })
    .await;
    assert_eq!(
        node_metric(&victim, "agentmesh_node_credential_revoked").await,
        0.0,
        "a router's word made the member believe it is revoked"
    );
    assert!(victim.is_ready(), "the victim lost its honest router");
    let report = liar.report();
    assert_eq!(report.admitted, 0, "{report}");
    cp.handle.shutdown().await;
}
