//! The router's check on every published record, and on every stored one
//! when the policy or revocations change: the record's provider must own
//! every service it names under the policy held (none held: nobody owns
//! anything). A refused record is answered with the reason, counted, and
//! never stored, so never served.
//!
//! - A record that carries a credential is checked with
//!   `check_ownership` (shared with callers): the credential must be the
//!   publisher's, valid, unrevoked, and outlive the record.
//! - A record without one comes from a provider that predates credentials
//!   in records (a rolling upgrade). The router still knows who published
//!   it: the publisher is admitted to attach, with the claims it proved at
//!   admission. So the same ownership rule is checked against those claims
//!   (revocation included), and such records are counted apart
//!   (`agentmesh_router_catalog_records_without_credential_total`): the
//!   router enforces ownership for old and new providers alike, and a new
//!   caller, which wants the proof in the record, decides for itself.

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::enforce::{OwnershipError, check_ownership};
use agentmesh_proto::pb::mesh::ServiceRecord;
use libp2p::PeerId;

use super::state::PolicyState;
use crate::admission::{AdmissionTable, Admissions};
use crate::cp::Link;

/// What the ownership check needs; clone-cheap.
#[derive(Clone)]
pub(crate) struct Ownership {
    pub(crate) state: Arc<PolicyState>,
    pub(crate) link: Arc<Link>,
    pub(crate) admissions: Admissions,
    /// The clock skew tolerated on credentials, seconds.
    pub(crate) skew_secs: i64,
}

/// Whether `provider` owns every service of `record` (see the module
/// doc). Pure.
pub(crate) fn owns(
    record: &ServiceRecord,
    provider: &PeerId,
    trust: &Trust,
    policy: &Arc<Policy>,
    admissions: &AdmissionTable,
    now: i64,
    skew_secs: i64,
) -> Result<(), OwnershipError> {
    if record.credential.is_some() {
        return check_ownership(record, provider, trust, policy, now, skew_secs).map(|_| ());
    }
    let Some(groups) = admissions.get(provider).and_then(|a| a.groups.as_ref()) else {
        return Err(OwnershipError::NoCredential);
    };
    if trust.is_claims_revoked(groups.claims(), now) {
        return Err(OwnershipError::Credential(
            agentmesh_proto::credential::CredentialError::Revoked,
        ));
    }
    let g = groups.under(policy);
    match record.services.iter().find(|s| !policy.may_provide(&g, s)) {
        Some(s) => Err(OwnershipError::NotOwner(s.clone())),
        None => Ok(()),
    }
}

impl crate::catalog::server::PublishCheck for Ownership {
    fn check(&self, record: &ServiceRecord, provider: &PeerId, now: i64) -> Result<(), String> {
        Ownership::check(self, record, provider, now)
    }
}

impl Ownership {
    /// Checks `record` (already verified as signed by `provider`) at
    /// `now`; a refusal is counted in
    /// `agentmesh_router_catalog_refused_total{reason}` and returned as
    /// the reason the publisher is told.
    pub(crate) fn check(
        &self,
        record: &ServiceRecord,
        provider: &PeerId,
        now: i64,
    ) -> Result<(), String> {
        let policy = self.state.policy();
        let result = {
            let trust = self.link.trust.read();
            let admissions = self.admissions.read();
            owns(
                record,
                provider,
                &trust,
                &policy,
                &admissions,
                now,
                self.skew_secs,
            )
        };
        match result {
            Ok(()) => {
                if record.credential.is_none() {
                    self.state.metrics().records_without_credential.inc();
                }
                Ok(())
            }
            Err(e) => {
                self.state
                    .metrics()
                    .catalog_refused
                    .get_or_create(&[("reason", e.reason())])
                    .inc();
                if let Some(suppressed) = self
                    .state
                    .metrics()
                    .log
                    .pass(&provider.to_string(), "record_refused")
                {
                    tracing::info!(%provider, reason = e.reason(), error = %e, suppressed, "published record refused (logged at most once a minute per member)");
                }
                Err(format!("{}: {e}", e.reason()))
            }
        }
    }
}
