//! The policy in force as this process holds it: the text exactly as
//! applied, its checked form, where it came from, and its signed copy.
//!
//! One value per version ([`PolicyInForce`], immutable but for the signed
//! copy), swapped whole in [`HeldPolicy`] when a version is applied here or
//! found in the database (another process applied it). Version 0 is "none
//! applied": the deny-all document [`DENY_ALL_TEXT`], signed and
//! distributed like any other, so members and routers enforce deny-all
//! rather than take a missing policy for a control plane that predates
//! policies.
//!
//! The signed copy is made on first use and again whenever the signing key
//! changes (a rotation), so what the directory carries always verifies
//! against the key set served with it. `issued_at` is the signing instant:
//! across epochs, verifiers keep the later-issued document (see
//! `agentmesh_proto::policy::supersedes`).

use std::sync::{Arc, Mutex, RwLock};

use agentmesh_policy::{ALLOW_ALL, Policy, PolicyError, Summary};
use agentmesh_proto::{
    pb::credential::{PolicyDocument, SignedPolicy},
    policy::sign_policy,
};

use crate::{keys::Signer, store::PolicyRow};

/// What version 0 carries: no owner, no grant, so every call is refused.
pub const DENY_ALL_TEXT: &str =
    "# No policy has been applied: every call is refused.\nformat = 1\n";

/// One policy version as held in memory.
pub struct PolicyInForce {
    /// The database's policy epoch.
    pub epoch: u64,
    /// 0 when none was applied.
    pub version: u64,
    /// The document exactly as applied.
    pub text: String,
    /// Its checked form.
    pub policy: Policy,
    /// Unix seconds (0 for version 0).
    pub applied_at: i64,
    /// Who applied it.
    pub applied_by: String,
    /// From where.
    pub applied_from: String,
    signed: Mutex<Option<SignedPolicy>>,
    signed_key: Mutex<Option<String>>,
}

impl std::fmt::Debug for PolicyInForce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyInForce")
            .field("epoch", &format_args!("{:016x}", self.epoch))
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PolicyInForce {
    /// Version 0 of `epoch`: nothing applied, every call denied.
    pub fn none(epoch: u64) -> Self {
        Self {
            epoch,
            version: 0,
            text: DENY_ALL_TEXT.to_string(),
            policy: Policy::deny_all(),
            applied_at: 0,
            applied_by: String::new(),
            applied_from: String::new(),
            signed: Mutex::new(None),
            signed_key: Mutex::new(None),
        }
    }

    /// A stored version, checked again (a row this binary cannot read is an
    /// error, never a policy silently replaced by another).
    pub fn from_row(epoch: u64, row: &PolicyRow) -> Result<Self, PolicyError> {
        Ok(Self::checked(epoch, row, Policy::parse(&row.text)?))
    }

    /// A stored version whose text was checked into `policy`.
    pub fn checked(epoch: u64, row: &PolicyRow, policy: Policy) -> Self {
        Self {
            epoch,
            version: row.version,
            text: row.text.clone(),
            policy,
            applied_at: row.applied_at,
            applied_by: row.applied_by.clone(),
            applied_from: row.applied_from.clone(),
            signed: Mutex::new(None),
            signed_key: Mutex::new(None),
        }
    }

    /// Whether no policy was ever applied (deny-all).
    pub fn is_none(&self) -> bool {
        self.version == 0
    }

    /// Whether this is the built-in allow-all policy.
    pub fn is_allow_all(&self) -> bool {
        self.version > 0 && self.text == ALLOW_ALL
    }

    /// Groups, owner rules, grants and tests.
    pub fn summary(&self) -> Summary {
        self.policy.summary()
    }

    /// The id of the key the cached signed copy was made with, if any.
    pub fn signed_with(&self) -> Option<String> {
        lock(&self.signed_key).clone()
    }

    /// The signed copy for `signer`: the cached one if `signer` made it,
    /// else a new one issued at `now` (then cached).
    pub fn signed(&self, signer: &Signer, now: i64) -> SignedPolicy {
        let mut key = lock(&self.signed_key);
        let mut signed = lock(&self.signed);
        if key.as_deref() == Some(signer.key_id.as_str())
            && let Some(s) = signed.as_ref()
        {
            return s.clone();
        }
        let doc = PolicyDocument {
            epoch: self.epoch,
            version: self.version,
            issued_at_unix_secs: now,
            text: self.text.clone(),
            key_id: signer.key_id.clone(),
        };
        let s = sign_policy(&doc, &signer.key);
        *key = Some(signer.key_id.clone());
        *signed = Some(s.clone());
        s
    }
}

/// The policy in force, swapped whole.
#[derive(Debug)]
pub struct HeldPolicy {
    current: RwLock<Arc<PolicyInForce>>,
    /// The last stored version found unreadable, logged once.
    unreadable: Mutex<Option<(u64, u64)>>,
}

impl Default for HeldPolicy {
    /// Deny-all of an unknown epoch, until start-up reads the database.
    fn default() -> Self {
        Self {
            current: RwLock::new(Arc::new(PolicyInForce::none(0))),
            unreadable: Mutex::new(None),
        }
    }
}

impl HeldPolicy {
    /// The policy in force.
    pub fn get(&self) -> Arc<PolicyInForce> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Installs `next` unless the one held is the same version or a later
    /// one of the same epoch (a slower reader of the database must not put
    /// back what an apply replaced). Returns whether it did.
    pub fn install(&self, next: PolicyInForce) -> bool {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.epoch == next.epoch && cur.version >= next.version && !cur.is_placeholder() {
            return false;
        }
        *cur = Arc::new(next);
        true
    }

    /// Records that stored version `version` of `epoch` could not be read;
    /// returns whether that is news (so it is logged once, not every check).
    pub fn note_unreadable(&self, epoch: u64, version: u64) -> bool {
        lock(&self.unreadable).replace((epoch, version)) != Some((epoch, version))
    }
}

impl PolicyInForce {
    /// The value held before start-up read the database.
    fn is_placeholder(&self) -> bool {
        self.epoch == 0 && self.version == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_proto::{
        credential::Trust,
        identity::ed25519,
        pb::credential::{KeySet, PublicKey},
        policy::verify_policy,
    };

    fn signer(id: &str) -> Signer {
        Signer {
            key_id: id.into(),
            key: ed25519::Keypair::generate(),
        }
    }

    fn trust(s: &Signer) -> Trust {
        Trust::new(&KeySet {
            keys: vec![PublicKey {
                key_id: s.key_id.clone(),
                ed25519: s.key.public().to_bytes().to_vec(),
                active_from_unix_secs: 0,
                verify_until_unix_secs: 0,
            }],
            ..Default::default()
        })
    }

    fn row(version: u64, text: &str) -> PolicyRow {
        PolicyRow {
            version,
            text: text.into(),
            applied_at: 10,
            applied_by: "t".into(),
            applied_from: "here".into(),
            replaced_at: None,
        }
    }

    #[test]
    fn the_deny_all_text_parses_to_a_policy_that_allows_nothing() {
        let p = Policy::parse(DENY_ALL_TEXT).expect("parses");
        let s = p.summary();
        assert_eq!((s.groups, s.owners, s.grants, s.tests), (0, 0, 0, 0));
        assert!(PolicyInForce::none(7).is_none());
        assert!(!PolicyInForce::none(7).is_allow_all());
    }

    #[test]
    fn the_signed_copy_verifies_and_is_made_again_only_for_another_key() {
        let held = PolicyInForce::from_row(42, &row(3, ALLOW_ALL)).expect("allow-all parses");
        assert!(held.is_allow_all());
        let k1 = signer("k1");
        let first = held.signed(&k1, 100);
        let doc = verify_policy(&first, &trust(&k1)).expect("verifies");
        assert_eq!(
            (
                doc.epoch,
                doc.version,
                doc.issued_at_unix_secs,
                doc.key_id.as_str()
            ),
            (42, 3, 100, "k1")
        );
        assert_eq!(doc.text, ALLOW_ALL);
        assert_eq!(held.signed(&k1, 200), first, "cached for the same key");
        let k2 = signer("k2");
        let again = held.signed(&k2, 300);
        let doc = verify_policy(&again, &trust(&k2)).expect("re-signed with the new key");
        assert_eq!((doc.version, doc.issued_at_unix_secs), (3, 300));
        assert_eq!(held.signed_with().as_deref(), Some("k2"));
    }

    #[test]
    fn a_stored_text_this_binary_cannot_read_is_an_error() {
        assert!(PolicyInForce::from_row(1, &row(1, "format = 9\n")).is_err());
    }

    #[test]
    fn an_older_version_of_the_same_epoch_is_never_put_back() {
        let h = HeldPolicy::default();
        assert!(
            h.install(PolicyInForce::none(5)),
            "start-up replaces the placeholder"
        );
        assert!(h.install(PolicyInForce::from_row(5, &row(2, ALLOW_ALL)).expect("ok")));
        assert!(!h.install(PolicyInForce::from_row(5, &row(1, ALLOW_ALL)).expect("ok")));
        assert!(!h.install(PolicyInForce::from_row(5, &row(2, ALLOW_ALL)).expect("ok")));
        assert_eq!(h.get().version, 2);
        assert!(
            h.install(PolicyInForce::from_row(6, &row(1, ALLOW_ALL)).expect("ok")),
            "a new epoch replaces whatever version"
        );
        assert_eq!((h.get().epoch, h.get().version), (6, 1));
    }
}
