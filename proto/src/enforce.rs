//! What routers and members share when they enforce a policy: the policy
//! they hold (signed by the control plane, verified, parsed), the groups a
//! verified credential is in, and the proof that a service record's
//! provider owns every service it names.
//!
//! The router (on publish) and the caller (before it sends a byte) run the
//! same [`check_ownership`], so what one refuses the other refuses too.

use std::sync::Arc;

use agentmesh_policy::{Groups, Identity, Policy, Role as PolicyRole};
use libp2p_identity::PeerId;

use crate::credential::{CredentialError, Trust, VerifiedClaims, verify};
use crate::order::holder_lacks;
use crate::pb::credential::{PolicyDocument, Role, SignedPolicy};
use crate::pb::mesh::ServiceRecord;
use crate::policy::{PolicyVerifyError, supersedes, verify_policy};

/// A policy a router or member holds: the signed copy (to pass on as it
/// came), its document's epoch and version, and the compiled policy.
#[derive(Debug, Clone)]
pub struct HeldPolicy {
    pub signed: SignedPolicy,
    pub epoch: u64,
    pub version: u64,
    pub issued_at_unix_secs: i64,
    pub policy: Arc<Policy>,
}

/// Why a signed policy offered to a holder was not taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyRejection {
    #[error(transparent)]
    Verify(#[from] PolicyVerifyError),
    /// Signed by the control plane but not a policy this build can parse
    /// (a newer format): the held one stays.
    #[error("policy does not parse here: {0}")]
    Unparsable(String),
    /// Not newer than the one held (an older version or a replayed epoch).
    #[error("policy epoch {epoch} version {version} does not supersede the one held")]
    Stale { epoch: u64, version: u64 },
}

impl PolicyRejection {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PolicyRejection::Verify(e) => e.reason(),
            PolicyRejection::Unparsable(_) => "unparsable",
            PolicyRejection::Stale { .. } => "stale",
        }
    }

    /// Every value of [`reason`](Self::reason), to pre-create metric labels.
    pub const REASONS: [&'static str; 6] = [
        "too_large",
        "malformed",
        "unknown_key",
        "bad_signature",
        "unparsable",
        "stale",
    ];
}

impl HeldPolicy {
    /// Verifies `signed` against `trust` and parses it; `Ok` only if it
    /// supersedes `held` (see [`supersedes`]). Nothing changes on `Err`.
    pub fn accept(
        signed: &SignedPolicy,
        trust: &Trust,
        held: Option<&HeldPolicy>,
    ) -> Result<HeldPolicy, PolicyRejection> {
        let doc = verify_policy(signed, trust)?;
        if !supersedes(&doc, held.map(HeldPolicy::document).as_ref()) {
            return Err(PolicyRejection::Stale {
                epoch: doc.epoch,
                version: doc.version,
            });
        }
        let policy =
            Policy::parse(&doc.text).map_err(|e| PolicyRejection::Unparsable(e.to_string()))?;
        Ok(HeldPolicy {
            signed: signed.clone(),
            epoch: doc.epoch,
            version: doc.version,
            issued_at_unix_secs: doc.issued_at_unix_secs,
            policy: Arc::new(policy),
        })
    }

    /// Whether a holder reporting `(epoch, version)` lacks this policy:
    /// `(0, 0)` (none, or a member that predates policies) always does.
    pub fn is_newer_than(&self, epoch: u64, version: u64) -> bool {
        holder_lacks((self.epoch, self.version), (epoch, version))
    }

    /// The document's ordering fields (no text), for [`supersedes`].
    fn document(&self) -> PolicyDocument {
        PolicyDocument {
            epoch: self.epoch,
            version: self.version,
            issued_at_unix_secs: self.issued_at_unix_secs,
            ..PolicyDocument::default()
        }
    }
}

/// The groups `claims` are in under `policy`. A credential with no known
/// role is in no group, so it may do nothing.
pub fn groups_of(policy: &Policy, claims: &VerifiedClaims) -> Groups {
    let role = match claims.role() {
        Role::Member => PolicyRole::Member,
        Role::Router => PolicyRole::Router,
        Role::Unspecified => return Groups::default(),
    };
    let labels = claims.labels();
    policy.groups_of(&Identity {
        role,
        labels: &labels,
    })
}

/// Why a record does not prove that its provider owns its services.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OwnershipError {
    /// The record carries no credential (a provider that predates them).
    #[error("record carries no credential")]
    NoCredential,
    #[error("record credential: {0}")]
    Credential(#[from] CredentialError),
    /// The credential is someone else's.
    #[error("record credential names another peer")]
    WrongSubject,
    /// The record is valid for longer than the credential in it.
    #[error("record outlives its credential")]
    OutlivesCredential,
    /// The provider's groups do not own this service.
    #[error("provider does not own service {0:?}")]
    NotOwner(String),
}

impl OwnershipError {
    /// A short stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            OwnershipError::NoCredential => "no_credential",
            OwnershipError::Credential(CredentialError::Revoked) => "revoked",
            OwnershipError::Credential(_) => "bad_credential",
            OwnershipError::WrongSubject => "wrong_subject",
            OwnershipError::OutlivesCredential => "outlives_credential",
            OwnershipError::NotOwner(_) => "not_owner",
        }
    }

    /// Every value of [`reason`](Self::reason), to pre-create metric labels.
    pub const REASONS: [&'static str; 6] = [
        "no_credential",
        "revoked",
        "bad_credential",
        "wrong_subject",
        "outlives_credential",
        "not_owner",
    ];
}

/// Checks offline that `record` (already verified as signed by `provider`,
/// see [`crate::record::verify_record`]) carries `provider`'s valid,
/// unrevoked credential, expires no later than it, and that the
/// credential's groups own every service the record names. Returns the
/// provider's verified claims.
pub fn check_ownership(
    record: &ServiceRecord,
    provider: &PeerId,
    trust: &Trust,
    policy: &Policy,
    now: i64,
    skew_secs: i64,
) -> Result<VerifiedClaims, OwnershipError> {
    let credential = record
        .credential
        .as_ref()
        .ok_or(OwnershipError::NoCredential)?;
    let claims = match verify(credential, trust, now, Some(provider), skew_secs) {
        Err(CredentialError::WrongPeer) => return Err(OwnershipError::WrongSubject),
        other => other?,
    };
    if record.expires_at_unix_secs > claims.claims.expires_at_unix_secs {
        return Err(OwnershipError::OutlivesCredential);
    }
    let groups = groups_of(policy, &claims);
    if let Some(s) = record
        .services
        .iter()
        .find(|s| !policy.may_provide(&groups, s))
    {
        return Err(OwnershipError::NotOwner(s.clone()));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests;
