//! The groups of one admitted peer: its verified claims, the policy its
//! groups were computed under, and the groups. Computed once at admission
//! (every publish and circuit check is then a few word operations) and
//! recomputed for every admitted peer when a policy is applied.
//!
//! The policy the groups were computed under is kept (an `Arc`, compared
//! by pointer) so a peer admitted while a new policy was being applied,
//! whose groups were computed under the old one, is never judged by stale
//! groups: [`PeerGroups::under`] recomputes when the policies differ.

use std::borrow::Cow;
use std::sync::Arc;

use agentmesh_policy::{Groups, Policy};
use agentmesh_proto::credential::VerifiedClaims;
use agentmesh_proto::enforce::groups_of;

/// One peer's claims and groups (see the module doc).
#[derive(Debug, Clone)]
pub struct PeerGroups {
    claims: Arc<VerifiedClaims>,
    policy: Arc<Policy>,
    groups: Groups,
}

impl PartialEq for PeerGroups {
    fn eq(&self, other: &Self) -> bool {
        self.claims == other.claims
            && Arc::ptr_eq(&self.policy, &other.policy)
            && self.groups == other.groups
    }
}

impl Eq for PeerGroups {}

impl PeerGroups {
    /// The groups of `claims` under `policy`.
    pub fn new(claims: VerifiedClaims, policy: &Arc<Policy>) -> Self {
        let groups = groups_of(policy, &claims);
        Self {
            claims: Arc::new(claims),
            policy: policy.clone(),
            groups,
        }
    }

    /// The groups under `policy`: the ones held if they were computed under
    /// it, else computed now.
    pub fn under(&self, policy: &Arc<Policy>) -> Cow<'_, Groups> {
        if Arc::ptr_eq(&self.policy, policy) {
            Cow::Borrowed(&self.groups)
        } else {
            Cow::Owned(groups_of(policy, &self.claims))
        }
    }

    /// Recomputes the groups under `policy` (a no-op if already under it).
    pub fn regroup(&mut self, policy: &Arc<Policy>) {
        if !Arc::ptr_eq(&self.policy, policy) {
            self.groups = groups_of(policy, &self.claims);
            self.policy = policy.clone();
        }
    }

    /// The verified claims the groups come from.
    pub fn claims(&self) -> &VerifiedClaims {
        &self.claims
    }
}
