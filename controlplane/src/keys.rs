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

use std::sync::RwLock;

use agentmesh_proto::{
    credential::Trust,
    identity::ed25519,
    pb::credential::{KeySet, PublicKey},
};
use rand::RngCore;

use crate::store::{Db, SigningKeyRow, StoreError};

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

/// The keys as last loaded from the database.
pub struct Keys {
    policy: RotationPolicy,
    loaded: RwLock<Vec<LoadedKey>>,
    next_rotation_at: RwLock<Option<i64>>,
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

impl Keys {
    /// Creates the first key if the database has none, then loads.
    pub async fn open(db: &Db, policy: RotationPolicy, now: i64) -> Result<Self, StoreError> {
        let first = new_key(now);
        let next = now + policy.interval_secs;
        db.run(move |s| s.init_keys(&first, next)).await?;
        let keys = Self {
            policy,
            loaded: RwLock::new(Vec::new()),
            next_rotation_at: RwLock::new(None),
        };
        keys.reload(db).await?;
        Ok(keys)
    }

    /// Re-reads keys and the deadline (other replicas may have rotated).
    pub async fn reload(&self, db: &Db) -> Result<(), StoreError> {
        let (rows, next) = db.run(|s| Ok((s.keys()?, s.next_rotation_at()?))).await?;
        let mut loaded = Vec::with_capacity(rows.len());
        for row in rows {
            let mut bytes = row.secret.clone();
            let key =
                ed25519::Keypair::try_from_bytes(&mut bytes).map_err(|e| StoreError::Corrupt {
                    table: "signing_keys",
                    what: format!("key {}: {e}", row.key_id),
                })?;
            loaded.push(LoadedKey { row, key });
        }
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = loaded;
        *self
            .next_rotation_at
            .write()
            .unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    /// Rotates if the stored deadline has passed and this process claims it.
    /// Returns the new key's id when it rotated.
    pub async fn check(&self, db: &Db, now: i64) -> Result<Option<String>, StoreError> {
        self.reload(db).await?;
        let deadline = *self
            .next_rotation_at
            .read()
            .unwrap_or_else(|p| p.into_inner());
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
            .run(move |s| s.rotate(expected, next, &key, retire_until))
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
    /// on a tie, the key created last (keys are loaded in creation order and
    /// `max_by_key` keeps the last maximum).
    pub fn signer(&self, now: i64) -> Option<Signer> {
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        loaded
            .iter()
            .filter(|k| k.row.active_from <= now)
            .filter(|k| k.row.verify_until == 0 || k.row.verify_until > now)
            .max_by_key(|k| k.row.active_from)
            .map(|k| Signer {
                key_id: k.row.key_id.clone(),
                key: k.key.clone(),
            })
    }

    /// Keys verifiers should hold at `now` (published-ahead ones included).
    pub fn key_set(&self, now: i64) -> KeySet {
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        KeySet {
            keys: loaded
                .iter()
                .filter(|k| k.row.verify_until == 0 || k.row.verify_until > now)
                .map(|k| PublicKey {
                    key_id: k.row.key_id.clone(),
                    ed25519: k.row.public.clone(),
                    active_from_unix_secs: k.row.active_from,
                    verify_until_unix_secs: k.row.verify_until,
                })
                .collect(),
        }
    }

    /// A verifier over [`Keys::key_set`].
    pub fn trust(&self, now: i64) -> Trust {
        Trust::new(&self.key_set(now))
    }

    /// The stored rotation deadline as last read, Unix seconds.
    pub fn next_rotation_at(&self) -> Option<i64> {
        *self
            .next_rotation_at
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }
}
