//! Request ids of the admin calls whose answer comes out of their work
//! (`RevokeNode`, `RevokeToken`, `ApplyPolicy`) on both backends (each test
//! once on a SQLite file, once on a PostgreSQL database of its own; see
//! `suite.rs`): the first attempt's answer comes back to every retry
//! however many stores it is sent to, nothing is done twice, and work that
//! did nothing (an unknown token) records nothing.

use std::sync::Arc;

use super::*;

use super::suite_kit::{Backend, Target, member_token, new_policy, on_both};

const NOW: i64 = 1_000_000;

/// A request `id` of `method` whose recorded answer is the work's result,
/// as big-endian bytes.
fn until_request(id: &str, method: &'static str, digest: u8) -> RequestOnce<i64> {
    RequestOnce {
        request_id: id.into(),
        method,
        digest: [digest; 32],
        at: NOW,
        answer: Arc::new(|until: &i64| Some(until.to_be_bytes().to_vec())),
    }
}

async fn a_request_id_revokes_a_node_once_and_answers_the_first_end(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    one.create_token(&[1; 32], &member_token("t-1", NOW + 86_400))
        .await
        .expect("token");
    one.enroll(&[1; 32], &[7; 38], "n-1", "test", NOW, NOW + 3600)
        .await
        .expect("no storage error")
        .expect("enrolled");
    let req = until_request("rev-1", "RevokeNode", 4);
    let until = one
        .revoke_once(&[7; 38], "lost", NOW, NOW + 7200, &req)
        .await
        .expect("no storage error")
        .expect("done the first time");
    assert_eq!(until, NOW + 7200);
    // A retry through another store, whose default end would be later:
    // the first answer comes back and the revocation is not extended.
    let prior = two
        .revoke_once(&[7; 38], "lost", NOW + 50, NOW + 9000, &req)
        .await
        .expect("no storage error")
        .expect_err("recorded already");
    assert_eq!(prior.response, until.to_be_bytes());
    assert_eq!(
        (prior.method.as_str(), prior.digest),
        ("RevokeNode", [4; 32])
    );
    let rows = one.revocations().await.expect("list").rows;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].until, NOW + 7200, "not extended by the retry");
    // Without an id a second revocation extends it, as before.
    assert_eq!(
        one.revoke(&[7; 38], "lost", NOW + 50, NOW + 9000)
            .await
            .expect("revoke"),
        NOW + 9000
    );
    let counts = one.counts().await.expect("counts");
    let admin = counts.iter().find(|(t, _)| t == "admin_requests");
    assert_eq!(admin.map(|x| x.1), Some(1));
}

async fn a_request_id_revokes_a_token_once_and_an_unknown_one_records_nothing(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let answer = |u: &Option<i64>| u.map(|u| u.to_be_bytes().to_vec());
    let request = |id: &str| RequestOnce {
        request_id: id.into(),
        method: "RevokeToken",
        digest: [5; 32],
        at: NOW,
        answer: Arc::new(answer),
    };
    // An unknown token: nothing done, nothing recorded, the id stays free.
    let unknown = one
        .revoke_token_once("t-none", "x", NOW, NOW + 100, &request("tok-0"))
        .await
        .expect("no storage error")
        .expect("not recorded before");
    assert_eq!(unknown, None);
    let count = |c: Vec<(String, i64)>| {
        c.into_iter()
            .find(|(t, _)| t == "admin_requests")
            .map(|x| x.1)
    };
    assert_eq!(count(one.counts().await.expect("counts")), Some(0));

    one.create_token(&[2; 32], &member_token("t-bad", NOW + 86_400))
        .await
        .expect("token");
    // Eight attempts racing from two stores with one id: one revokes, and
    // every other one gets its answer.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8i64 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        let req = request("tok-race");
        tasks.spawn(async move {
            store
                .revoke_token_once("t-bad", "leaked", NOW + i, NOW + 100 + i, &req)
                .await
                .expect("no storage error")
        });
    }
    let (mut done, mut answers) = (Vec::new(), Vec::new());
    while let Some(r) = tasks.join_next().await {
        match r.expect("join") {
            Ok(until) => done.push(until.expect("a known token")),
            Err(prior) => answers.push(prior.response),
        }
    }
    assert_eq!(done.len(), 1, "one attempt revoked");
    assert!(answers.iter().all(|a| *a == done[0].to_be_bytes()));
    let list = one.revocations().await.expect("list").rows;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].until, done[0]);
    assert_eq!(count(one.counts().await.expect("counts")), Some(1));
}

async fn a_request_id_applies_a_policy_once_even_after_another_apply(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let request = |id: &str| RequestOnce {
        request_id: id.into(),
        method: "ApplyPolicy",
        digest: [6; 32],
        at: NOW,
        answer: Arc::new(|done: &AppliedPolicy| Some(done.version().to_be_bytes().to_vec())),
    };
    let first = one
        .apply_policy_once(&new_policy("a", NOW), &request("pol-1"))
        .await
        .expect("no storage error")
        .expect("applied the first time");
    assert_eq!(first, AppliedPolicy::Applied(1));
    // Another admin applies "b" meanwhile.
    assert_eq!(
        two.apply_policy(&new_policy("b", NOW + 1))
            .await
            .expect("apply b"),
        AppliedPolicy::Applied(2)
    );
    // The retry of "a" answers version 1 and applies nothing: without the
    // id it would apply "a" again, over "b".
    let prior = two
        .apply_policy_once(&new_policy("a", NOW + 2), &request("pol-1"))
        .await
        .expect("no storage error")
        .expect_err("recorded already");
    assert_eq!(prior.response, 1u64.to_be_bytes());
    assert_eq!(
        one.policy_head().await.expect("head").version,
        Some(2),
        "b stays in force"
    );
    // A text in force is recorded too: its retry answers the same.
    let unchanged = one
        .apply_policy_once(&new_policy("b", NOW + 3), &request("pol-2"))
        .await
        .expect("no storage error")
        .expect("recorded");
    assert_eq!(unchanged, AppliedPolicy::Unchanged(2));
    let prior = one
        .apply_policy_once(&new_policy("b", NOW + 4), &request("pol-2"))
        .await
        .expect("no storage error")
        .expect_err("recorded already");
    assert_eq!(prior.response, 2u64.to_be_bytes());
}

on_both!(
    a_request_id_revokes_a_node_once_and_answers_the_first_end,
    a_request_id_revokes_a_token_once_and_an_unknown_one_records_nothing,
    a_request_id_applies_a_policy_once_even_after_another_apply,
);
