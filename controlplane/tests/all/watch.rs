//! Routers' Watch and token revocation against a real control plane on
//! loopback with real gRPC clients, on both backends: the first event is
//! the full state, a new one follows ApplyPolicy and RevokeToken; a
//! revoked token enrolls no one and its members cannot refresh; the
//! claims carry the token id; lying callers (a member's credential, a
//! proof from another key or for another purpose) are refused and
//! counted; `--watch-max-streams` bites and is counted.

use agentmesh_controlplane::{ClientError, Handle};
use agentmesh_proto::{
    credential::{Trust, peek_claims},
    identity::Keypair,
    pb::{
        controlplane::{
            ApplyPolicyRequest, RefreshRequest, RouterLeaseRequest, WatchEvent, WatchRequest,
        },
        credential::{Credential, PolicyDocument, RevocationList, Role, TokenKind},
    },
    policy::verify_policy,
    proof::{Bound, make_proof},
    revocations::{peek_generation, verify_revocations},
    unix_now,
};
use futures::StreamExt as _;
use std::time::Duration;
use tonic::{Code, Streaming};

use crate::common::{self, ADMIN, TestDb, client, metric, metrics, token};

/// Web may call `payments/api`, which payments own.
const POLICY: &str = r#"format = 1

[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api"]

[[tests]]
from = { labels = { team = "web" } }
call = "payments/api"
expect = "allow"
"#;

/// Bounds a wait for the next event (a hang fails, never a timing claim).
const NEXT: Duration = Duration::from_secs(30);

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Code {
    match r {
        Ok(v) => panic!("expected a refusal, got {v:?}"),
        Err(e) => e.status().map_or(Code::Unknown, |s| s.code()),
    }
}

async fn next(s: &mut Streaming<WatchEvent>) -> WatchEvent {
    tokio::time::timeout(NEXT, s.next())
        .await
        .expect("an event within the bound")
        .expect("the stream goes on")
        .expect("an event, not an error")
}

/// The event's revocation list, verified with the keys it carries.
fn revocations_of(ev: &WatchEvent) -> RevocationList {
    let keys = ev.keys.as_ref().expect("the event carries the keys");
    verify_revocations(
        ev.revocations.as_ref().expect("the event carries the list"),
        &Trust::new(keys),
        unix_now(),
    )
    .expect("the list is signed by a key the event carries")
}

fn policy_of(ev: &WatchEvent) -> PolicyDocument {
    let keys = ev.keys.as_ref().expect("the event carries the keys");
    verify_policy(
        ev.policy.as_ref().expect("the event carries the policy"),
        &Trust::new(keys),
    )
    .expect("the policy is signed by a key the event carries")
}

/// Enrolls a fresh key with a new token of `role`; returns the key, its
/// credential and the token.
async fn enrolled(
    h: &Handle,
    role: Role,
    labels: &[(&str, &str)],
) -> (Keypair, Credential, String) {
    let tok = token(h, TokenKind::Bootstrap, role, labels, 5).await;
    let key = Keypair::generate_ed25519();
    let e = client(h).enroll(&tok, &key).await.expect("enrolls");
    (key, e.credential.expect("credential"), tok)
}

async fn the_first_event_is_the_state_and_changes_follow(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let (rkey, rcred, _) = enrolled(&h, Role::Router, &[]).await;
    let mut w = c.watch(&rcred, &rkey).await.expect("a router may watch");
    let first = next(&mut w).await;
    let v1 = policy_of(&first).version;
    assert!(v1 >= 1, "the allow-all policy is in force");
    let empty = revocations_of(&first);
    assert!(empty.entries.is_empty());

    // ApplyPolicy: the next event carries the new version.
    let r = c
        .apply_policy(
            ADMIN,
            ApplyPolicyRequest {
                text: POLICY.into(),
                dry_run: false,
                author: "test".into(),
            },
        )
        .await
        .expect("applies");
    let ev = next(&mut w).await;
    assert_eq!(policy_of(&ev).version, r.version);
    assert!(r.version > v1);

    // A member of another token; its claims carry the token id.
    let (mkey, mcred, mtok) = enrolled(&h, Role::Member, &[("team", "web")]).await;
    let token_id = peek_claims(&mcred).expect("claims").token_id;
    assert!(!token_id.is_empty(), "the claims carry the token id");
    let refreshed = c.refresh(&mcred, &mkey).await.expect("refreshes");
    assert_eq!(
        peek_claims(refreshed.credential.as_ref().expect("cred"))
            .expect("claims")
            .token_id,
        token_id,
        "refresh keeps the token id"
    );

    // RevokeToken: one revocation by token id reaches the watcher.
    assert_eq!(
        code(c.revoke_token(ADMIN, "t-no-such-token", "").await),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.revoke_token("wrong-admin-token-0000", &token_id, "")
                .await
        ),
        Code::Unauthenticated
    );
    let until = c
        .revoke_token(ADMIN, &token_id, "leaked")
        .await
        .expect("revokes")
        .until_unix_secs;
    let expiry = peek_claims(&mcred).expect("claims").expires_at_unix_secs;
    assert!(until >= expiry, "kept until its credentials expired");
    let ev = next(&mut w).await;
    let list = revocations_of(&ev);
    assert_eq!(list.entries.len(), 1, "{:?}", list.entries);
    assert_eq!(list.epoch, empty.epoch);
    assert!(list.generation > empty.generation, "a write moves it");
    let rev = &list.entries[0];
    assert!(rev.peer_id.is_empty());
    assert_eq!(
        (rev.token_id.as_str(), rev.until_unix_secs),
        (token_id.as_str(), until)
    );
    assert_eq!(rev.reason, "leaked");
    let dir = c.get_directory().await.expect("directory");
    assert_eq!(
        peek_generation(dir.revocations.as_ref().expect("list")),
        Some((list.epoch, list.generation)),
        "the directory carries the same generation"
    );

    // The token enrolls no one; its member cannot refresh; both counted.
    let other = Keypair::generate_ed25519();
    assert_eq!(code(c.enroll(&mtok, &other).await), Code::PermissionDenied);
    assert_eq!(code(c.refresh(&mcred, &mkey).await), Code::PermissionDenied);
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_control_plane_auth_failures_total{method="Enroll",reason="token_revoked"}"#
        ),
        Some(1.0)
    );
    assert_eq!(metric(&m, "agentmesh_control_plane_watchers "), Some(1.0));
    assert!(metric(&m, "agentmesh_control_plane_watch_events_total").unwrap_or(0.0) >= 3.0);

    // Revoking the router's own token ends its watch, refused.
    let rtok_id = peek_claims(&rcred).expect("claims").token_id;
    c.revoke_token(ADMIN, &rtok_id, "").await.expect("revokes");
    let end = tokio::time::timeout(NEXT, async {
        loop {
            match w.next().await {
                Some(Ok(_)) => continue,
                Some(Err(s)) => return Some(s.code()),
                None => return None,
            }
        }
    })
    .await
    .expect("the stream ends within the bound");
    assert_eq!(end, Some(Code::PermissionDenied));
    assert_eq!(code(c.watch(&rcred, &rkey).await), Code::PermissionDenied);
    h.shutdown().await;
}

async fn lying_watchers_are_refused_and_counted(db: TestDb) {
    let h = db.start().await;
    let c = client(&h);
    let (mkey, mcred, _) = enrolled(&h, Role::Member, &[]).await;
    match c.watch(&mcred, &mkey).await {
        Err(ClientError::Refused(s)) => {
            assert_eq!(s.code(), Code::PermissionDenied, "a member may not watch");
            // The refusal names the call refused, not RouterLease.
            assert!(
                s.message()
                    .contains("Watch needs a credential with role router"),
                "{}",
                s.message()
            );
        }
        other => panic!("a member's credential may not watch: {other:?}"),
    }
    let (rkey, rcred, _) = enrolled(&h, Role::Router, &[]).await;
    let mut raw = common::raw_client_from(&h, [127, 0, 0, 1]).await;
    // A router's credential replayed with a proof from another key.
    let thief = Keypair::generate_ed25519();
    let stolen = raw
        .watch(
            WatchRequest {
                credential: Some(rcred.clone()),
                proof: None,
            }
            .proven(h.public_url(), &thief, unix_now()),
        )
        .await;
    assert_eq!(stolen.err().map(|s| s.code()), Some(Code::Unauthenticated));
    // The right key, but its RouterLease proof replayed on Watch.
    let lease = RouterLeaseRequest {
        credential: Some(rcred.clone()),
        ..RouterLeaseRequest::default()
    };
    let lease_proof = raw
        .watch(WatchRequest {
            credential: Some(rcred.clone()),
            proof: Some(make_proof(
                &lease.binding(),
                h.public_url(),
                &rkey,
                unix_now(),
            )),
        })
        .await;
    assert_eq!(
        lease_proof.err().map(|s| s.code()),
        Some(Code::Unauthenticated),
        "a lease proof is not a watch proof"
    );
    // The right key, but a proof made for another purpose (a Refresh of
    // the same credential: the same fields, another domain).
    let refresh = RefreshRequest {
        credential: Some(rcred.clone()),
        proof: None,
    };
    let wrong_purpose = raw
        .watch(WatchRequest {
            credential: Some(rcred.clone()),
            proof: Some(make_proof(
                &refresh.binding(),
                h.public_url(),
                &rkey,
                unix_now(),
            )),
        })
        .await;
    assert_eq!(
        wrong_purpose.err().map(|s| s.code()),
        Some(Code::Unauthenticated)
    );
    // No proof at all.
    let none = raw
        .watch(WatchRequest {
            credential: Some(rcred.clone()),
            proof: None,
        })
        .await;
    assert_eq!(none.err().map(|s| s.code()), Some(Code::InvalidArgument));
    let m = metrics(&h).await;
    let failed = |reason: &str| {
        metric(
            &m,
            &format!(
                r#"agentmesh_control_plane_auth_failures_total{{method="Watch",reason="{reason}"}}"#
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(failed("wrong_role"), 1.0);
    assert_eq!(failed("wrong_peer") + failed("bad_proof"), 3.0);
    assert!(failed("bad_proof") >= 2.0, "the two wrong purposes");
    assert_eq!(metric(&m, "agentmesh_control_plane_watchers "), Some(0.0));
    h.shutdown().await;
}

async fn watchers_past_the_bound_are_refused_and_counted(db: TestDb) {
    let cfg = agentmesh_controlplane::Config {
        watch_max_streams: 1,
        ..db.config()
    };
    let h = agentmesh_controlplane::spawn(cfg).await.expect("starts");
    let (rkey, rcred, _) = enrolled(&h, Role::Router, &[]).await;
    let mut raw = common::raw_client_from(&h, [127, 0, 0, 1]).await;
    let req = || {
        WatchRequest {
            credential: Some(rcred.clone()),
            proof: None,
        }
        .proven(h.public_url(), &rkey, unix_now())
    };
    let mut first = raw
        .watch(req())
        .await
        .expect("the first watch")
        .into_inner();
    next(&mut first).await;
    let second = raw.watch(req()).await;
    assert_eq!(
        second.err().map(|s| s.code()),
        Some(Code::ResourceExhausted)
    );
    let m = metrics(&h).await;
    assert_eq!(
        metric(
            &m,
            r#"agentmesh_control_plane_limiter_refusals_total{limiter="watch_streams"}"#
        ),
        Some(1.0)
    );
    // The slot is freed with the stream: a new watch gets it (bounded by
    // attempts, not by time).
    drop(first);
    let mut reopened = None;
    for _ in 0..100 {
        match raw.watch(req()).await {
            Ok(s) => {
                reopened = Some(s.into_inner());
                break;
            }
            Err(s) if s.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(s) => panic!("unexpected refusal {s:?}"),
        }
    }
    let mut reopened = reopened.expect("the slot came back after the stream ended");
    next(&mut reopened).await;
    // Stopping the control plane ends the stream (no hang on shutdown).
    h.shutdown().await;
    let end = tokio::time::timeout(NEXT, reopened.next())
        .await
        .expect("the stream ends with the control plane");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
}

/// After a rotation the list in force is signed again with the new key
/// (same epoch and generation, issued later) and the watch carries it; the
/// copy signed before still verifies with the new key set while the old
/// key is within its grace.
async fn the_revocation_list_is_signed_again_after_a_key_rotation(db: TestDb) {
    let cfg = agentmesh_controlplane::Config {
        key_publish_ahead_secs: 0,
        ..db.config()
    };
    let h = agentmesh_controlplane::spawn(cfg).await.expect("starts");
    let c = client(&h);
    let (rkey, rcred, _) = enrolled(&h, Role::Router, &[]).await;
    let (_, mcred, _) = enrolled(&h, Role::Member, &[]).await;
    let mut w = c.watch(&rcred, &rkey).await.expect("a router may watch");
    next(&mut w).await;
    let peer = peek_claims(&mcred).expect("claims").subject;
    let peer = agentmesh_proto::identity::PeerId::from_bytes(&peer).expect("peer");
    c.revoke_node(ADMIN, &peer, "lost").await.expect("revokes");
    let before = loop {
        let ev = next(&mut w).await;
        if !revocations_of(&ev).entries.is_empty() {
            break ev;
        }
    };
    let old = revocations_of(&before);

    let rotated = c.rotate_key_now(ADMIN).await.expect("rotates");
    let after = loop {
        let ev = next(&mut w).await;
        if revocations_of(&ev).key_id == rotated.key_id {
            break ev;
        }
    };
    let new = revocations_of(&after);
    assert_eq!((new.epoch, new.generation), (old.epoch, old.generation));
    assert_eq!(new.entries, old.entries);
    assert!(new.issued_at_unix_secs >= old.issued_at_unix_secs);
    assert_ne!(new.key_id, old.key_id);
    // The old copy verifies with the new key set during the old key's grace.
    let keys = Trust::new(after.keys.as_ref().expect("keys"));
    let held = verify_revocations(
        before.revocations.as_ref().expect("list"),
        &keys,
        unix_now(),
    )
    .expect("the old key is within its grace");
    assert_eq!(held.key_id, old.key_id);
    h.shutdown().await;
}

on_both!(
    #[tokio::test]
    the_first_event_is_the_state_and_changes_follow,
    the_revocation_list_is_signed_again_after_a_key_rotation,
    lying_watchers_are_refused_and_counted,
    watchers_past_the_bound_are_refused_and_counted,
);
