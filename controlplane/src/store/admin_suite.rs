//! Admin listings and request ids on both backends (each test once on a
//! SQLite file, once on a PostgreSQL database of its own; see `suite.rs`):
//! pages in id order with their revocations, a request id that mints one
//! token or rotates once however often and from however many stores it is
//! sent, and the reaper of recorded requests.

use std::collections::BTreeMap;

use super::*;

use super::suite_kit::{Backend, Target, on_both};

const MEMBER: i32 = agentmesh_proto::pb::credential::Role::Member as i32;
const NOW: i64 = 1_000_000;

fn token(id: &str, max_uses: u32) -> TokenRow {
    TokenRow {
        token_id: id.into(),
        kind: agentmesh_proto::pb::credential::TokenKind::Bootstrap as i32,
        role: MEMBER,
        labels: BTreeMap::from([("team".to_string(), id.to_string())]),
        max_uses,
        uses: 0,
        created_at: 1,
        expires_at: NOW + 86_400,
    }
}

fn request(id: &str, method: &'static str, digest: u8, response: &[u8]) -> AdminRequest {
    AdminRequest {
        request_id: id.into(),
        method,
        digest: [digest; 32],
        at: NOW,
        response: response.to_vec(),
    }
}

fn count(counts: &[(String, i64)], table: &str) -> i64 {
    counts
        .iter()
        .find(|(t, _)| t == table)
        .map(|x| x.1)
        .expect("every table counted")
}

async fn tokens_and_nodes_are_listed_a_page_at_a_time_with_their_revocations(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    for (i, id) in ["t-a", "t-b", "t-c"].into_iter().enumerate() {
        s.create_token(&[i as u8 + 1; 32], &token(id, 5))
            .await
            .expect("token");
    }
    for i in 1..=3u8 {
        let id = format!("n-{i}");
        s.enroll(&[1; 32], &[i; 38], &id, "test", NOW, NOW + 3600)
            .await
            .expect("no storage error")
            .expect("enrolled");
    }
    s.revoke(&[2; 38], "lost laptop", NOW, NOW + 7200)
        .await
        .expect("revoke node");
    s.revoke_token("t-c", "leaked", NOW, NOW + 9000)
        .await
        .expect("revoke token")
        .expect("known token");

    let first = s.list_tokens("", 2).await.expect("page 1");
    let ids: Vec<_> = first.iter().map(|t| t.row.token_id.as_str()).collect();
    assert_eq!(ids, ["t-a", "t-b"]);
    assert_eq!(first[0].row.uses, 3, "three enrollments spent three uses");
    assert_eq!(first[0].last_used_at, Some(NOW));
    assert_eq!(
        first[0].row.labels.get("team").map(String::as_str),
        Some("t-a")
    );
    assert_eq!(first[1].last_used_at, None);
    assert!(first.iter().all(|t| t.revoked.is_none()));
    let second = s.list_tokens("t-b", 2).await.expect("page 2");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].row.token_id, "t-c");
    assert_eq!(second[0].revoked, Some((NOW + 9000, "leaked".to_string())));
    assert!(
        s.list_tokens("t-c", 2)
            .await
            .expect("past the end")
            .is_empty()
    );
    // Whatever is asked, a call reads at most MAX_LIST_ROWS.
    assert_eq!(s.list_tokens("", u32::MAX).await.expect("all").len(), 3);

    let nodes = s.list_nodes("", 10).await.expect("nodes");
    let ids: Vec<_> = nodes.iter().map(|n| n.row.node_id.as_str()).collect();
    assert_eq!(ids, ["n-1", "n-2", "n-3"]);
    assert_eq!(nodes[1].row.peer_id, vec![2; 38]);
    assert!(nodes[1].row.revoked);
    assert_eq!(nodes[1].revoked_until, Some(NOW + 7200));
    assert!(!nodes[0].row.revoked && nodes[0].revoked_until.is_none());
    assert_eq!(
        nodes[0].row.labels.get("team").map(String::as_str),
        Some("t-a")
    );
    assert_eq!(nodes[0].row.enrolled_at, NOW);
    let rest = s.list_nodes("n-1", 1).await.expect("page");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].row.node_id, "n-2");
}

async fn a_request_id_mints_one_token_however_often_it_is_sent(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let first = request("req-1", "CreateToken", 7, b"first answer");
    one.create_token_once(&[1; 32], &token("t-1", 1), &first)
        .await
        .expect("no storage error")
        .expect("done the first time");
    // A retry (with another token minted for it) writes nothing and gets
    // the first answer back, opened.
    let retry = request("req-1", "CreateToken", 7, b"second answer");
    let prior = two
        .create_token_once(&[2; 32], &token("t-2", 1), &retry)
        .await
        .expect("no storage error")
        .expect_err("recorded already");
    assert_eq!(prior.response, b"first answer");
    assert_eq!(prior.digest, [7; 32]);
    assert_eq!(prior.method, "CreateToken");
    assert_eq!(prior.at, NOW);
    // Eight attempts racing from two stores with one new id: one mints.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u8 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        tasks.spawn(async move {
            let req = request("req-race", "CreateToken", 9, &[i]);
            store
                .create_token_once(&[10 + i; 32], &token(&format!("race-{i}"), 1), &req)
                .await
                .expect("no storage error")
        });
    }
    let mut done = 0;
    while let Some(r) = tasks.join_next().await {
        if r.expect("join").is_ok() {
            done += 1;
        }
    }
    assert_eq!(done, 1, "one attempt minted");
    let counts = one.counts().await.expect("counts");
    assert_eq!(count(&counts, "tokens"), 2, "t-1 and one race token");
    assert_eq!(count(&counts, "admin_requests"), 2);
}

async fn a_request_id_rotates_once_and_its_records_are_reaped(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let key = |id: &str| SigningKeyRow {
        key_id: id.into(),
        secret: (0..64).map(|i| (i * 5 + 1) as u8).collect(),
        public: vec![3; 32],
        active_from: NOW,
        verify_until: 0,
    };
    assert!(s.init_keys(&key("k-1"), NOW + 100).await.expect("init"));
    let req = request("rot-1", "RotateKeyNow", 3, b"k-2 answer");
    s.rotate_once(NOW + 500, &key("k-2"), NOW + 900, &req)
        .await
        .expect("no storage error")
        .expect("rotated");
    let prior = s
        .rotate_once(NOW + 600, &key("k-3"), NOW + 1000, &req)
        .await
        .expect("no storage error")
        .expect_err("recorded already");
    assert_eq!(prior.response, b"k-2 answer");
    let keys = s.keys().await.expect("keys").rows;
    assert_eq!(keys.len(), 2, "one rotation: {keys:?}");
    assert_eq!(s.next_rotation_at().await.expect("next"), Some(NOW + 500));
    // Records go once their retention has passed, not before.
    let policy = ReapPolicy {
        node_retention_secs: 86_400,
        ephemeral_retention_secs: 86_400,
        enrollment_retention_secs: 86_400,
        used_token_retention_secs: 86_400,
        policy_retention_secs: 86_400,
        admin_request_retention_secs: 60,
    };
    let reaped = |d: &Deleted| {
        d.iter()
            .find(|(t, r, _)| *t == "admin_requests" && *r == "expired")
            .map(|x| x.2)
            .expect("reported")
    };
    let d = s.reap_batch(NOW + 60, &policy, 100).await.expect("reap");
    assert_eq!(reaped(&d), 0);
    let d = s.reap_batch(NOW + 61, &policy, 100).await.expect("reap");
    assert_eq!(reaped(&d), 1);
    // The id is free again: a retry this late is done again.
    s.rotate_once(NOW + 700, &key("k-4"), NOW + 1100, &req)
        .await
        .expect("no storage error")
        .expect("rotated again");
}

on_both!(
    tokens_and_nodes_are_listed_a_page_at_a_time_with_their_revocations,
    a_request_id_mints_one_token_however_often_it_is_sent,
    a_request_id_rotates_once_and_its_records_are_reaped,
);
