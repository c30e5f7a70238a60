//! The storage suite both backends pass: every test runs once on a SQLite
//! file and once on a database of its own on a real PostgreSQL server
//! (`testing`: without a server it fails in CI and elsewhere notes once
//! that it did not run). Races use two independent stores on one
//! database, as two control-plane processes would.

use std::{collections::BTreeMap, sync::Arc};

use super::*;

use super::suite_kit::{Backend, Target, key, on_both};

fn token(id: &str, max_uses: u32, role: i32, expires_at: i64) -> TokenRow {
    TokenRow {
        token_id: id.into(),
        kind: agentmesh_proto::pb::credential::TokenKind::Bootstrap as i32,
        role,
        labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
        max_uses,
        uses: 0,
        created_at: 1,
        expires_at,
    }
}

const MEMBER: i32 = agentmesh_proto::pb::credential::Role::Member as i32;
const NOW: i64 = 1_000_000;

fn count(counts: &[(String, i64)], table: &str) -> i64 {
    counts
        .iter()
        .find(|(t, _)| t == table)
        .map(|x| x.1)
        .expect("every table counted")
}

async fn a_single_use_token_enrolls_exactly_one_of_many_racing(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (one, two) = (t.open().await, t.open().await);
    let digest = [9u8; 32];
    one.create_token(&digest, &token("t1", 1, MEMBER, i64::MAX))
        .await
        .expect("token");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u8 {
        let store = if i % 2 == 0 { one.clone() } else { two.clone() };
        tasks.spawn(async move {
            store
                .enroll(
                    &digest,
                    &[i; 38],
                    &format!("n-{i}"),
                    "test",
                    NOW,
                    NOW + 3600,
                )
                .await
                .expect("no storage error")
        });
    }
    let mut enrolled = 0;
    let mut used_up = 0;
    while let Some(r) = tasks.join_next().await {
        match r.expect("join") {
            Ok(_) => enrolled += 1,
            Err(EnrollRefusal::TokenUsedUp) => used_up += 1,
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    }
    assert_eq!((enrolled, used_up), (1, 7));
    let snap = one.snapshot().await.expect("snapshot");
    assert_eq!(snap.tokens[0].row.uses, 1);
    assert_eq!(snap.nodes.len(), 1);
    assert_eq!(
        snap.enrollment_requests
            .iter()
            .filter(|e| e.outcome == "enrolled")
            .count(),
        1
    );
}

async fn two_stores_starting_together_on_an_empty_database_make_one_key(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    // Both open (migrate) and create their first key at once.
    let start = |id: &'static str| {
        let t = &t;
        async move {
            let s = t.open().await;
            let made = s.init_keys(&key(id, 100), 5000).await.expect("init");
            (s, made)
        }
    };
    let ((a, made_a), (b2, made_b)) = tokio::join!(start("ka"), start("kb"));
    assert!(made_a ^ made_b, "exactly one made a key: {made_a} {made_b}");
    let (ka, kb) = (a.keys().await.expect("a"), b2.keys().await.expect("b"));
    let (ka, kb) = (ka.rows, kb.rows);
    assert_eq!(ka.len(), 1);
    assert_eq!(ka, kb, "both see the same one key");
    assert_eq!(a.next_rotation_at().await.expect("deadline"), Some(5000));
}

async fn a_rotation_is_claimed_once_by_two_stores(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (a, b2) = (t.open().await, t.open().await);
    assert!(a.init_keys(&key("k1", 100), 1000).await.expect("init"));
    let (k2, k3) = (key("k2", 1600), key("k3", 1600));
    let (won_a, won_b) = tokio::join!(
        a.rotate(Some(1000), 2000, &k2, 9000),
        b2.rotate(Some(1000), 2000, &k3, 9000)
    );
    let (won_a, won_b) = (won_a.expect("a"), won_b.expect("b"));
    assert!(won_a ^ won_b, "exactly one claims: a={won_a} b={won_b}");
    let keys = a.keys().await.expect("keys").rows;
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].key_id, "k1");
    assert_eq!(keys[0].verify_until, 9000, "old key got its grace end");
    assert_eq!(keys[1].verify_until, 0);
    assert_eq!(
        keys[1].secret,
        key("k2", 0).secret,
        "the secret opens as written"
    );
    assert_eq!(a.next_rotation_at().await.expect("read"), Some(2000));
    assert_eq!(count(&a.counts().await.expect("counts"), "signing_keys"), 2);
}

async fn a_lease_needs_a_live_router_and_a_revocation_removes_it(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let (s, other) = (t.open().await, t.open().await);
    s.create_token(&[1; 32], &token("member", 5, MEMBER, i64::MAX))
        .await
        .expect("member token");
    s.create_token(&[2; 32], &token("router", 10, ROUTER_ROLE, i64::MAX))
        .await
        .expect("router token");
    let member = s
        .enroll(&[1; 32], &[1; 38], "n-m", "t", NOW, NOW + 3600)
        .await
        .expect("store")
        .expect("member enrolls");
    let lease = |peer: &[u8], node: &str| LeaseRow {
        peer_id: peer.to_vec(),
        node_id: node.into(),
        addrs: vec!["/ip4/127.0.0.1/tcp/1".into()],
        labels: BTreeMap::new(),
        attached: 3,
        transit: 1,
        high: 100,
        low: 85,
        draining: false,
        expires_at: NOW + 30,
    };
    assert_eq!(
        s.router_lease(&lease(&[1; 38], &member.node.node_id), NOW)
            .await
            .expect("store"),
        Err(NodeRefusal::NotARouter)
    );
    assert_eq!(
        s.router_lease(&lease(&[7; 38], "n-x"), NOW)
            .await
            .expect("store"),
        Err(NodeRefusal::UnknownNode)
    );
    // Routers leasing while another store revokes them: a revoked router
    // is never left in the directory.
    for i in 0..6u8 {
        let peer = [100 + i; 38];
        s.enroll(&[2; 32], &peer, &format!("n-r{i}"), "t", NOW, NOW + 3600)
            .await
            .expect("store")
            .expect("router enrolls");
        let l = lease(&peer, &format!("n-r{i}"));
        let (leased, revoked) = tokio::join!(
            s.router_lease(&l, NOW),
            other.revoke(&peer, "test", NOW, NOW + 60)
        );
        let _ = leased.expect("store");
        assert!(revoked.expect("revoke") >= NOW + 60);
        let leases = s.directory(NOW).await.expect("directory");
        assert!(
            leases.iter().all(|x| x.peer_id != peer),
            "revoked router {i} left in the directory"
        );
        let revs = s.revocations().await.expect("revocations").rows;
        assert!(revs.iter().any(|r| r.peer_id == peer));
        assert_eq!(
            s.router_lease(&l, NOW).await.expect("store"),
            Err(NodeRefusal::Revoked)
        );
        assert_eq!(
            s.touch_node(&peer, NOW, None).await.expect("store"),
            Err(NodeRefusal::Revoked)
        );
    }
    // A live router's lease is listed, with what it said.
    s.enroll(&[2; 32], &[200; 38], "n-live", "t", NOW, NOW + 3600)
        .await
        .expect("store")
        .expect("enrolls");
    let node = s
        .router_lease(&lease(&[200; 38], "n-live"), NOW)
        .await
        .expect("store")
        .expect("leased");
    assert_eq!(node.role, ROUTER_ROLE);
    let leases = other.directory(NOW).await.expect("directory");
    assert_eq!(leases, vec![lease(&[200; 38], "n-live")]);
    assert!(other.directory(NOW + 31).await.expect("later").is_empty());
}

async fn enrollment_refusals_and_re_enrollment_keep_the_counts(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    s.create_token(&[3; 32], &token("t", 1, MEMBER, NOW + 10))
        .await
        .expect("token");
    let enroll = |peer: u8, now: i64| {
        let s = s.clone();
        async move {
            s.enroll(
                &[3; 32],
                &[peer; 38],
                &format!("n-{peer}"),
                "t",
                now,
                now + 3600,
            )
            .await
            .expect("store")
        }
    };
    let first = enroll(1, NOW).await.expect("enrolls");
    assert!(!first.re_enrolled);
    assert_eq!(first.node.labels.get("zone").map(String::as_str), Some("a"));
    let again = enroll(1, NOW + 1).await.expect("re-enrolls without a use");
    assert!(again.re_enrolled);
    assert_eq!(again.node.node_id, first.node.node_id);
    assert_eq!(enroll(2, NOW).await, Err(EnrollRefusal::TokenUsedUp));
    assert_eq!(enroll(3, NOW + 10).await, Err(EnrollRefusal::TokenExpired));
    assert_eq!(
        s.enroll(&[4; 32], &[4; 38], "n-4", "t", NOW, NOW)
            .await
            .expect("store"),
        Err(EnrollRefusal::UnknownToken)
    );
    let touched = s
        .touch_node(&[1; 38], NOW + 5, Some(NOW + 7200))
        .await
        .expect("store")
        .expect("touched");
    assert_eq!(
        (touched.last_seen, touched.cred_expires_at),
        (NOW + 5, NOW + 7200)
    );
    s.revoke(&[1; 38], "gone", NOW, NOW + 60)
        .await
        .expect("revoke");
    assert_eq!(enroll(1, NOW + 6).await, Err(EnrollRefusal::Revoked));
    let counts = s.counts().await.expect("counts");
    assert_eq!(count(&counts, "enrollment_requests"), 6);
    assert_eq!(count(&counts, "nodes"), 1);
    assert_eq!(count(&counts, "revocations"), 1);
}

async fn token_digests_are_the_live_tokens_up_to_a_limit(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    for (i, expires_at) in [(1u8, NOW + 10), (2, NOW + 20), (3, NOW)] {
        s.create_token(&[i; 32], &token(&format!("t{i}"), 1, MEMBER, expires_at))
            .await
            .expect("token");
    }
    let mut live = s.token_digests(NOW, 10).await.expect("digests");
    live.sort();
    assert_eq!(live, vec![[1; 32], [2; 32]], "the expired one is left out");
    assert_eq!(s.token_digests(NOW, 1).await.expect("digests").len(), 1);
    assert!(
        s.token_digests(NOW + 20, 10)
            .await
            .expect("digests")
            .is_empty()
    );
}

async fn a_backlog_is_reaped_in_bounded_batches(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    for i in 0..25u8 {
        s.create_token(&[i; 32], &token(&format!("old-{i}"), 1, MEMBER, 5))
            .await
            .expect("expired token");
    }
    let policy = ReapPolicy {
        node_retention_secs: 86_400,
        ephemeral_retention_secs: 3600,
        enrollment_retention_secs: 86_400,
        used_token_retention_secs: 86_400,
        policy_retention_secs: 86_400,
        admin_request_retention_secs: 86_400,
    };
    let mut per_batch = Vec::new();
    loop {
        let batch = s.reap_batch(NOW, &policy, 10).await.expect("batch");
        let reasons: Vec<_> = batch.iter().map(|(t, r, _)| (*t, *r)).collect();
        assert_eq!(reasons, DELETE_REASONS, "every reason, in order");
        let total: u64 = batch.iter().map(|x| x.2).sum();
        per_batch.push(total);
        if total < 10 {
            break;
        }
    }
    assert_eq!(per_batch, vec![10, 10, 5]);
    assert_eq!(count(&s.counts().await.expect("counts"), "tokens"), 0);
}

async fn a_snapshot_restores_into_an_empty_database_of_the_other_backend(b: Backend) {
    let Some(src) = Target::new(b).await else {
        return;
    };
    let Some(dst) = Target::new(b.other()).await else {
        return;
    };
    let s = src.open().await;
    s.create_token(&[2; 32], &token("router", 5, ROUTER_ROLE, i64::MAX))
        .await
        .expect("token");
    s.enroll(&[2; 32], &[5; 38], "n-r", "10.0.0.1", NOW, NOW + 3600)
        .await
        .expect("store")
        .expect("enrolls");
    let l = LeaseRow {
        peer_id: vec![5; 38],
        node_id: "n-r".into(),
        addrs: vec!["/ip4/127.0.0.1/tcp/9".into()],
        labels: BTreeMap::from([("zone".into(), "a".into())]),
        attached: 1,
        transit: 0,
        high: 10,
        low: 8,
        draining: true,
        expires_at: NOW + 30,
    };
    s.router_lease(&l, NOW)
        .await
        .expect("store")
        .expect("lease");
    s.init_keys(&key("k1", 100), 7000).await.expect("keys");
    s.revoke(&[6; 38], "never enrolled", NOW, NOW + 99)
        .await
        .expect("revoke");
    let snap = s.snapshot().await.expect("snapshot");
    // Another KEK on the target: keys are opened and sealed again.
    let d = dst.open().await;
    d.restore(&snap).await.expect("restore");
    assert_eq!(d.snapshot().await.expect("target snapshot"), snap);
    assert!(
        d.restore(&snap).await.is_err(),
        "a target with data is refused"
    );
}

async fn a_dump_of_the_keys_table_holds_no_private_key_bytes(b: Backend) {
    let Some(t) = Target::new(b).await else {
        return;
    };
    let s = t.open().await;
    let k = key("k1", 100);
    s.init_keys(&k, 1000).await.expect("init");
    // What a dump or a backup holds: the stored bytes of every row.
    let stored: Vec<Vec<u8>> = match b {
        Backend::Sqlite => {
            let path = t.url.trim_start_matches("sqlite://").to_string();
            let c = rusqlite::Connection::open(&path).expect("open file");
            let mut st = c
                .prepare("SELECT secret FROM signing_keys")
                .expect("prepare");
            let rows = st
                .query_map([], |r| r.get(0))
                .expect("query")
                .collect::<Result<Vec<Vec<u8>>, _>>()
                .expect("rows");
            // And the file itself, WAL included.
            let mut all = rows;
            for f in [path.clone(), format!("{path}-wal")] {
                all.push(std::fs::read(&f).unwrap_or_default());
            }
            all
        }
        Backend::Postgres => {
            let (c, conn) = tokio_postgres::connect(&t.url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            let task = tokio::spawn(conn);
            let rows = c
                .query("SELECT secret FROM signing_keys", &[])
                .await
                .expect("query")
                .iter()
                .map(|r| r.get::<_, Vec<u8>>(0))
                .collect();
            drop(c);
            let _ = task.await;
            rows
        }
    };
    assert!(!stored.is_empty());
    // The ed25519 secret is the first 32 bytes of the keypair.
    let secret = &k.secret[..32];
    for bytes in &stored {
        assert!(
            !bytes
                .windows(16)
                .any(|w| secret.windows(16).any(|s| s == w)),
            "private key bytes stored in the clear"
        );
    }
    // The key opens with the KEK; another KEK cannot open the store.
    assert_eq!(s.keys().await.expect("keys").rows[0].secret, k.secret);
    let without = open(&OpenOptions {
        url: t.url.clone(),
        read_connections: 1,
        pool_connections: 1,
        kek: Kek::from_hex(&Kek::generate_hex()).expect("another kek"),
    })
    .await
    .map(|_| ());
    assert!(
        matches!(without, Err(StoreError::Sealed { .. })),
        "{without:?}"
    );
}

on_both!(
    a_single_use_token_enrolls_exactly_one_of_many_racing,
    two_stores_starting_together_on_an_empty_database_make_one_key,
    a_rotation_is_claimed_once_by_two_stores,
    a_lease_needs_a_live_router_and_a_revocation_removes_it,
    enrollment_refusals_and_re_enrollment_keep_the_counts,
    token_digests_are_the_live_tokens_up_to_a_limit,
    a_backlog_is_reaped_in_bounded_batches,
    a_snapshot_restores_into_an_empty_database_of_the_other_backend,
    a_dump_of_the_keys_table_holds_no_private_key_bytes,
);

/// Both dialects' schemas have the same tables with the same columns.
#[tokio::test]
async fn the_sqlite_and_postgres_schemas_have_the_same_tables_and_columns() {
    let Some(pg) = Target::new(Backend::Postgres).await else {
        return;
    };
    let lite = Target::new(Backend::Sqlite).await.expect("sqlite");
    let _ = (pg.open().await, lite.open().await);
    let path = lite.url.trim_start_matches("sqlite://").to_string();
    let c = rusqlite::Connection::open(&path).expect("open");
    let mut st = c
        .prepare(
            "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' ORDER BY 1, 2",
        )
        .expect("prepare");
    let sqlite: Vec<(String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let (client, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let task = tokio::spawn(conn);
    let postgres: Vec<(String, String)> = client
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() ORDER BY 1, 2",
            &[],
        )
        .await
        .expect("query")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut sorted = sqlite.clone();
    sorted.sort();
    let mut pg_sorted = postgres.clone();
    pg_sorted.sort();
    assert_eq!(sorted, pg_sorted);
    assert!(sorted.len() > 40, "{sorted:?}");
    drop(client);
    let _ = task.await;
}

/// A lock held by another connection fails a PostgreSQL write at the
/// deadline as a timeout, and the call after it succeeds.
#[tokio::test]
async fn a_lock_held_elsewhere_times_out_a_postgres_write_at_its_deadline() {
    let Some(t) = Target::new(Backend::Postgres).await else {
        return;
    };
    struct Count(std::sync::Mutex<Vec<Wait>>);
    impl WaitObserver for Arc<Count> {
        fn wait_timed_out(&self, wait: Wait) {
            self.0.lock().expect("lock").push(wait);
        }
    }
    let seen = Arc::new(Count(std::sync::Mutex::new(Vec::new())));
    let db = Db::new(
        t.open().await,
        8,
        std::time::Duration::from_millis(300),
        seen.clone(),
    );
    let (client, conn) = tokio_postgres::connect(&t.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let task = tokio::spawn(conn);
    client
        .batch_execute("BEGIN; LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock");
    let row = token("t", 1, MEMBER, i64::MAX);
    let r = db.run(db.store().create_token(&[1; 32], &row)).await;
    assert!(
        matches!(r, Err(StoreError::Timeout(Wait::Lock | Wait::Statement))),
        "{r:?}"
    );
    assert_eq!(seen.0.lock().expect("lock").len(), 1);
    client.batch_execute("ROLLBACK").await.expect("unlock");
    db.run(db.store().create_token(&[1; 32], &row))
        .await
        .expect("writes once the lock is gone");
    drop(client);
    let _ = task.await;
}
