//! Policy versions and the epoch on both backends (each test runs once on
//! a SQLite file, once on a PostgreSQL database of its own; see
//! `suite.rs`): numbering, unchanged texts, two stores applying at once,
//! the reaper's retention, `store copy` and backups under a new epoch.

use super::*;

use super::suite_kit::{Backend, Target, new_policy, on_both};

/// The `--policy FILE` rule: a text the database held and replaced is
/// older than the policy in force and is not applied; a new text is; the
/// text in force is unchanged; an operator's apply may still go back.
async fn a_replaced_text_is_not_applied_unless_replaced(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let at_start = |text: &str, at: i64| NewPolicy {
        unless_replaced: true,
        ..new_policy(text, at)
    };
    // A fresh database takes the file.
    assert_eq!(
        s.apply_policy(&at_start("file v1", 100))
            .await
            .expect("first"),
        AppliedPolicy::Applied(1)
    );
    // A newer ConfigMap (or `policy apply`) replaces it.
    assert_eq!(
        s.apply_policy(&new_policy("applied v2", 200))
            .await
            .expect("apply"),
        AppliedPolicy::Applied(2)
    );
    // An old pod restarting with the old file changes nothing.
    assert_eq!(
        s.apply_policy(&at_start("file v1", 300))
            .await
            .expect("old file"),
        AppliedPolicy::Superseded { was: 1, head: 2 }
    );
    assert_eq!(s.policy_head().await.expect("head").version, Some(2));
    // The text in force is unchanged, a new text is applied.
    assert_eq!(
        s.apply_policy(&at_start("applied v2", 400))
            .await
            .expect("same"),
        AppliedPolicy::Unchanged(2)
    );
    assert_eq!(
        s.apply_policy(&at_start("file v3", 500))
            .await
            .expect("new file"),
        AppliedPolicy::Applied(3)
    );
    // An operator going back on purpose is obeyed.
    assert_eq!(
        s.apply_policy(&new_policy("file v1", 600))
            .await
            .expect("rollback"),
        AppliedPolicy::Applied(4)
    );
}

async fn versions_number_up_and_an_unchanged_text_stores_nothing(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let head = s.policy_head().await.expect("head");
    assert_eq!(head.version, None, "a new database holds no policy");
    assert_ne!(head.epoch, 0, "and has an epoch");
    assert_eq!(
        s.apply_policy(&new_policy("a", 100)).await.expect("apply"),
        AppliedPolicy::Applied(1)
    );
    assert_eq!(
        s.apply_policy(&new_policy("a", 101))
            .await
            .expect("apply again"),
        AppliedPolicy::Unchanged(1)
    );
    assert_eq!(
        s.apply_policy(&new_policy("b", 200))
            .await
            .expect("apply b"),
        AppliedPolicy::Applied(2)
    );
    // Back to an earlier text: a new version, never a step back.
    assert_eq!(
        s.apply_policy(&new_policy("a", 300))
            .await
            .expect("apply a again"),
        AppliedPolicy::Applied(3)
    );
    let one = s.policy(1).await.expect("read").expect("kept");
    assert_eq!(
        (
            one.text.as_str(),
            one.applied_at,
            one.applied_by.as_str(),
            one.applied_from.as_str(),
            one.replaced_at
        ),
        ("a", 100, "tester", "10.0.0.9", Some(200))
    );
    let three = s.policy(3).await.expect("read").expect("kept");
    assert_eq!(three.replaced_at, None, "the version in force");
    assert_eq!(s.policy(4).await.expect("read"), None);
    // The epoch belongs to the database: a second store (or a restart) reads it.
    let again = t.open().await.policy_head().await.expect("head");
    assert_eq!(
        again,
        PolicyHead {
            epoch: head.epoch,
            version: Some(3)
        }
    );
    let counts = s.counts().await.expect("counts");
    assert!(counts.contains(&("policies".to_string(), 3)), "{counts:?}");
    // A new epoch on request (after a restore from a dump).
    let renewed = s.new_policy_epoch().await.expect("renew");
    assert_ne!(renewed, head.epoch);
    assert_eq!(s.policy_head().await.expect("head").epoch, renewed);
}

async fn two_stores_applying_at_once_never_number_two_versions_alike(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16u32 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        tasks.spawn(async move {
            store
                .apply_policy(&new_policy(&format!("text {i}"), 1000 + i64::from(i)))
                .await
                .expect("no storage error")
        });
    }
    let mut versions = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r.expect("join") {
            AppliedPolicy::Applied(v) => versions.push(v),
            other => panic!("every text differs: {other:?}"),
        }
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=16).collect::<Vec<u64>>());
    let snap = one.snapshot().await.expect("snapshot");
    assert_eq!(snap.policies.len(), 16);
    let in_force: Vec<_> = snap
        .policies
        .iter()
        .filter(|p| p.replaced_at.is_none())
        .collect();
    assert_eq!(in_force.len(), 1, "exactly one version in force");
    assert_eq!(in_force[0].version, 16);
    // The same text from both at once: one version, one unchanged.
    let same = new_policy("same", 5000);
    let (a, b) = tokio::join!(one.apply_policy(&same), two.apply_policy(&same));
    let mut got = [a.expect("a"), b.expect("b")];
    got.sort_by_key(|r| matches!(r, AppliedPolicy::Unchanged(_)));
    assert_eq!(
        got,
        [AppliedPolicy::Applied(17), AppliedPolicy::Unchanged(17)]
    );
}

async fn replaced_versions_are_reaped_after_the_retention_and_the_one_in_force_never(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    for (text, at) in [("v1", 1000), ("v2", 2000), ("v3", 3000)] {
        s.apply_policy(&new_policy(text, at)).await.expect("apply");
    }
    let reap = |now: i64| {
        let s = s.clone();
        async move {
            let policy = ReapPolicy {
                node_retention_secs: 86_400,
                ephemeral_retention_secs: 86_400,
                enrollment_retention_secs: 86_400,
                used_token_retention_secs: 86_400,
                policy_retention_secs: 500,
                admin_request_retention_secs: 500,
            };
            s.reap_batch(now, &policy, 100)
                .await
                .expect("reap")
                .into_iter()
                .find(|(t, r, _)| (*t, *r) == ("policies", "replaced"))
                .map(|x| x.2)
                .expect("the reason is reported")
        }
    };
    // v1 was replaced at 2000, v2 at 3000: at 2600 only v1 is past 500 s.
    assert_eq!(reap(2600).await, 1);
    assert_eq!(s.policy(1).await.expect("read"), None);
    assert!(s.policy(2).await.expect("read").is_some());
    // Long after: v2 goes, v3 (in force) stays, and numbering goes on.
    assert_eq!(reap(1_000_000).await, 1);
    assert!(s.policy(3).await.expect("read").is_some());
    assert_eq!(reap(1_000_000).await, 0);
    assert_eq!(
        s.apply_policy(&new_policy("v4", 1_000_001))
            .await
            .expect("apply"),
        AppliedPolicy::Applied(4)
    );
}

async fn a_copy_keeps_the_versions_under_a_new_epoch(b: Backend) {
    let Some(src) = Target::new(b).await else {
        return;
    };
    let Some(dst) = Target::new(b.other()).await else {
        return;
    };
    let s = src.open().await;
    s.apply_policy(&new_policy("first", 10))
        .await
        .expect("apply");
    s.apply_policy(&new_policy("second", 20))
        .await
        .expect("apply");
    let snap = s.snapshot().await.expect("snapshot");
    assert_eq!(snap.policies.len(), 2);
    let d = dst.open().await;
    let fresh_epoch = d.policy_head().await.expect("head").epoch;
    d.restore(&snap).await.expect("restore");
    assert_eq!(d.snapshot().await.expect("target").policies, snap.policies);
    let head = d.policy_head().await.expect("head");
    assert_eq!(head.version, Some(2));
    let source_epoch = s.policy_head().await.expect("head").epoch;
    assert_ne!(
        head.epoch, source_epoch,
        "a restored history is a new epoch"
    );
    assert_ne!(head.epoch, fresh_epoch, "made anew by the restore");
    // The copy numbers on from the copied history.
    assert_eq!(
        d.apply_policy(&new_policy("third", 30))
            .await
            .expect("apply"),
        AppliedPolicy::Applied(3)
    );
}

on_both!(
    a_replaced_text_is_not_applied_unless_replaced,
    versions_number_up_and_an_unchanged_text_stores_nothing,
    two_stores_applying_at_once_never_number_two_versions_alike,
    replaced_versions_are_reaped_after_the_retention_and_the_one_in_force_never,
    a_copy_keeps_the_versions_under_a_new_epoch,
);

/// A SQLite backup is a database of its own policy epoch, with the same
/// versions: restoring it starts a new history members take up.
#[tokio::test]
async fn a_sqlite_backup_has_an_epoch_of_its_own() {
    let t = Target::new(Backend::Sqlite).await.expect("sqlite");
    let s = t.open().await;
    s.apply_policy(&new_policy("kept", 10))
        .await
        .expect("apply");
    let dir = tempfile::tempdir().expect("tempdir");
    let to = dir.path().join("backup.db");
    s.backup_to(&to).await.expect("backup");
    let copy = SqliteStore::open(&to, t.kek.clone()).expect("open the backup");
    let (a, b) = (
        s.policy_head().await.expect("head"),
        copy.policy_head().await.expect("head"),
    );
    assert_eq!(a.version, b.version);
    assert_ne!(a.epoch, b.epoch);
    assert_eq!(
        copy.policy(1).await.expect("read").map(|p| p.text),
        Some("kept".to_string())
    );
}
