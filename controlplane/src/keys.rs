//! Signing keys: creation, publish-ahead rotation claimed through the
//! database, and the in-memory view used to sign and to serve `GetKeys`.
//!
//! Rotation: the next deadline lives in `rotation_state`. Whoever sees it
//! pass claims it with a conditional update (so two replicas never both
//! rotate, and a control plane restarted more often than the interval still
//! rotates: the deadline survives restarts). The claimer stores a new key
//! whose `active_from` is `now + publish_ahead`, so verifiers that fetch keys
//! get it before anything is signed with it, and gives every older key a
//! verification end of `new.active_from + grace`. Keys are stored with their
//! secrets in the database file (mode 0600).
//!
//! The verification view (the [`KeySet`] served and the [`Trust`] that
//! Refresh and RouterLease verify against) is built once per change, not per
//! call: a reload that finds other rows drops it, and it is rebuilt when the
//! first key in it reaches the end of its grace. A rotation made here reloads
//! before it returns, so the next call already sees the new key.
//!
//! Every [`KeySet`] served carries the database's epoch and the keys'
//! generation (a counter bumped in the transaction of every key write),
//! read in one snapshot with the keys: routers and members never replace a
//! set with an older one (`agentmesh_proto::order::key_set_replaces`), so
//! one failing over to a replica whose view has not reloaded yet keeps the
//! newer keys it holds.

use agentmesh_proto::order::KeyOrder;
use std::sync::{
    Arc, RwLock, RwLockReadGuard, RwLockWriteGuard,
    atomic::{AtomicU64, Ordering},
};

use agentmesh_proto::{
    credential::Trust,
    identity::ed25519,
    pb::credential::{KeySet, PublicKey},
};
use rand::RngCore;

use crate::store::{AdminRequest, Db, PriorRequest, SigningKeyRow, StoreError};

/// Rotation timing, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// Between rotations.
    pub interval_secs: i64,
    /// Publication before signing.
    pub publish_ahead_secs: i64,
    /// Verification after replacement.
    pub grace_secs: i64,
}

/// A key that can sign now.
#[derive(Clone)]
pub struct Signer {
    /// Its id, written into claims.
    pub key_id: String,
    /// The keypair.
    pub key: ed25519::Keypair,
}

#[derive(Clone)]
struct LoadedKey {
    row: SigningKeyRow,
    key: ed25519::Keypair,
}

/// What verifiers get at instants in `[from, until)`: the set only loses
/// keys as time passes (at their `verify_until`), so it holds until the
/// earliest end among its keys.
struct Verifiers {
    key_set: KeySet,
    trust: Arc<Trust>,
    from: i64,
    until: i64,
}

impl Verifiers {
    fn build(keys: &[LoadedKey], order: KeyOrder, now: i64) -> Self {
        let live = keys
            .iter()
            .filter(|k| k.row.verify_until == 0 || k.row.verify_until > now);
        let key_set = KeySet {
            keys: live
                .clone()
                .map(|k| PublicKey {
                    key_id: k.row.key_id.clone(),
                    ed25519: k.row.public.clone(),
                    active_from_unix_secs: k.row.active_from,
                    verify_until_unix_secs: k.row.verify_until,
                })
                .collect(),
            epoch: order.epoch,
            generation: order.generation,
            epoch_created_at_unix_secs: order.epoch_created_at,
        };
        let until = live
            .filter(|k| k.row.verify_until != 0)
            .map(|k| k.row.verify_until)
            .min()
            .unwrap_or(i64::MAX);
        Self {
            trust: Arc::new(Trust::new(&key_set)),
            key_set,
            from: now,
            until,
        }
    }

    fn covers(&self, now: i64) -> bool {
        // `from`: a wall clock stepped back rebuilds too.
        self.from <= now && now < self.until
    }
}

/// What one reload installed, and the view derived from it, swapped together.
#[derive(Default)]
struct Loaded {
    /// The number of the reload that installed this.
    reload: u64,
    keys: Vec<LoadedKey>,
    /// The epoch (and when it began) and generation read with `keys`.
    order: KeyOrder,
    next_rotation_at: Option<i64>,
    verifiers: Option<Verifiers>,
}

/// The keys as last loaded from the database.
pub struct Keys {
    policy: RotationPolicy,
    /// Reloads started, numbering them.
    reloads: AtomicU64,
    loaded: RwLock<Loaded>,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// A fresh key row, active from `active_from`.
pub fn new_key(active_from: i64) -> SigningKeyRow {
    let kp = ed25519::Keypair::generate();
    let mut id = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut id);
    SigningKeyRow {
        key_id: format!("k-{}", hex::encode(id)),
        secret: kp.to_bytes().to_vec(),
        public: kp.public().to_bytes().to_vec(),
        active_from,
        verify_until: 0,
    }
}

/// Decodes the stored keypairs.
fn parse_keys(rows: Vec<SigningKeyRow>) -> Result<Vec<LoadedKey>, StoreError> {
    rows.into_iter()
        .map(|row| {
            let mut bytes = row.secret.clone();
            let key =
                ed25519::Keypair::try_from_bytes(&mut bytes).map_err(|e| StoreError::Corrupt {
                    table: "signing_keys",
                    what: format!("key {}: {e}", row.key_id),
                })?;
            Ok(LoadedKey { row, key })
        })
        .collect()
}

impl Keys {
    /// Creates the first key if the database has none, then loads.
    pub async fn open(db: &Db, policy: RotationPolicy, now: i64) -> Result<Self, StoreError> {
        let first = new_key(now);
        let next = now + policy.interval_secs;
        db.run(db.store().init_keys(&first, next)).await?;
        let keys = Self {
            policy,
            reloads: AtomicU64::new(0),
            loaded: RwLock::new(Loaded::default()),
        };
        keys.reload(db).await?;
        Ok(keys)
    }

    /// Re-reads keys and the deadline (other replicas may have rotated).
    ///
    /// Reloads are numbered before they read and only a higher number is
    /// installed: one that started later read the database later, so the
    /// periodic check can never put back the keys a rotation's own reload
    /// replaced.
    pub async fn reload(&self, db: &Db) -> Result<(), StoreError> {
        // AcqRel: a later number also sees every commit the earlier reload saw.
        let reload = self.reloads.fetch_add(1, Ordering::AcqRel) + 1;
        let s = db.store();
        let (stored, next) = db
            .run(async { Ok((s.keys().await?, s.next_rotation_at().await?)) })
            .await?;
        let mut loaded = write(&self.loaded);
        if reload <= loaded.reload {
            return Ok(());
        }
        // Unchanged rows of the same generation keep the view; anything
        // else drops it, so no call after this one sees the old keys (or
        // the old generation: a reseal rewrites rows that open the same).
        let order = KeyOrder {
            epoch: stored.epoch,
            generation: stored.generation,
            epoch_created_at: stored.epoch_created_at,
        };
        if loaded.order != order || !loaded.keys.iter().map(|k| &k.row).eq(stored.rows.iter()) {
            loaded.keys = parse_keys(stored.rows)?;
            loaded.order = order;
            loaded.verifiers = None;
        }
        loaded.reload = reload;
        loaded.next_rotation_at = next;
        Ok(())
    }

    /// Rotates if the stored deadline has passed and this process claims it.
    /// Returns the new key's id when it rotated.
    pub async fn check(&self, db: &Db, now: i64) -> Result<Option<String>, StoreError> {
        self.reload(db).await?;
        let deadline = read(&self.loaded).next_rotation_at;
        match deadline {
            Some(d) if now >= d => self.rotate(db, Some(d), now).await,
            Some(_) => Ok(None),
            None => self.rotate(db, None, now).await,
        }
    }

    /// Rotates now (admin), whatever the deadline.
    pub async fn rotate_now(&self, db: &Db, now: i64) -> Result<(String, i64), StoreError> {
        let id = self.rotate(db, None, now).await?.unwrap_or_default();
        let active_from = now + self.policy.publish_ahead_secs;
        Ok((id, active_from))
    }

    /// As [`Keys::rotate_now`], recorded as one admin request: `record`
    /// makes its record from the new key's id and first signing instant,
    /// and the store writes it with the key in one transaction. When the
    /// request's id was recorded already nothing rotates and the earlier
    /// record is returned.
    pub async fn rotate_now_once(
        &self,
        db: &Db,
        now: i64,
        record: impl FnOnce(&str, i64) -> AdminRequest,
    ) -> Result<Result<(String, i64), PriorRequest>, StoreError> {
        let p = self.policy;
        let key = new_key(now + p.publish_ahead_secs);
        let (id, active_from) = (key.key_id.clone(), key.active_from);
        let request = record(&id, active_from);
        let done = db
            .run(db.store().rotate_once(
                now + p.interval_secs,
                &key,
                active_from + p.grace_secs,
                &request,
            ))
            .await?;
        self.reload(db).await?;
        if let Err(prior) = done {
            return Ok(Err(prior));
        }
        tracing::info!(key_id = %id, active_from, "signing key rotation: new key published");
        Ok(Ok((id, active_from)))
    }

    async fn rotate(
        &self,
        db: &Db,
        expected: Option<i64>,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        let p = self.policy;
        let key = new_key(now + p.publish_ahead_secs);
        let id = key.key_id.clone();
        let retire_until = key.active_from + p.grace_secs;
        let next = now + p.interval_secs;
        let claimed = db
            .run(db.store().rotate(expected, next, &key, retire_until))
            .await?;
        self.reload(db).await?;
        if claimed {
            tracing::info!(key_id = %id, active_from = now + p.publish_ahead_secs, "signing key rotation: new key published");
            Ok(Some(id))
        } else {
            Ok(None)
        }
    }

    /// The key that signs at `now`: the latest `active_from` that has come;
    /// on a tie (a rotation without publish-ahead in the key's own second),
    /// the key not retired yet. A rotation gives every key without an end
    /// one and adds the new key without, so that is the newest, whatever
    /// order the store returned them in (PostgreSQL orders keys of one
    /// second by id, not by creation).
    pub fn signer(&self, now: i64) -> Option<Signer> {
        let loaded = read(&self.loaded);
        loaded
            .keys
            .iter()
            .filter(|k| k.row.active_from <= now)
            .filter(|k| k.row.verify_until == 0 || k.row.verify_until > now)
            .max_by_key(|k| (k.row.active_from, k.row.verify_until == 0))
            .map(|k| Signer {
                key_id: k.row.key_id.clone(),
                key: k.key.clone(),
            })
    }

    /// Reads the verification view at `now`: the cached one if it covers
    /// `now`, else a new one (built once, under the write lock).
    fn with_verifiers<R>(&self, now: i64, f: impl FnOnce(&Verifiers) -> R) -> R {
        if let Some(v) = read(&self.loaded)
            .verifiers
            .as_ref()
            .filter(|v| v.covers(now))
        {
            return f(v);
        }
        let mut loaded = write(&self.loaded);
        if let Some(v) = loaded.verifiers.as_ref().filter(|v| v.covers(now)) {
            return f(v);
        }
        let v = Verifiers::build(&loaded.keys, loaded.order, now);
        f(loaded.verifiers.insert(v))
    }

    /// Keys verifiers should hold at `now` (published-ahead ones included).
    pub fn key_set(&self, now: i64) -> KeySet {
        self.with_verifiers(now, |v| v.key_set.clone())
    }

    /// A verifier over [`Keys::key_set`], shared until the keys change.
    pub fn trust(&self, now: i64) -> Arc<Trust> {
        self.with_verifiers(now, |v| v.trust.clone())
    }

    /// The stored rotation deadline as last read, Unix seconds.
    pub fn next_rotation_at(&self) -> Option<i64> {
        read(&self.loaded).next_rotation_at
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use super::*;
    use crate::{
        metrics::Metrics,
        store::{Kek, SqliteStore},
    };

    const GRACE: i64 = 100;

    async fn keys(dir: &std::path::Path, now: i64) -> (Db, Keys) {
        let path = dir.join("cp.db");
        let kek = Kek::from_hex(&Kek::generate_hex()).expect("kek");
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&path, kek))
            .await
            .expect("join")
            .expect("open");
        let metrics = Metrics::new(&mut Registry::default());
        let db = Db::new(
            std::sync::Arc::new(store),
            4,
            Duration::from_secs(5),
            metrics,
        );
        let policy = RotationPolicy {
            interval_secs: 86_400,
            publish_ahead_secs: 0,
            grace_secs: GRACE,
        };
        let keys = Keys::open(&db, policy, now).await.expect("open keys");
        (db, keys)
    }

    /// Two keys of one second: the one a rotation left without an end
    /// signs, in either load order.
    #[test]
    fn on_a_tie_the_key_not_retired_signs_whatever_the_load_order() {
        let key = |id: &str, verify_until: i64| LoadedKey {
            row: SigningKeyRow {
                key_id: id.into(),
                secret: Vec::new(),
                public: Vec::new(),
                active_from: 100,
                verify_until,
            },
            key: ed25519::Keypair::generate(),
        };
        for order in [[("old", 300), ("new", 0)], [("new", 0), ("old", 300)]] {
            let keys = Keys {
                policy: RotationPolicy {
                    interval_secs: 86_400,
                    publish_ahead_secs: 0,
                    grace_secs: 200,
                },
                reloads: AtomicU64::new(0),
                loaded: RwLock::new(Loaded {
                    keys: order.iter().map(|&(id, until)| key(id, until)).collect(),
                    ..Loaded::default()
                }),
            };
            assert_eq!(
                keys.signer(100).expect("a signer").key_id,
                "new",
                "{order:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_trust_is_reused_until_a_rotation_or_the_end_of_a_grace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = 1_000_000;
        let (db, keys) = keys(dir.path(), now).await;
        let first = keys.trust(now);
        let before = keys.key_set(now);
        assert!(before.epoch != 0 && before.generation != 0, "{before:?}");
        assert_eq!(first.key_order(), (before.epoch, before.generation));
        assert!(Arc::ptr_eq(&first, &keys.trust(now + 5)), "reused");
        keys.reload(&db).await.expect("reload");
        assert!(
            Arc::ptr_eq(&first, &keys.trust(now + 5)),
            "a reload that finds the same rows keeps it"
        );

        let (new_id, active_from) = keys.rotate_now(&db, now + 10).await.expect("rotate");
        let rotated = keys.trust(now + 10);
        assert!(
            !Arc::ptr_eq(&first, &rotated),
            "a rotation rebuilds at once"
        );
        assert!(rotated.has_key(&new_id));
        assert_eq!(
            rotated.key_count(),
            2,
            "the old key verifies within its grace"
        );
        let rotated_set = keys.key_set(now + 10);
        assert_eq!(rotated_set.keys.len(), 2);
        assert_eq!(rotated_set.epoch, before.epoch);
        assert!(
            rotated_set.generation > before.generation,
            "{rotated_set:?}"
        );
        assert!(
            !Trust::new(&rotated_set).takes_keys(&before),
            "never backwards"
        );

        let end = active_from + GRACE;
        assert!(
            Arc::ptr_eq(&rotated, &keys.trust(end - 1)),
            "reused to the end"
        );
        let after = keys.trust(end);
        assert!(!Arc::ptr_eq(&rotated, &after), "the grace end rebuilds");
        assert_eq!(after.key_count(), 1);
        assert!(after.has_key(&new_id));
        let ended = keys.key_set(end);
        assert_eq!(ended.keys.len(), 1);
        assert_eq!(
            ended.generation, rotated_set.generation,
            "a grace ending writes nothing (the reaper's delete will)"
        );
        assert!(Arc::ptr_eq(&after, &keys.trust(end + 1000)));
    }
}
