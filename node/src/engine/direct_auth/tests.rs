//! The hello's verification and the judgement of a direct connection, as
//! a lying or revoked peer meets them.

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{Trust, VerifiedClaims, sign};
use agentmesh_proto::pb::credential::{Claims, Credential, Revocation, Role};
use agentmesh_proto::testing::{TestCp, member_claims};
use libp2p::PeerId;
use libp2p::identity::ed25519;

use super::{HelloRefused, judge, verify_hello};

const NOW: i64 = 1_000_000;

/// Web may call payments' API; nobody may call anything of ops.
const POLICY: &str = r#"
format = 1

[groups]
payments = { role = "member", labels = { team = "payments" } }
web = { role = "member", labels = { team = "web" } }
ops = { role = "member", labels = { team = "ops" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[owners]]
services = ["ops/*"]
groups = ["ops"]

[[grants]]
from = ["web"]
to = ["payments/api"]
"#;

/// The control plane's trust (a copy each test may change) and key.
fn control_plane() -> (TestCp, Trust) {
    let fx = TestCp::new();
    let trust = fx.trust.clone();
    (fx, trust)
}

/// A credential's claims valid around [`NOW`], with `role`.
fn claims(peer: &PeerId, team: &str, role: Role, token: &str) -> Claims {
    let mut c = member_claims(peer, team, token, NOW - 10..NOW + 3600);
    c.role = role as i32;
    c
}

fn member(cp: &TestCp, team: &str, token: &str) -> (PeerId, Credential) {
    let peer = PeerId::random();
    (peer, cp.member(&peer, team, token, NOW - 10..NOW + 3600))
}

fn closed(r: Result<VerifiedClaims, HelloRefused>) -> &'static str {
    match r {
        Err(HelloRefused::Closed(reason, _)) => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_hello_verifies_only_a_members_own_valid_credential() {
    let (cp, trust) = control_plane();
    let (peer, cred) = member(&cp, "web", "t1");
    let v = verify_hello(&cred, &trust, &peer, NOW, 0).expect("valid");
    assert_eq!(v.peer, peer);
    // Another member's credential, replayed by a peer holding a key of its
    // own: the subject is not the PeerId the connection proved.
    let thief = PeerId::random();
    assert_eq!(
        closed(verify_hello(&cred, &trust, &thief, NOW, 0)),
        "unauthenticated"
    );
    // Forged: claims signed by a key that is not the control plane's.
    let forger = ed25519::Keypair::generate();
    let forged = sign(&claims(&peer, "payments", Role::Member, "t1"), &forger);
    assert_eq!(
        closed(verify_hello(&forged, &trust, &peer, NOW, 0)),
        "unauthenticated"
    );
    // Altered after signing.
    let mut altered = cred.clone();
    altered.claims.push(0);
    assert_eq!(
        closed(verify_hello(&altered, &trust, &peer, NOW, 0)),
        "unauthenticated"
    );
    // Expired.
    assert_eq!(
        closed(verify_hello(&cred, &trust, &peer, NOW + 3601, 0)),
        "unauthenticated"
    );
    // A router's credential is not a member's.
    let router = sign(&claims(&peer, "web", Role::Router, "t1"), &cp.key);
    assert_eq!(
        closed(verify_hello(&router, &trust, &peer, NOW, 0)),
        "unauthenticated"
    );
    // Garbage.
    let junk = Credential {
        claims: vec![0xff; 40],
        signature: vec![1; 64],
    };
    assert_eq!(
        closed(verify_hello(&junk, &trust, &peer, NOW, 0)),
        "unauthenticated"
    );
    // A key we do not know yet: fetch the keys, then judge.
    let mut unknown = claims(&peer, "web", Role::Member, "t1");
    unknown.key_id = "k2".into();
    assert_eq!(
        verify_hello(&sign(&unknown, &cp.key), &trust, &peer, NOW, 0),
        Err(HelloRefused::UnknownKey)
    );
}

#[test]
fn a_revoked_node_or_token_is_refused_at_the_hello() {
    let (cp, mut trust) = control_plane();
    let (peer, cred) = member(&cp, "web", "t1");
    let (other, of_token) = member(&cp, "web", "t-bad");
    trust.set_revocations(&[
        Revocation {
            peer_id: peer.to_bytes(),
            until_unix_secs: NOW + 100,
            reason: "lost".into(),
            token_id: String::new(),
        },
        Revocation {
            peer_id: vec![],
            until_unix_secs: NOW + 100,
            reason: "leaked".into(),
            token_id: "t-bad".into(),
        },
    ]);
    assert_eq!(
        closed(verify_hello(&cred, &trust, &peer, NOW, 0)),
        "revoked"
    );
    assert_eq!(
        closed(verify_hello(&of_token, &trust, &other, NOW, 0)),
        "revoked"
    );
}

#[test]
fn a_direct_connection_stays_while_either_side_may_call_the_other_and_nobody_is_revoked() {
    let (cp, mut trust) = control_plane();
    let policy = Policy::parse(POLICY).expect("policy");
    let verified = |team: &str, token: &str| {
        let (peer, cred) = member(&cp, team, token);
        verify_hello(&cred, &trust, &peer, NOW, 0).expect("valid")
    };
    let (web, payments, ops) = (
        verified("web", "t1"),
        verified("payments", "t2"),
        verified("ops", "t3"),
    );
    // Web may call payments: both ends keep it, whichever side judges.
    assert_eq!(judge(&trust, &policy, Some(&web), &payments, NOW), Ok(()));
    assert_eq!(judge(&trust, &policy, Some(&payments), &web, NOW), Ok(()));
    // Nobody may call ops, and ops may call nobody: closed.
    assert_eq!(judge(&trust, &policy, Some(&ops), &web, NOW), Err("policy"));
    assert_eq!(judge(&trust, &policy, Some(&web), &ops, NOW), Err("policy"));
    // Deny-all (no policy held) allows nothing.
    let none = Policy::deny_all();
    assert_eq!(
        judge(&trust, &none, Some(&web), &payments, NOW),
        Err("policy")
    );
    // Without our own claims only revocations are judged.
    assert_eq!(judge(&trust, &none, None, &payments, NOW), Ok(()));
    // A revocation that arrives later: the peer's token.
    trust.set_revocations(&[Revocation {
        peer_id: vec![],
        until_unix_secs: NOW + 100,
        reason: "leaked".into(),
        token_id: "t2".into(),
    }]);
    assert_eq!(
        judge(&trust, &policy, Some(&web), &payments, NOW),
        Err("revoked")
    );
    assert_eq!(judge(&trust, &policy, None, &payments, NOW), Err("revoked"));
    // Lapsed: allowed again.
    assert_eq!(
        judge(&trust, &policy, Some(&web), &payments, NOW + 101),
        Ok(())
    );
}
