//! The signed policy document: signing (control plane) and offline
//! verification (routers, members), and which of two documents is current.
//!
//! Like a credential, the document is carried as its exact encoded bytes
//! and signed over [`POLICY_DOMAIN_PREFIX`] followed by them, with a key of
//! the control plane's key set; what the policy *says* is
//! `agentmesh-policy`'s business, not this crate's.

use libp2p_identity::ed25519;
use prost::Message;

use crate::credential::Trust;
use crate::order::within_epoch;
use crate::pb::credential::{PolicyDocument, SignedPolicy};

/// Domain separation: a policy signature can never pass as a credential's
/// or a record's, nor the other way round.
pub const POLICY_DOMAIN_PREFIX: &[u8] = b"agentmesh policy v1\0";

/// The largest encoded document accepted, in bytes: the policy text's own
/// cap (1 MiB) plus room for the other fields.
pub const MAX_POLICY_DOCUMENT_BYTES: usize = (1 << 20) + 4096;

/// Why a signed policy was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyVerifyError {
    #[error("policy document is {0} bytes, over the cap")]
    TooLarge(usize),
    #[error("policy document does not decode")]
    Malformed,
    #[error("policy signed by unknown key {0:?}")]
    UnknownKey(String),
    #[error("policy signature does not verify")]
    BadSignature,
}

impl PolicyVerifyError {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PolicyVerifyError::TooLarge(_) => "too_large",
            PolicyVerifyError::Malformed => "malformed",
            PolicyVerifyError::UnknownKey(_) => "unknown_key",
            PolicyVerifyError::BadSignature => "bad_signature",
        }
    }

    /// Every value of [`reason`](Self::reason), to pre-create metric labels.
    pub const REASONS: [&'static str; 4] =
        ["too_large", "malformed", "unknown_key", "bad_signature"];
}

/// Encodes `doc` and signs it with `key` (the control plane's side); the
/// caller sets `doc.key_id` to the key's id.
pub fn sign_policy(doc: &PolicyDocument, key: &ed25519::Keypair) -> SignedPolicy {
    let document = doc.encode_to_vec();
    SignedPolicy {
        signature: key.sign(&signed_bytes(&document)),
        document,
    }
}

/// Verifies a signed policy against the trusted keys and returns its
/// document. A key past its verify-until still verifies a policy: the
/// control plane re-signs the policy when it rotates, and a member must
/// not be left with no policy because it missed the re-signed copy.
pub fn verify_policy(
    signed: &SignedPolicy,
    trust: &Trust,
) -> Result<PolicyDocument, PolicyVerifyError> {
    if signed.document.len() > MAX_POLICY_DOCUMENT_BYTES {
        return Err(PolicyVerifyError::TooLarge(signed.document.len()));
    }
    let doc = PolicyDocument::decode(signed.document.as_slice())
        .map_err(|_| PolicyVerifyError::Malformed)?;
    let key = trust
        .public_key(&doc.key_id)
        .ok_or_else(|| PolicyVerifyError::UnknownKey(doc.key_id.clone()))?;
    if !key.verify(&signed_bytes(&signed.document), &signed.signature) {
        return Err(PolicyVerifyError::BadSignature);
    }
    Ok(doc)
}

/// The `(epoch, version)` a signed policy names, unverified (`None` when
/// its document does not decode): enough to tell whether a holder already
/// has that version, never to trust it.
pub fn peek_version(signed: &SignedPolicy) -> Option<(u64, u64)> {
    peek_document(signed).map(|d| (d.epoch, d.version))
}

/// The document, unverified (`None` when it does not decode): enough to
/// read what it names (its version, its signing key: whether the keys must
/// be read before verifying it), never to trust it.
pub fn peek_document(signed: &SignedPolicy) -> Option<PolicyDocument> {
    PolicyDocument::decode(signed.document.as_slice()).ok()
}

/// Whether `incoming` should replace `held`. Within an epoch only a higher
/// version does. A different epoch (the history restarted: a new or
/// restored database) replaces the held one only if it was issued later,
/// so a replayed document of an old epoch never rolls a member back, and a
/// restored database is not ignored for holding lower versions than the
/// members saw before the restore.
pub fn supersedes(incoming: &PolicyDocument, held: Option<&PolicyDocument>) -> bool {
    let Some(h) = held else {
        return true;
    };
    match within_epoch((h.epoch, h.version), (incoming.epoch, incoming.version)) {
        Some(o) => o.is_gt(),
        None => incoming.issued_at_unix_secs > h.issued_at_unix_secs,
    }
}

fn signed_bytes(document: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(POLICY_DOMAIN_PREFIX.len() + document.len());
    msg.extend_from_slice(POLICY_DOMAIN_PREFIX);
    msg.extend_from_slice(document);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::credential::{KeySet, PublicKey};

    fn setup() -> (ed25519::Keypair, Trust) {
        let key = ed25519::Keypair::generate();
        let trust = Trust::new(&KeySet {
            keys: vec![PublicKey {
                key_id: "k1".into(),
                ed25519: key.public().to_bytes().to_vec(),
                active_from_unix_secs: 0,
                verify_until_unix_secs: 0,
            }],
            ..Default::default()
        });
        (key, trust)
    }

    fn doc(epoch: u64, version: u64, issued: i64) -> PolicyDocument {
        PolicyDocument {
            epoch,
            version,
            issued_at_unix_secs: issued,
            text: "format = 1\n".into(),
            key_id: "k1".into(),
        }
    }

    #[test]
    fn a_signed_policy_verifies_and_a_tampered_one_does_not() {
        let (key, trust) = setup();
        let signed = sign_policy(&doc(7, 3, 100), &key);
        assert_eq!(verify_policy(&signed, &trust), Ok(doc(7, 3, 100)));

        let mut tampered = signed.clone();
        if let Some(b) = tampered.document.last_mut() {
            *b ^= 1;
        }
        assert!(verify_policy(&tampered, &trust).is_err());

        let other = ed25519::Keypair::generate();
        assert_eq!(
            verify_policy(&sign_policy(&doc(7, 3, 100), &other), &trust),
            Err(PolicyVerifyError::BadSignature)
        );
        let mut unknown = doc(7, 3, 100);
        unknown.key_id = "k9".into();
        assert_eq!(
            verify_policy(&sign_policy(&unknown, &key), &trust),
            Err(PolicyVerifyError::UnknownKey("k9".into()))
        );
        let garbage = SignedPolicy {
            document: vec![0xff; 8],
            signature: vec![],
        };
        assert_eq!(
            verify_policy(&garbage, &trust),
            Err(PolicyVerifyError::Malformed)
        );
        let huge = SignedPolicy {
            document: vec![0; MAX_POLICY_DOCUMENT_BYTES + 1],
            signature: vec![],
        };
        assert!(matches!(
            verify_policy(&huge, &trust),
            Err(PolicyVerifyError::TooLarge(_))
        ));
    }

    #[test]
    fn only_newer_documents_supersede() {
        let held = doc(7, 3, 100);
        assert!(supersedes(&held, None));
        assert!(
            supersedes(&doc(7, 4, 90), Some(&held)),
            "same epoch: the version decides"
        );
        assert!(!supersedes(&doc(7, 3, 200), Some(&held)));
        assert!(!supersedes(&doc(7, 2, 200), Some(&held)));
        assert!(
            supersedes(&doc(8, 1, 101), Some(&held)),
            "a restored history issued later"
        );
        assert!(
            !supersedes(&doc(6, 9, 99), Some(&held)),
            "a replay of an older epoch"
        );
    }
}
