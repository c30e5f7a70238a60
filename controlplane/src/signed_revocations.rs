//! The revocation list as this process signs it: one signed copy per
//! (epoch, generation, signing key), made on first use and again when the
//! list, its epoch or the signing key changes.
//!
//! The list is read whole from the database with its generation in one
//! snapshot ([`crate::store::Store::revocations`]); the generation is
//! bumped in the transaction of every revocation write (a trigger), so it
//! follows the database's commit order, never a clock, and two processes
//! on one database sign the same entries under the same generation.
//! Members and routers take a list only when it supersedes theirs
//! (`agentmesh_proto::revocations::supersedes`), so what a router forwards
//! can be late but never forged or older.
//!
//! After a key rotation the same generation is signed again with the new
//! key (a later `issued_at`): routers replace their copy with it, so what
//! they forward keeps verifying once the old key's grace ends; members
//! keep the copy they verified (same generation, nothing to change).

use std::sync::Mutex;

use agentmesh_proto::{
    pb::credential::{Revocation, RevocationList, SignedRevocations},
    revocations::sign_revocations,
};

use crate::{keys::Signer, store::StoredRevocations};

/// The last signed copy, and what it was made from.
#[derive(Debug, Clone)]
struct Signed {
    epoch: u64,
    generation: u64,
    key_id: String,
    copy: SignedRevocations,
}

/// The signed revocation list (see the module doc).
#[derive(Debug, Default)]
pub struct RevocationsSigner {
    last: Mutex<Option<Signed>>,
}

impl RevocationsSigner {
    /// The signed copy of `stored` for `signer`: the cached one if it was
    /// made from the same epoch and generation with the same key, else a
    /// new one issued at `now` (then cached).
    pub fn signed(
        &self,
        stored: &StoredRevocations,
        signer: &Signer,
        now: i64,
    ) -> SignedRevocations {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = last.as_ref()
            && (s.epoch, s.generation) == (stored.epoch, stored.generation)
            && s.key_id == signer.key_id
        {
            return s.copy.clone();
        }
        let list = RevocationList {
            epoch: stored.epoch,
            generation: stored.generation,
            issued_at_unix_secs: now,
            entries: stored
                .rows
                .iter()
                .map(|r| Revocation {
                    peer_id: r.peer_id.clone(),
                    until_unix_secs: r.until,
                    reason: r.reason.clone(),
                    token_id: r.token_id.clone(),
                })
                .collect(),
            key_id: signer.key_id.clone(),
        };
        let copy = sign_revocations(&list, &signer.key);
        if copy.list.len() > agentmesh_proto::revocations::MAX_REVOCATIONS_LIST_BYTES {
            tracing::error!(
                bytes = copy.list.len(),
                entries = list.entries.len(),
                "the revocation list is over the size members and routers accept: revoke by token rather than node by node"
            );
        }
        *last = Some(Signed {
            epoch: stored.epoch,
            generation: stored.generation,
            key_id: signer.key_id.clone(),
            copy: copy.clone(),
        });
        copy
    }

    /// The id of the key the cached copy was made with, if any.
    pub fn signed_with(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|s| s.key_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RevocationRow;
    use agentmesh_proto::{
        credential::Trust,
        identity::ed25519,
        pb::credential::{KeySet, PublicKey},
        revocations::verify_revocations,
    };

    fn signer(id: &str) -> Signer {
        Signer {
            key_id: id.into(),
            key: ed25519::Keypair::generate(),
        }
    }

    fn trust(signers: &[&Signer]) -> Trust {
        Trust::new(&KeySet {
            keys: signers
                .iter()
                .map(|s| PublicKey {
                    key_id: s.key_id.clone(),
                    ed25519: s.key.public().to_bytes().to_vec(),
                    active_from_unix_secs: 0,
                    verify_until_unix_secs: 0,
                })
                .collect(),
            ..Default::default()
        })
    }

    fn stored(generation: u64) -> StoredRevocations {
        StoredRevocations {
            epoch: 42,
            generation,
            rows: vec![RevocationRow {
                peer_id: Vec::new(),
                token_id: "t1".into(),
                until: 500,
                reason: "leaked".into(),
            }],
        }
    }

    #[test]
    fn one_copy_per_generation_and_key_and_a_new_one_after_a_rotation() {
        let s = RevocationsSigner::default();
        let k1 = signer("k1");
        let first = s.signed(&stored(3), &k1, 100);
        let list = verify_revocations(&first, &trust(&[&k1]), 100).expect("verifies");
        assert_eq!(
            (list.epoch, list.generation, list.issued_at_unix_secs),
            (42, 3, 100)
        );
        assert_eq!(list.entries.len(), 1);
        assert_eq!(list.entries[0].token_id, "t1");
        assert_eq!(s.signed(&stored(3), &k1, 200), first, "cached");
        let next = s.signed(&stored(4), &k1, 300);
        assert_ne!(next, first, "a new generation is signed anew");

        let k2 = signer("k2");
        let again = s.signed(&stored(4), &k2, 400);
        let list = verify_revocations(&again, &trust(&[&k2]), 400).expect("the new key");
        assert_eq!(
            (
                list.generation,
                list.issued_at_unix_secs,
                list.key_id.as_str()
            ),
            (4, 400, "k2")
        );
        assert_eq!(s.signed_with().as_deref(), Some("k2"));
    }
}
