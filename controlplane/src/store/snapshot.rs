//! Every row of a control-plane database, as [`super::Store::snapshot`]
//! reads it and [`super::Store::restore`] writes it: what `store copy`
//! moves from one backend to another. Signing keys travel opened and are
//! sealed again with the target's key-encryption key. Policy versions
//! travel as they are; the epoch does not (the target's history is a new
//! epoch).

use super::{LeaseRow, NodeRow, PolicyRow, RevocationRow, SigningKeyRow, TokenRow};

/// A token with what only the table holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    /// SHA-256 of the secret.
    pub digest: Vec<u8>,
    /// The row.
    pub row: TokenRow,
    /// Last enrollment with it, Unix seconds.
    pub last_used_at: Option<i64>,
}

/// One enrollment request record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentEntry {
    /// PeerId bytes, if the request got that far.
    pub peer_id: Option<Vec<u8>>,
    /// Token id, if the token was known.
    pub token_id: Option<String>,
    /// Source address.
    pub source: String,
    /// What happened.
    pub outcome: String,
    /// Unix seconds.
    pub at: i64,
}

/// A signing key with its creation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// The key (secret opened).
    pub row: SigningKeyRow,
    /// Unix seconds.
    pub created_at: i64,
}

/// A revocation with its creation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationEntry {
    /// The revocation.
    pub row: RevocationRow,
    /// Unix seconds.
    pub created_at: i64,
}

/// Every table's rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `tokens`.
    pub tokens: Vec<TokenEntry>,
    /// `nodes`.
    pub nodes: Vec<NodeRow>,
    /// `enrollment_requests`, oldest first.
    pub enrollment_requests: Vec<EnrollmentEntry>,
    /// `router_leases`.
    pub leases: Vec<LeaseRow>,
    /// `signing_keys`.
    pub keys: Vec<KeyEntry>,
    /// `rotation_state`.
    pub next_rotation_at: Option<i64>,
    /// `revocations`.
    pub revocations: Vec<RevocationEntry>,
    /// `policies`, oldest first.
    pub policies: Vec<PolicyRow>,
    /// `token_revocations` (`peer_id` empty).
    pub token_revocations: Vec<RevocationEntry>,
}

impl Snapshot {
    /// Rows per table, named as in [`super::TABLES`].
    pub fn counts(&self) -> Vec<(String, i64)> {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        vec![
            ("nodes".into(), n(self.nodes.len())),
            (
                "enrollment_requests".into(),
                n(self.enrollment_requests.len()),
            ),
            ("tokens".into(), n(self.tokens.len())),
            ("router_leases".into(), n(self.leases.len())),
            ("signing_keys".into(), n(self.keys.len())),
            (
                "rotation_state".into(),
                n(usize::from(self.next_rotation_at.is_some())),
            ),
            ("revocations".into(), n(self.revocations.len())),
            ("policies".into(), n(self.policies.len())),
            ("token_revocations".into(), n(self.token_revocations.len())),
        ]
    }
}
