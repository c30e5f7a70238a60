//! SQLite's deadlines, on real files: a held writer, a file lock held by
//! another connection and a full set of slots each fail the waiting call
//! with `Timeout` at its deadline, counted; reads go on beside a held
//! writer; a backlog is reaped in bounded batches. The suite both backends
//! pass is `suite.rs`.

use std::{
    collections::BTreeMap,
    sync::{Arc, mpsc},
    time::Duration,
};

use rusqlite::Connection;

use super::*;

/// How long a test holds something the call under test waits for, at most:
/// released as soon as the test is done with it, so a failing test ends
/// instead of hanging.
const HOLD_AT_MOST: Duration = Duration::from_secs(30);

/// The waits that ran out, as the metrics would count them.
#[derive(Default)]
struct Seen(std::sync::Mutex<Vec<Wait>>);

impl WaitObserver for Arc<Seen> {
    fn wait_timed_out(&self, wait: Wait) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(wait);
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    db: Db,
    seen: Arc<Seen>,
}

impl Fixture {
    fn new(max_inflight: usize, wait: Duration) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
        let store =
            Arc::new(SqliteStore::open_with(&dir.path().join("cp.db"), 2, kek).expect("open"));
        let seen = Arc::new(Seen::default());
        let db = Db::new(store.clone(), max_inflight, wait, seen.clone());
        Self {
            dir,
            store,
            db,
            seen,
        }
    }

    fn timeouts(&self, wait: Wait) -> f64 {
        let seen = self.seen.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().filter(|w| **w == wait).count() as f64
    }

    async fn create_token(&self, id: &str) -> Result<(), StoreError> {
        let row = TokenRow {
            token_id: id.into(),
            kind: 1,
            role: 1,
            labels: BTreeMap::new(),
            max_uses: 1,
            uses: 0,
            created_at: 1,
            expires_at: i64::MAX,
        };
        let digest = [id.len() as u8; 32];
        self.db
            .run(self.db.store().create_token(&digest, &row))
            .await
    }
}

/// Holds the writer on another thread until the returned sender is dropped.
fn hold_writer(store: &Arc<SqliteStore>) -> (mpsc::SyncSender<()>, std::thread::JoinHandle<()>) {
    let (held_tx, held_rx) = mpsc::sync_channel(1);
    let (release_tx, release_rx) = mpsc::sync_channel::<()>(1);
    let s = store.clone();
    let holder = std::thread::spawn(move || {
        let _writer = s.writer().expect("the writer is free at first");
        held_tx.send(()).expect("signal");
        let _ = release_rx.recv_timeout(HOLD_AT_MOST);
    });
    held_rx.recv_timeout(HOLD_AT_MOST).expect("writer held");
    (release_tx, holder)
}

#[tokio::test]
async fn a_held_writer_fails_the_next_write_at_its_deadline_while_reads_go_on() {
    let f = Fixture::new(8, Duration::from_millis(200));
    let (release, holder) = hold_writer(&f.store);
    let r = f.create_token("first").await;
    assert!(matches!(r, Err(StoreError::Timeout(Wait::Writer))), "{r:?}");
    assert_eq!(f.timeouts(Wait::Writer), 1.0);
    // Reads have their own connections: none of them waits for the writer.
    let s = f.db.store();
    f.db.run(s.ping()).await.expect("ping");
    f.db.run(s.directory(0)).await.expect("directory");
    f.db.run(s.revocations()).await.expect("revocations");
    f.db.run(s.keys()).await.expect("keys");
    f.db.run(s.counts()).await.expect("counts");
    assert_eq!(f.timeouts(Wait::Reader), 0.0);
    drop(release);
    holder.join().expect("holder");
    f.create_token("second").await.expect("the writer is back");
    let counts = f.db.run(f.db.store().counts()).await.expect("counts");
    assert!(counts.contains(&("tokens".to_string(), 1)), "{counts:?}");
}

#[tokio::test]
async fn a_file_lock_held_by_another_connection_fails_at_the_deadline() {
    let f = Fixture::new(8, Duration::from_millis(200));
    // Another process (a second replica, an offline `token create`) writing.
    let other = Connection::open(f.dir.path().join("cp.db")).expect("open");
    other.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let r = f.create_token("first").await;
    assert!(matches!(r, Err(StoreError::Timeout(Wait::Lock))), "{r:?}");
    assert_eq!(f.timeouts(Wait::Lock), 1.0);
    other.execute_batch("ROLLBACK").expect("unlock");
    f.create_token("second").await.expect("writes again");
}

#[tokio::test]
async fn no_free_slot_fails_at_the_deadline_and_is_counted() {
    let f = Fixture::new(1, Duration::from_millis(200));
    let (release_tx, release_rx) = mpsc::sync_channel::<()>(1);
    let db = f.db.clone();
    let holder = tokio::spawn(async move {
        db.run(async move {
            tokio::task::spawn_blocking(move || {
                let _ = release_rx.recv_timeout(HOLD_AT_MOST);
            })
            .await
            .map_err(|e| StoreError::Task(e.to_string()))
        })
        .await
    });
    // The holder took the only slot once a read cannot get one either.
    let r = loop {
        match f.db.run(f.db.store().ping()).await {
            Ok(()) => tokio::task::yield_now().await,
            Err(e) => break e,
        }
    };
    assert!(matches!(r, StoreError::Timeout(Wait::Slot)), "{r:?}");
    assert_eq!(f.timeouts(Wait::Slot), 1.0);
    drop(release_tx);
    holder.await.expect("join").expect("holder ran");
    f.db.run(f.db.store().ping()).await.expect("a slot again");
}

#[tokio::test]
async fn a_backlog_is_reaped_in_batches_of_at_most_max_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
    let store = SqliteStore::open(&dir.path().join("cp.db"), kek).expect("open");
    store
        .writer()
        .expect("writer")
        .execute_batch(
            "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < 12)
             INSERT INTO nodes (node_id, peer_id, role, token_kind, token_id, labels,
                                enrolled_at, last_seen, cred_expires_at)
             SELECT 'n-' || n, randomblob(38), 1, 1, 't', '{}', 1, 1, 0 FROM i;
             WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < 13)
             INSERT INTO enrollment_requests (source, outcome, at)
             SELECT 'test', 'enrolled', 1 FROM i;",
        )
        .expect("stale rows");
    let day = 86_400;
    let policy = ReapPolicy {
        node_retention_secs: day,
        ephemeral_retention_secs: day,
        enrollment_retention_secs: day,
        used_token_retention_secs: day,
        policy_retention_secs: day,
        admin_request_retention_secs: day,
    };
    let now = 10 * day;
    let mut batches = Vec::new();
    loop {
        let batch = store.reap_batch(now, &policy, 10).await.expect("batch");
        let reasons: Vec<_> = batch.iter().map(|(t, r, _)| (*t, *r)).collect();
        assert_eq!(reasons, DELETE_REASONS, "every reason, in order");
        let n = |t: &str, r: &str| {
            batch
                .iter()
                .find(|(a, b, _)| (*a, *b) == (t, r))
                .map(|x| x.2)
                .expect("reported")
        };
        let total: u64 = batch.iter().map(|x| x.2).sum();
        batches.push((n("nodes", "lapsed"), n("enrollment_requests", "expired")));
        if total < 10 {
            break;
        }
    }
    // 25 rows, 10 a batch: ceil(25 / 10) = 3 transactions, the second
    // finishing one table and starting the next.
    assert_eq!(batches, vec![(10, 0), (2, 8), (0, 5)]);
    let left = store.counts().await.expect("counts");
    assert!(left.contains(&("nodes".to_string(), 0)), "{left:?}");
    assert!(
        left.contains(&("enrollment_requests".to_string(), 0)),
        "{left:?}"
    );
}
