//! RouterLease, GetDirectory and GetKeys: the router directory and the keys.
//! (GetDirectory and GetKeys take the caller's unauthenticated share in the
//! service; the HTTP `/info` page reads them without one.)

use std::net::IpAddr;

use agentmesh_proto::{
    credential::{VerifiedClaims, labels_to_map, verify},
    identity::PeerId,
    pb::{
        controlplane::{
            GetDirectoryRequest, GetDirectoryResponse, RouterInfo, RouterLeaseRequest,
            RouterLeaseResponse, RouterLoad,
        },
        credential::{KeySet, Role},
    },
    proof::{Binding, Bound, Purpose, verify_proof},
    unix_now,
};

use crate::{
    enroll::{credential_error, node_refusal, refused_proof},
    state::State,
    status::ServiceError,
    store::LeaseRow,
};

/// Most addresses a router may publish.
pub const MAX_LEASE_ADDRS: usize = 32;
/// Longest address accepted, bytes.
pub const MAX_ADDR_LEN: usize = 512;

impl State {
    /// `RouterLease`, in [`crate::request_limits`]'s order: nothing to verify
    /// from a source over its failures is refused at once; the source's
    /// unauthenticated share; verify (role router; a failure is judged
    /// against the source, a verified router is served whatever its
    /// address's failures); labels a subset of the credential's; only then
    /// the lease budget, which no member can reach.
    pub async fn router_lease(
        &self,
        source: Option<IpAddr>,
        req: RouterLeaseRequest,
    ) -> Result<RouterLeaseResponse, ServiceError> {
        if req.credential.is_none() || req.proof.is_none() {
            self.limits
                .refuse_unverifiable(source, "credential and proof of possession")?;
        }
        self.limits.check_unauth(source)?;
        let now = unix_now();
        let (claims, peer) = self
            .limits
            .judge(source, self.verify_lease(&req, &req.binding(), now))?;
        let allowed = claims.labels();
        let asked = labels_to_map(&req.labels);
        if let Some((k, v)) = asked.iter().find(|(k, v)| allowed.get(*k) != Some(*v)) {
            return Err(ServiceError::denied(
                "labels_not_allowed",
                format!("label {k}={v} is not in the router's credential"),
            ));
        }
        self.limits.check_lease(source)?;
        let load = req.load.unwrap_or_default();
        let ttl = self.config.lease_ttl_secs as i64;
        let lease = LeaseRow {
            peer_id: peer.to_bytes(),
            node_id: claims.claims.node_id.clone(),
            addrs: req.addrs,
            labels: asked,
            attached: load.attached_members,
            transit: load.transit_connections,
            high: load.high_watermark,
            low: load.low_watermark,
            draining: req.draining,
            expires_at: now + ttl,
        };
        self.db
            .run(self.db.store().router_lease(&lease, now))
            .await?
            .map_err(node_refusal)?;
        self.invalidate_directory();
        Ok(RouterLeaseResponse {
            lease_expires_at_unix_secs: now + ttl,
            lease_ttl_secs: u32::try_from(ttl).unwrap_or(u32::MAX),
        })
    }

    /// What a lease proves, checked without the database: bounds, the
    /// proof (bound to `bound`: the lease's fields, or a watch's), a router
    /// credential signed for the proof's key.
    pub(crate) fn verify_lease(
        &self,
        req: &RouterLeaseRequest,
        bound: &Binding,
        now: i64,
    ) -> Result<(VerifiedClaims, PeerId), ServiceError> {
        let cred = req
            .credential
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("credential missing".into()))?;
        let proof = req
            .proof
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("proof of possession missing".into()))?;
        if req.addrs.len() > MAX_LEASE_ADDRS
            || req
                .addrs
                .iter()
                .any(|a| a.is_empty() || a.len() > MAX_ADDR_LEN)
        {
            return Err(ServiceError::Invalid(format!(
                "at most {MAX_LEASE_ADDRS} non-empty addresses of at most {MAX_ADDR_LEN} bytes"
            )));
        }
        let (_, peer) = verify_proof(bound, &self.public_url, proof, now).map_err(refused_proof)?;
        let claims = verify(
            cred,
            &self.keys.trust(now),
            now,
            Some(&peer),
            self.config.clock_skew_secs as i64,
        )
        .map_err(credential_error)?;
        if claims.role() != Role::Router {
            return Err(ServiceError::denied(
                "wrong_role",
                format!(
                    "{} needs a credential with role router",
                    rpc_of(bound.purpose())
                ),
            ));
        }
        Ok((claims, peer))
    }

    /// `GetDirectory` for a caller that says which policy copy it holds
    /// (`req`): the same answer, less the policy text when the caller
    /// holds the version in force (same epoch and version), so a member's
    /// poll costs no policy until a change.
    pub async fn get_directory_for(
        &self,
        req: &GetDirectoryRequest,
    ) -> Result<GetDirectoryResponse, ServiceError> {
        let mut d = self.get_directory().await?;
        if holds_policy_of(req, &d) {
            d.policy = None;
            d.policy_unchanged = true;
        }
        Ok(d)
    }

    /// `GetDirectory`: live leases, the signed revocation list and the
    /// signed policy in force (cached briefly).
    pub async fn get_directory(&self) -> Result<GetDirectoryResponse, ServiceError> {
        if let Some(d) = self.cached_directory() {
            return Ok(d);
        }
        // Another process on the database may have applied a version.
        self.refresh_policy().await?;
        let now = unix_now();
        let policy = self.signed_policy(now)?;
        let leases = self.db.run(self.db.store().directory(now)).await?;
        let revocations = self.signed_revocations(now).await?;
        let d = GetDirectoryResponse {
            routers: leases
                .into_iter()
                .map(|l| RouterInfo {
                    peer_id: l.peer_id,
                    addrs: l.addrs,
                    labels: agentmesh_proto::credential::map_to_labels(&l.labels),
                    load: Some(RouterLoad {
                        attached_members: l.attached,
                        transit_connections: l.transit,
                        high_watermark: l.high,
                        low_watermark: l.low,
                    }),
                    draining: l.draining,
                    lease_expires_at_unix_secs: l.expires_at,
                })
                .collect(),
            revocations: Some(revocations),
            generated_at_unix_secs: now,
            policy: Some(policy),
            policy_unchanged: false,
        };
        self.cache_directory(&d);
        Ok(d)
    }

    /// `GetKeys`.
    pub fn get_keys(&self) -> KeySet {
        self.keys.key_set(unix_now())
    }
}

/// The RPC a router's proof was made for, as refusals name it.
fn rpc_of(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Watch => "Watch",
        Purpose::Lease => "RouterLease",
        Purpose::Enroll => "Enroll",
        Purpose::Refresh => "Refresh",
    }
}

/// Whether the caller of `req` holds the policy version `d` carries. A
/// request naming no version (`0`, a caller that predates the fields or
/// holds none) never matches, so it gets the policy.
fn holds_policy_of(req: &GetDirectoryRequest, d: &GetDirectoryResponse) -> bool {
    if req.policy_epoch == 0 && req.policy_version == 0 {
        return false;
    }
    let Some(signed) = d.policy.as_ref() else {
        return false;
    };
    agentmesh_proto::policy::peek_version(signed) == Some((req.policy_epoch, req.policy_version))
}

#[cfg(test)]
mod policy_unchanged_tests {
    use super::*;
    use agentmesh_proto::identity::ed25519;
    use agentmesh_proto::pb::credential::PolicyDocument;
    use agentmesh_proto::policy::sign_policy;

    fn dir(epoch: u64, version: u64, key_id: &str) -> GetDirectoryResponse {
        let doc = PolicyDocument {
            epoch,
            version,
            issued_at_unix_secs: 1,
            text: "format = 1".into(),
            key_id: key_id.into(),
        };
        GetDirectoryResponse {
            policy: Some(sign_policy(&doc, &ed25519::Keypair::generate())),
            ..Default::default()
        }
    }

    fn req(epoch: u64, version: u64) -> GetDirectoryRequest {
        GetDirectoryRequest {
            policy_epoch: epoch,
            policy_version: version,
        }
    }

    #[test]
    fn the_policy_is_left_out_only_for_the_version_in_force() {
        let d = dir(7, 3, "k2");
        assert!(holds_policy_of(&req(7, 3), &d));
        assert!(!holds_policy_of(&req(7, 2), &d), "an older version");
        assert!(!holds_policy_of(&req(8, 3), &d), "another epoch");
        assert!(
            !holds_policy_of(&GetDirectoryRequest::default(), &d),
            "an old caller"
        );
        assert!(!holds_policy_of(
            &req(7, 3),
            &GetDirectoryResponse::default()
        ));
    }
}
