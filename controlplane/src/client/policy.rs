//! The admin policy calls. `ApplyPolicy` is retried like an idempotent
//! call: the control plane stores nothing for a text equal to the version
//! in force, so a second attempt after a lost answer applies nothing more.

use agentmesh_proto::pb::controlplane::{
    ApplyPolicyRequest, ApplyPolicyResponse, GetPolicyRequest, GetPolicyResponse,
};

use super::{Client, ClientError, Idempotency, bearer};

impl Client {
    /// Admin: checks `text` and applies it as the next policy version (or,
    /// with `dry_run`, only checks it). A policy that fails a check is
    /// refused (`INVALID_ARGUMENT`, every problem with its line and column).
    pub async fn apply_policy(
        &self,
        admin_token: &str,
        req: ApplyPolicyRequest,
    ) -> Result<ApplyPolicyResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("ApplyPolicy", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(req.clone(), &bearer);
            async move { c.apply_policy(r).await }
        })
        .await
    }

    /// Admin: the policy in force (`version` 0) or a kept version.
    pub async fn get_policy(
        &self,
        admin_token: &str,
        version: u64,
    ) -> Result<GetPolicyResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("GetPolicy", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(GetPolicyRequest { version }, &bearer);
            async move { c.get_policy(r).await }
        })
        .await
    }
}
