//! Token revocations on both backends (each test once on a SQLite file,
//! once on a PostgreSQL database of its own; see `suite.rs`): what a
//! revocation refuses, what the directory publishes and for how long, the
//! reaper, `store copy`, and a revocation racing enrollments from two
//! stores.

use std::collections::BTreeMap;

use super::*;

use super::suite_kit::{Backend, Target, on_both, reap_policy};

const MEMBER: i32 = agentmesh_proto::pb::credential::Role::Member as i32;
const NOW: i64 = 1_000_000;

fn token(id: &str, max_uses: u32, role: i32) -> TokenRow {
    TokenRow {
        token_id: id.into(),
        kind: agentmesh_proto::pb::credential::TokenKind::Bootstrap as i32,
        role,
        labels: BTreeMap::new(),
        max_uses,
        uses: 0,
        created_at: 1,
        expires_at: NOW + 86_400,
    }
}

fn deleted(d: &Deleted, table: &str, reason: &str) -> u64 {
    d.iter()
        .find(|(t, r, _)| *t == table && *r == reason)
        .map(|x| x.2)
        .expect("every reason reported")
}

async fn a_revoked_token_enrolls_no_one_and_its_nodes_are_refused(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let (tok, other) = ([1u8; 32], [2u8; 32]);
    s.create_token(&tok, &token("t-bad", 10, MEMBER))
        .await
        .expect("token");
    s.create_token(&other, &token("t-good", 10, ROUTER_ROLE))
        .await
        .expect("token");
    // Two members of the bad token (credentials to NOW + 3600 and + 7200),
    // one router of the good one.
    for (peer, exp) in [([1u8; 38], NOW + 3600), ([2u8; 38], NOW + 7200)] {
        s.enroll(&tok, &peer, &format!("n-{}", peer[0]), "t", NOW, exp)
            .await
            .expect("store")
            .expect("enrolls");
    }
    s.enroll(&other, &[3; 38], "n-3", "t", NOW, NOW + 3600)
        .await
        .expect("store")
        .expect("enrolls");

    assert_eq!(
        s.revoke_token("t-none", "x", NOW, NOW + 100)
            .await
            .expect("store"),
        None,
        "an id nothing has is not found"
    );
    let until = s
        .revoke_token("t-bad", "leaked", NOW, NOW + 100)
        .await
        .expect("store")
        .expect("known");
    assert_eq!(until, NOW + 7200, "until its last credential expires");
    // Revoking again never shortens it.
    let again = s
        .revoke_token("t-bad", "leaked twice", NOW + 1, NOW + 101)
        .await
        .expect("store")
        .expect("known");
    assert_eq!(again, NOW + 7200);

    // A new key with the token: refused as revoked, nothing spent.
    let r = s
        .enroll(&tok, &[9; 38], "n-9", "t", NOW + 2, NOW + 3600)
        .await
        .expect("store");
    assert_eq!(r, Err(EnrollRefusal::TokenRevoked));
    // Its members can neither refresh nor re-enroll; the other token's router can.
    for peer in [[1u8; 38], [2u8; 38]] {
        assert_eq!(
            s.touch_node(&peer, NOW + 2, Some(NOW + 3600))
                .await
                .expect("store"),
            Err(NodeRefusal::Revoked)
        );
        assert!(
            s.enroll(&tok, &peer, "x", "t", NOW + 2, NOW + 3600)
                .await
                .expect("store")
                .is_err()
        );
    }
    assert!(
        s.touch_node(&[3; 38], NOW + 2, None)
            .await
            .expect("store")
            .is_ok()
    );

    // The list: one entry for the token, none per member.
    let revs = s.revocations().await.expect("revocations").rows;
    assert_eq!(
        revs,
        vec![RevocationRow {
            peer_id: Vec::new(),
            token_id: "t-bad".into(),
            until: NOW + 7200,
            reason: "leaked twice".into(),
        }]
    );
    let snap = s.snapshot().await.expect("snapshot");
    assert_eq!(
        snap.tokens
            .iter()
            .find(|x| x.row.token_id == "t-bad")
            .map(|x| x.row.expires_at),
        Some(NOW),
        "its expiry is now, for binaries that do not read the table"
    );

    // The reaper keeps both while the revocation lasts (the token is
    // expired, but a revoked one is refused as revoked, not unknown)...
    let d = s
        .reap_batch(NOW + 7199, &reap_policy(), 100)
        .await
        .expect("reap");
    assert_eq!(deleted(&d, "token_revocations", "expired"), 0);
    assert_eq!(deleted(&d, "tokens", "expired"), 0);
    assert_eq!(
        s.enroll(&tok, &[9; 38], "n-9", "t", NOW + 7199, NOW + 9000)
            .await
            .expect("store"),
        Err(EnrollRefusal::TokenRevoked)
    );
    // ...and deletes the revocation once every credential expired, then
    // the token.
    let d = s
        .reap_batch(NOW + 7200, &reap_policy(), 100)
        .await
        .expect("reap");
    assert_eq!(deleted(&d, "token_revocations", "expired"), 1);
    let d = s
        .reap_batch(NOW + 7200, &reap_policy(), 100)
        .await
        .expect("reap");
    assert_eq!(deleted(&d, "tokens", "expired"), 1);
    let revs = s.revocations().await.expect("revocations").rows;
    assert!(revs.is_empty(), "{revs:?}");
    let counts = s.counts().await.expect("counts");
    assert!(
        counts
            .iter()
            .any(|(t, n)| t == "token_revocations" && *n == 0)
    );
}

async fn a_revoked_token_routers_lose_their_leases(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    s.create_token(&[4; 32], &token("t-r", 2, ROUTER_ROLE))
        .await
        .expect("token");
    s.enroll(&[4; 32], &[4; 38], "n-r", "t", NOW, NOW + 60)
        .await
        .expect("store")
        .expect("enrolls");
    let lease = LeaseRow {
        peer_id: vec![4; 38],
        node_id: "n-r".into(),
        addrs: vec!["/ip4/127.0.0.1/tcp/9".into()],
        labels: BTreeMap::new(),
        attached: 0,
        transit: 0,
        high: 10,
        low: 8,
        draining: false,
        expires_at: NOW + 30,
    };
    s.router_lease(&lease, NOW)
        .await
        .expect("store")
        .expect("lease");
    let until = s
        .revoke_token("t-r", "", NOW, NOW + 100)
        .await
        .expect("store")
        .expect("known");
    assert_eq!(until, NOW + 100, "the default bound when it is later");
    let leases = s.directory(NOW + 1).await.expect("directory");
    assert!(leases.is_empty(), "the router's lease is gone");
    assert_eq!(
        s.router_lease(&lease, NOW + 1).await.expect("store"),
        Err(NodeRefusal::Revoked)
    );
}

async fn a_revocation_racing_enrollments_leaves_no_member_unrevoked(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let digest = [7u8; 32];
    one.create_token(&digest, &token("t-race", 1000, MEMBER))
        .await
        .expect("token");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16u8 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        tasks.spawn(async move {
            store
                .enroll(&digest, &[i; 38], &format!("n-{i}"), "t", NOW, NOW + 60)
                .await
                .expect("no storage error")
                .map(|_| i)
        });
    }
    one.revoke_token("t-race", "race", NOW, NOW + 100)
        .await
        .expect("store")
        .expect("known");
    let mut outcomes = Vec::new();
    while let Some(r) = tasks.join_next().await {
        outcomes.push(r.expect("join"));
    }
    for o in &outcomes {
        match o {
            // Enrolled before the revocation: revoked with the others.
            Ok(i) => assert_eq!(
                two.touch_node(&[*i; 38], NOW + 1, None)
                    .await
                    .expect("store"),
                Err(NodeRefusal::Revoked),
                "member {i} enrolled and was not revoked"
            ),
            Err(r) => assert_eq!(*r, EnrollRefusal::TokenRevoked),
        }
    }
    assert_eq!(
        two.enroll(&digest, &[99; 38], "n-99", "t", NOW + 1, NOW + 60)
            .await
            .expect("store"),
        Err(EnrollRefusal::TokenRevoked)
    );
}

async fn a_copy_keeps_the_token_revocations(b: Backend) {
    let Some(src) = Target::new(b).await else {
        return;
    };
    let Some(dst) = Target::new(b.other()).await else {
        return;
    };
    let s = src.open().await;
    s.create_token(&[5; 32], &token("t-c", 1, MEMBER))
        .await
        .expect("token");
    s.revoke_token("t-c", "copied", NOW, NOW + 100)
        .await
        .expect("store")
        .expect("known");
    let snap = s.snapshot().await.expect("snapshot");
    assert_eq!(snap.token_revocations.len(), 1);
    let d = dst.open().await;
    d.restore(&snap).await.expect("restore");
    assert_eq!(d.snapshot().await.expect("snapshot"), snap);
    assert_eq!(
        d.enroll(&[5; 32], &[1; 38], "n", "t", NOW + 1, NOW + 60)
            .await
            .expect("store"),
        Err(EnrollRefusal::TokenRevoked)
    );
}

on_both!(
    a_revoked_token_enrolls_no_one_and_its_nodes_are_refused,
    a_revoked_token_routers_lose_their_leases,
    a_revocation_racing_enrollments_leaves_no_member_unrevoked,
    a_copy_keeps_the_token_revocations,
);
