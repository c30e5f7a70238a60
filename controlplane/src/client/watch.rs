//! `Watch` (a router's push of policy, revocations and keys) and the admin
//! `RevokeToken`. Opening a watch is retried like an idempotent call; the
//! stream itself carries no deadline (the control plane ends it when the
//! router's credential expires, and the HTTP/2 keepalive ends it when
//! either side vanishes), so the caller reads it until it ends and then
//! watches again with its current credential.

use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::{RevokeTokenRequest, RevokeTokenResponse, WatchEvent, WatchRequest},
        credential::Credential,
    },
    proof::Bound,
    unix_now,
};
use tonic::{Request, Streaming};

use super::{Client, ClientError, Idempotency, bearer};

impl Client {
    /// Opens a watch with a router credential and a fresh proof of
    /// possession of `key` (purpose `Watch`, bound to the credential). The first event is the
    /// full state in force; each next one the full state after a change.
    pub async fn watch(
        &self,
        cred: &Credential,
        key: &Keypair,
    ) -> Result<Streaming<WatchEvent>, ClientError> {
        self.retrying("Watch", Idempotency::Idempotent, || {
            let mut c = self.grpc();
            // No per-call timeout: it would end the stream.
            let req = Request::new(
                WatchRequest {
                    credential: Some(cred.clone()),
                    proof: None,
                }
                .proven(self.public_url(), key, unix_now()),
            );
            async move { c.watch(req).await }
        })
        .await
    }

    /// Admin: revokes the token `token_id` (it enrolls no one again and
    /// every credential it led to is refused); returns until when the
    /// revocation is published.
    pub async fn revoke_token(
        &self,
        admin_token: &str,
        token_id: &str,
        reason: &str,
    ) -> Result<RevokeTokenResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("RevokeToken", Idempotency::Idempotent, || {
            let mut c = self.grpc();
            let r = self.admin_request(
                RevokeTokenRequest {
                    token_id: token_id.to_string(),
                    reason: reason.to_string(),
                },
                &bearer,
            );
            async move { c.revoke_token(r).await }
        })
        .await
    }
}
