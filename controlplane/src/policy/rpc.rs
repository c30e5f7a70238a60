//! `ApplyPolicy` and `GetPolicy`: admin calls (the service checks the
//! bearer token first, as for `CreateToken`). A refused policy is
//! `INVALID_ARGUMENT` listing every problem with its line and column; it
//! is not a failed login, so it never counts against the admin's source.
//! An apply with a request id is recorded with its answer in the
//! transaction that applies it ([`crate::request_ids`]): a retry with the
//! id answers what the first attempt did, even when another admin applied
//! another text meanwhile (without it, the retry would apply the first
//! text again on top). A dry run does nothing and records nothing.

use std::net::IpAddr;

use agentmesh_policy::{Policy, Summary};
use agentmesh_proto::pb::controlplane::{
    ApplyPolicyRequest, ApplyPolicyResponse, GetPolicyRequest, GetPolicyResponse, PolicySummary,
};

use super::{
    Origin,
    apply::{ApplyError, new_policy},
};
use crate::{
    request_ids, signed_policy::PolicyInForce, state::State, status::ServiceError,
    store::AppliedPolicy,
};

/// Longest `author` an apply may record, bytes.
pub const MAX_AUTHOR_BYTES: usize = 128;

/// A summary on the wire.
pub fn summary_pb(s: Summary) -> PolicySummary {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    PolicySummary {
        groups: n(s.groups),
        owners: n(s.owners),
        grants: n(s.grants),
        tests: n(s.tests),
    }
}

/// What an admin apply records as its author.
fn applied_by(author: &str) -> String {
    let author = author.trim();
    if author.is_empty() {
        "admin token".to_string()
    } else {
        format!("{author} (admin token)")
    }
}

impl State {
    /// `ApplyPolicy` (after the admin check): checks the text, applies it
    /// unless `dry_run` or unchanged.
    pub async fn apply_policy_rpc(
        &self,
        source: Option<IpAddr>,
        req: ApplyPolicyRequest,
        request_id: Option<String>,
    ) -> Result<ApplyPolicyResponse, ServiceError> {
        if req.author.len() > MAX_AUTHOR_BYTES || req.author.chars().any(|c| c.is_control()) {
            return Err(ServiceError::Invalid(format!(
                "author: at most {MAX_AUTHOR_BYTES} bytes, no control characters"
            )));
        }
        if req.dry_run {
            let policy = Policy::parse(&req.text).map_err(|e| {
                self.metrics.policy_applied("refused");
                ServiceError::Invalid(e.to_string())
            })?;
            let held = self.policy_in_force();
            return Ok(ApplyPolicyResponse {
                version: held.version,
                epoch: held.epoch,
                applied: false,
                summary: Some(summary_pb(policy.summary())),
            });
        }
        let origin = Origin {
            by: applied_by(&req.author),
            from: source.map_or_else(|| "unknown".to_string(), |ip| ip.to_string()),
        };
        if let Some(id) = request_id {
            return self.apply_policy_once(&req, origin, &id).await;
        }
        let (done, summary) = self.apply_policy(&req.text, origin).await?;
        let held = self.policy_in_force();
        Ok(ApplyPolicyResponse {
            version: done.version(),
            epoch: held.epoch,
            applied: matches!(done, AppliedPolicy::Applied(_)),
            summary: Some(summary_pb(summary)),
        })
    }

    /// An apply under `request_id`: the answer is recorded in the
    /// transaction that applies (or finds the text in force), and a retry
    /// gets it back.
    async fn apply_policy_once(
        &self,
        req: &ApplyPolicyRequest,
        origin: Origin,
        request_id: &str,
    ) -> Result<ApplyPolicyResponse, ServiceError> {
        const METHOD: &str = "ApplyPolicy";
        let d = request_ids::digest(METHOD, req);
        let policy = self.checked_policy(&req.text, &origin)?;
        let summary = summary_pb(policy.summary());
        let epoch = self.policy_in_force().epoch;
        let new = new_policy(&req.text, origin, false);
        let answer = move |done: &AppliedPolicy| ApplyPolicyResponse {
            version: done.version(),
            epoch,
            applied: matches!(done, AppliedPolicy::Applied(_)),
            summary: Some(summary),
        };
        let rec = request_ids::once(request_id, METHOD, d, new.applied_at, move |done| {
            Some(answer(done))
        });
        let stored = self.db.store().apply_policy_once(&new, &rec);
        match self.db.run(stored).await? {
            Ok(done) => {
                self.took_effect(done, new, policy)
                    .await
                    .map_err(ApplyError::from)?;
                Ok(answer(&done))
            }
            Err(prior) => request_ids::replay(request_id, METHOD, d, prior),
        }
    }

    /// `GetPolicy` (after the admin check): the version in force (0) or a
    /// kept one.
    pub async fn get_policy_rpc(
        &self,
        req: GetPolicyRequest,
    ) -> Result<GetPolicyResponse, ServiceError> {
        self.refresh_policy().await?;
        let held = self.policy_in_force();
        if req.version == 0 || req.version == held.version {
            return Ok(response(&held, None, held.version));
        }
        let row = self
            .db
            .run(self.db.store().policy(req.version))
            .await?
            .ok_or_else(|| {
                ServiceError::NotFound(format!(
                    "policy version {} is not kept (the version in force is {}; replaced \
                     versions are kept --policy-retention-secs)",
                    req.version, held.version
                ))
            })?;
        // An old version checked again for its summary; one this binary no
        // longer reads still shows its text.
        Ok(match PolicyInForce::from_row(held.epoch, &row) {
            Ok(p) => response(&p, row.replaced_at, held.version),
            Err(_) => GetPolicyResponse {
                version: row.version,
                epoch: held.epoch,
                text: row.text,
                applied_at_unix_secs: row.applied_at,
                applied_by: row.applied_by,
                applied_from: row.applied_from,
                replaced_at_unix_secs: row.replaced_at.unwrap_or(0),
                summary: None,
                current_version: held.version,
            },
        })
    }
}

fn response(p: &PolicyInForce, replaced_at: Option<i64>, current: u64) -> GetPolicyResponse {
    GetPolicyResponse {
        version: p.version,
        epoch: p.epoch,
        text: p.text.clone(),
        applied_at_unix_secs: p.applied_at,
        applied_by: p.applied_by.clone(),
        applied_from: p.applied_from.clone(),
        replaced_at_unix_secs: replaced_at.unwrap_or(0),
        summary: Some(summary_pb(p.summary())),
        current_version: current,
    }
}
