//! Signing and offline verification of credentials.
//!
//! A credential is `Claims` encoded once by the signer, plus an ed25519
//! signature over [`DOMAIN_PREFIX`] followed by exactly those bytes. Verifiers
//! never re-encode claims: they check the signature over the bytes they got,
//! then decode. Every size is capped and no input can make this code panic.

use std::collections::{BTreeMap, HashMap};

use libp2p_identity::{PeerId, ed25519};
use prost::Message;

use crate::order::{KeyOrder, key_set_replaces};
use crate::pb::credential::{Claims, Credential, KeySet, Label, Revocation, Role, TokenKind};

/// Domain separation: a credential signature can never be mistaken for any
/// other signature made with the same key.
pub const DOMAIN_PREFIX: &[u8] = b"agentmesh credential v1\0";

/// Largest encoded credential (or claims) accepted: 64 KiB.
pub const MAX_CREDENTIAL_BYTES: usize = 64 * 1024;

/// Why a credential was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Bytes that are not a credential, oversized, or claims that do not parse.
    #[error("malformed credential: {0}")]
    Malformed(&'static str),
    /// The key id is not in the key set (the verifier may fetch keys again).
    #[error("unknown signing key {0:?}")]
    UnknownKey(String),
    /// The signature does not match the claims under the named key.
    #[error("bad signature")]
    BadSignature,
    /// `now` is past the expiry plus skew.
    #[error("expired at {expired_at} (now {now})")]
    Expired {
        /// Expiry in the claims.
        expired_at: i64,
        /// Verifier's clock.
        now: i64,
    },
    /// `now` is before issued-at minus skew.
    #[error("not valid before {issued_at} (now {now})")]
    NotYetValid {
        /// Issued-at in the claims.
        issued_at: i64,
        /// Verifier's clock.
        now: i64,
    },
    /// The subject is not the peer that presented it.
    #[error("credential is for another peer")]
    WrongPeer,
    /// The subject is on the revocation list.
    #[error("credential subject is revoked")]
    Revoked,
}

impl CredentialError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::UnknownKey(_) => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::WrongPeer => "wrong_peer",
            Self::Revoked => "revoked",
        }
    }

    /// Every value [`CredentialError::reason`] can return, to pre-create labels.
    pub const REASONS: &'static [&'static str] = &[
        "malformed",
        "unknown_key",
        "bad_signature",
        "expired",
        "not_yet_valid",
        "wrong_peer",
        "revoked",
    ];
}

/// Claims that passed verification, with the subject parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedClaims {
    /// The holder's PeerId.
    pub peer: PeerId,
    /// The raw claims.
    pub claims: Claims,
}

impl VerifiedClaims {
    /// The claims' role.
    pub fn role(&self) -> Role {
        Role::try_from(self.claims.role).unwrap_or(Role::Unspecified)
    }
    /// The claims' token kind.
    pub fn token_kind(&self) -> TokenKind {
        TokenKind::try_from(self.claims.token_kind).unwrap_or(TokenKind::Unspecified)
    }
    /// Labels as a sorted map.
    pub fn labels(&self) -> BTreeMap<String, String> {
        labels_to_map(&self.claims.labels)
    }
}

/// What a verifier trusts: the control plane's public keys and its revocations.
///
/// Built once per key-set or directory update and shared; verification does
/// no parsing of keys.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    keys: HashMap<String, TrustedKey>,
    revoked: HashMap<PeerId, i64>,
    /// Token ids revoked, each until its last credential's expiry: one
    /// entry however many members enrolled through the token.
    revoked_tokens: HashMap<String, i64>,
    /// The order of the key set held ((0, 0): none, or one from a control
    /// plane that predates it).
    key_order: KeyOrder,
}

#[derive(Debug, Clone)]
struct TrustedKey {
    key: ed25519::PublicKey,
    verify_until: i64,
}

impl Trust {
    /// Builds a trust store from a key set; keys that do not parse are skipped.
    pub fn new(keys: &KeySet) -> Self {
        let mut t = Self::default();
        t.set_keys(keys);
        t
    }

    /// `(epoch, generation)` of the key set held ((0, 0): none, or one
    /// from a control plane that predates them).
    pub fn key_order(&self) -> (u64, u64) {
        self.key_order.pair()
    }

    /// Whether `keys` would replace the set held: it does not go back
    /// ([`key_set_replaces`], the one rule every holder applies).
    pub fn takes_keys(&self, keys: &KeySet) -> bool {
        key_set_replaces(self.key_order, KeyOrder::from(keys))
    }

    /// Replaces the keys with `keys` if it does not go back (see
    /// [`Trust::takes_keys`]); returns whether it did. Routers and members
    /// install every key set the control plane serves through this.
    pub fn offer_keys(&mut self, keys: &KeySet) -> bool {
        let takes = self.takes_keys(keys);
        if takes {
            self.set_keys(keys);
        }
        takes
    }

    /// Replaces the keys, whatever their order (the control plane's own
    /// view, and a holder's first set).
    pub fn set_keys(&mut self, keys: &KeySet) {
        self.key_order = KeyOrder::from(keys);
        self.keys = keys
            .keys
            .iter()
            .filter_map(|k| {
                let key = ed25519::PublicKey::try_from_bytes(&k.ed25519).ok()?;
                Some((
                    k.key_id.clone(),
                    TrustedKey {
                        key,
                        verify_until: k.verify_until_unix_secs,
                    },
                ))
            })
            .collect();
    }

    /// Replaces the revocation list.
    /// An entry with a token id (and no peer) revokes every credential
    /// whose claims carry that token id.
    pub fn set_revocations(&mut self, revocations: &[Revocation]) {
        self.revoked = revocations
            .iter()
            .filter(|r| !r.peer_id.is_empty())
            .filter_map(|r| Some((PeerId::from_bytes(&r.peer_id).ok()?, r.until_unix_secs)))
            .collect();
        self.revoked_tokens = revocations
            .iter()
            .filter(|r| r.peer_id.is_empty() && !r.token_id.is_empty())
            .map(|r| (r.token_id.clone(), r.until_unix_secs))
            .collect();
    }

    /// Whether credentials from token `token_id` are revoked at `now` (an
    /// empty id, from a credential issued before token ids, never is).
    pub fn is_token_revoked(&self, token_id: &str, now: i64) -> bool {
        !token_id.is_empty()
            && self
                .revoked_tokens
                .get(token_id)
                .is_some_and(|until| *until >= now)
    }

    /// Whether these verified claims are revoked at `now`, by peer or by token.
    pub fn is_claims_revoked(&self, claims: &VerifiedClaims, now: i64) -> bool {
        self.is_revoked(&claims.peer, now) || self.is_token_revoked(&claims.claims.token_id, now)
    }

    /// Whether `key_id` is known.
    pub fn has_key(&self, key_id: &str) -> bool {
        self.keys.contains_key(key_id)
    }

    /// The public key with this id, whatever its verify-until.
    pub fn public_key(&self, key_id: &str) -> Option<&ed25519::PublicKey> {
        self.keys.get(key_id).map(|k| &k.key)
    }

    /// The instant after which nothing signed by `key_id` verifies (0: no
    /// end yet), `None` for an unknown key.
    pub fn verify_until(&self, key_id: &str) -> Option<i64> {
        self.keys.get(key_id).map(|k| k.verify_until)
    }

    /// Number of keys held.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Whether `peer` is revoked at `now`.
    pub fn is_revoked(&self, peer: &PeerId, now: i64) -> bool {
        self.revoked.get(peer).is_some_and(|until| *until >= now)
    }

    /// Peers revoked at `now`.
    pub fn revoked_peers(&self, now: i64) -> impl Iterator<Item = &PeerId> {
        self.revoked
            .iter()
            .filter(move |(_, until)| **until >= now)
            .map(|(p, _)| p)
    }
}

/// Verifies `credential` offline against `trust` at `now` (Unix seconds).
///
/// `expected_peer` is the PeerId the transport proved (noise handshake), or
/// `None` where the caller checks the subject itself. `skew_secs` widens the
/// validity window on both sides for clocks that disagree.
pub fn verify(
    credential: &Credential,
    trust: &Trust,
    now: i64,
    expected_peer: Option<&PeerId>,
    skew_secs: i64,
) -> Result<VerifiedClaims, CredentialError> {
    if credential.claims.len() > MAX_CREDENTIAL_BYTES {
        return Err(CredentialError::Malformed("claims too large"));
    }
    let claims = Claims::decode(credential.claims.as_slice())
        .map_err(|_| CredentialError::Malformed("claims do not decode"))?;
    let key = trust
        .keys
        .get(&claims.key_id)
        .ok_or_else(|| CredentialError::UnknownKey(claims.key_id.clone()))?;
    let mut signed = Vec::with_capacity(DOMAIN_PREFIX.len() + credential.claims.len());
    signed.extend_from_slice(DOMAIN_PREFIX);
    signed.extend_from_slice(&credential.claims);
    if !key.key.verify(&signed, &credential.signature) {
        return Err(CredentialError::BadSignature);
    }
    if key.verify_until != 0 && now > key.verify_until {
        // The key's grace has ended: nothing it signed verifies any more.
        return Err(CredentialError::Expired {
            expired_at: key.verify_until,
            now,
        });
    }
    let peer = PeerId::from_bytes(&claims.subject)
        .map_err(|_| CredentialError::Malformed("subject is not a PeerId"))?;
    if now > claims.expires_at_unix_secs.saturating_add(skew_secs) {
        return Err(CredentialError::Expired {
            expired_at: claims.expires_at_unix_secs,
            now,
        });
    }
    if now < claims.issued_at_unix_secs.saturating_sub(skew_secs) {
        return Err(CredentialError::NotYetValid {
            issued_at: claims.issued_at_unix_secs,
            now,
        });
    }
    if expected_peer.is_some_and(|expected| *expected != peer) {
        return Err(CredentialError::WrongPeer);
    }
    if trust.is_revoked(&peer, now) || trust.is_token_revoked(&claims.token_id, now) {
        return Err(CredentialError::Revoked);
    }
    Ok(VerifiedClaims { peer, claims })
}

/// Decodes a credential from bytes, refusing anything over the size cap.
pub fn decode_credential(bytes: &[u8]) -> Result<Credential, CredentialError> {
    if bytes.len() > MAX_CREDENTIAL_BYTES {
        return Err(CredentialError::Malformed("credential too large"));
    }
    Credential::decode(bytes).map_err(|_| CredentialError::Malformed("credential does not decode"))
}

/// Encodes `claims` and signs them with `key` (the control plane's side).
pub fn sign(claims: &Claims, key: &ed25519::Keypair) -> Credential {
    let bytes = claims.encode_to_vec();
    let mut signed = Vec::with_capacity(DOMAIN_PREFIX.len() + bytes.len());
    signed.extend_from_slice(DOMAIN_PREFIX);
    signed.extend_from_slice(&bytes);
    Credential {
        signature: key.sign(&signed),
        claims: bytes,
    }
}

/// Decodes the claims of a credential without verifying it (for display and
/// for a holder reading its own expiry). Never trust the result.
pub fn peek_claims(credential: &Credential) -> Result<Claims, CredentialError> {
    if credential.claims.len() > MAX_CREDENTIAL_BYTES {
        return Err(CredentialError::Malformed("claims too large"));
    }
    Claims::decode(credential.claims.as_slice())
        .map_err(|_| CredentialError::Malformed("claims do not decode"))
}

/// Labels as a sorted map (later duplicates win).
pub fn labels_to_map(labels: &[Label]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|l| (l.key.clone(), l.value.clone()))
        .collect()
}

/// A sorted label list from a map.
pub fn map_to_labels(map: &BTreeMap<String, String>) -> Vec<Label> {
    map.iter()
        .map(|(k, v)| Label {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

/// Parses `k=v` into a pair; the error names the bad input.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("label {s:?} is not key=value")),
    }
}

#[cfg(test)]
mod tests;
