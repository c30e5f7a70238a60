//! `/agentmesh/auth/1`: a peer shows its credential and purpose; the router
//! verifies it offline and admits or refuses with a reason.
//!
//! - [`decide`]: pure policy (credential check, role per purpose).
//! - the frames and the client live in `agentmesh_wire::auth`.
//! - `server`: one inbound auth stream (the accept loop with its fair
//!   share of slots is `crate::streams`).
//! - `first_byte`: the short deadline of an auth stream's first byte.
//! - `outbound`: this router authenticating to another router.

mod first_byte;
pub(crate) mod outbound;
pub(crate) mod server;

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{CredentialError, Trust, verify};
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{AuthRefusal, AuthRequest, PolicyPushSlot};
use agentmesh_proto::protocols::peer_id_from_bytes;
use libp2p::PeerId;

use crate::admission::{Admission, PeerGroups, Purpose, PushRole, PushSlot};

/// Most routers a member may list as attached (longer lists are cut).
const MAX_ATTACHED_ROUTERS: usize = 16;

/// Why a peer was refused: the wire reason, a metric label and a detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: AuthRefusal,
    pub(crate) label: &'static str,
    pub(crate) detail: String,
}

impl Refusal {
    fn new(reason: AuthRefusal, label: &'static str, detail: impl Into<String>) -> Self {
        Self {
            reason,
            label,
            detail: detail.into(),
        }
    }

    /// Whether fetching keys could change the answer.
    pub(crate) fn is_unknown_key(&self) -> bool {
        self.reason == AuthRefusal::UnknownKey
    }
}

impl From<CredentialError> for Refusal {
    fn from(e: CredentialError) -> Self {
        let reason = match e {
            CredentialError::Malformed(_) => AuthRefusal::Malformed,
            CredentialError::UnknownKey(_) => AuthRefusal::UnknownKey,
            CredentialError::BadSignature => AuthRefusal::BadSignature,
            CredentialError::Expired { .. } => AuthRefusal::Expired,
            CredentialError::NotYetValid { .. } => AuthRefusal::NotYetValid,
            CredentialError::WrongPeer => AuthRefusal::WrongPeer,
            CredentialError::Revoked => AuthRefusal::Revoked,
        };
        Self::new(reason, e.reason(), e.to_string())
    }
}

/// The purpose of a request, or a refusal if it names none.
pub(crate) fn purpose_of(req: &AuthRequest) -> Result<Purpose, Refusal> {
    use agentmesh_proto::pb::mesh::Purpose as P;
    match P::try_from(req.purpose) {
        Ok(P::Attach) => Ok(Purpose::Attach),
        Ok(P::Transit) => Ok(Purpose::Transit),
        Ok(P::Router) => Ok(Purpose::Router),
        _ => Err(Refusal::new(
            AuthRefusal::Malformed,
            "malformed",
            "purpose must be attach, transit or router",
        )),
    }
}

/// Decides an auth request from `peer` (the PeerId the noise handshake
/// proved) at `now`: the credential must verify offline and its role must
/// allow the purpose (attach: member; transit: member or router; router:
/// router). The admission carries the claims' groups under `policy`.
pub(crate) fn decide(
    req: &AuthRequest,
    trust: &Trust,
    now: i64,
    peer: &PeerId,
    skew_secs: i64,
    policy: &Arc<Policy>,
) -> Result<Admission, Refusal> {
    let purpose = purpose_of(req)?;
    if trust.key_count() == 0 {
        return Err(Refusal::new(
            AuthRefusal::UnknownKey,
            "no_keys",
            "router has no control-plane keys yet",
        ));
    }
    let credential = req
        .credential
        .as_ref()
        .ok_or_else(|| Refusal::new(AuthRefusal::Malformed, "malformed", "no credential"))?;
    let claims = verify(credential, trust, now, Some(peer), skew_secs)?;
    let role = claims.role();
    let allowed = match purpose {
        Purpose::Attach => role == Role::Member,
        Purpose::Transit => role == Role::Member || role == Role::Router,
        Purpose::Router => role == Role::Router,
    };
    if !allowed {
        return Err(Refusal::new(
            AuthRefusal::WrongRole,
            "wrong_role",
            format!(
                "role {} may not authenticate with purpose {}",
                role.as_str_name(),
                purpose.as_str()
            ),
        ));
    }
    let until = claims.claims.expires_at_unix_secs;
    let node_id = claims.claims.node_id.clone();
    Ok(Admission {
        purpose,
        until,
        node_id,
        attached_routers: req
            .attached_routers
            .iter()
            .take(MAX_ATTACHED_ROUTERS)
            .filter_map(|b| peer_id_from_bytes(b))
            .collect(),
        groups: Some(PeerGroups::new(claims, policy)),
        push: PushRole {
            slot: match PolicyPushSlot::try_from(req.policy_push_slot) {
                Ok(PolicyPushSlot::Primary) => PushSlot::Primary,
                Ok(PolicyPushSlot::Fallback) => PushSlot::Fallback,
                // Unspecified, or a value from a newer member: as before.
                _ => PushSlot::Unspecified,
            },
            holds_generation: None,
        },
    })
}

#[cfg(test)]
mod tests;
