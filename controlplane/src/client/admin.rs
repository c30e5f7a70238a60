//! Admin calls with request ids, and the admin listings.
//!
//! `CreateToken`, `RotateKeyNow`, `ApplyPolicy`, `RevokeNode` and
//! `RevokeToken` sent with a request id (the metadata `request-id`, the
//! same on every attempt) are retried like idempotent calls: after a lost
//! answer (a deadline, a reset, UNAVAILABLE without `retry-after`) the
//! control plane answers a retry with the first attempt's answer and does
//! nothing twice, so the retry is safe. Without an id `CreateToken` and
//! `RotateKeyNow` keep the cautious policy of
//! [`super::Idempotency::NotIdempotent`]. The listings are reads and
//! retried as such.

use agentmesh_proto::{
    identity::PeerId,
    pb::controlplane::{
        ApplyPolicyRequest, ApplyPolicyResponse, CreateTokenRequest, CreateTokenResponse,
        ListNodesRequest, ListNodesResponse, ListTokensRequest, ListTokensResponse,
        RevokeNodeRequest, RevokeNodeResponse, RevokeTokenRequest, RevokeTokenResponse,
        RotateKeyNowRequest, RotateKeyNowResponse,
    },
};
use rand::Rng;
use tonic::metadata::{Ascii, MetadataValue};

use super::{Client, ClientError, Idempotency, bearer};

/// The gRPC metadata key carrying a request id (the control plane's
/// `request_ids::REQUEST_ID_METADATA`).
pub const REQUEST_ID_METADATA: &str = "request-id";

/// A new request id: `PREFIX-` and 128 random bits in hex, unique for
/// every practical purpose.
pub fn new_request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::thread_rng().r#gen::<u128>())
}

fn request_id_value(id: &str) -> Result<MetadataValue<Ascii>, ClientError> {
    MetadataValue::try_from(id)
        .map_err(|_| ClientError::Config(format!("request id {id:?} is not printable ASCII")))
}

impl Client {
    /// Admin: mints a token under `request_id`, retrying until the budget
    /// is spent: every attempt carries the id, so however many reach the
    /// control plane, one token is minted and each answer names it.
    pub async fn create_token_once(
        &self,
        admin_token: &str,
        req: CreateTokenRequest,
        request_id: &str,
    ) -> Result<CreateTokenResponse, ClientError> {
        let (bearer, id) = (bearer(admin_token)?, request_id_value(request_id)?);
        self.retrying("CreateToken", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request_once(req.clone(), &bearer, &id);
            async move { c.create_token(r).await }
        })
        .await
    }

    /// Admin: starts a key rotation under `request_id` (see
    /// [`Client::create_token_once`]): one rotation however many attempts.
    pub async fn rotate_key_now_once(
        &self,
        admin_token: &str,
        request_id: &str,
    ) -> Result<RotateKeyNowResponse, ClientError> {
        let (bearer, id) = (bearer(admin_token)?, request_id_value(request_id)?);
        self.retrying("RotateKeyNow", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request_once(RotateKeyNowRequest {}, &bearer, &id);
            async move { c.rotate_key_now(r).await }
        })
        .await
    }

    /// Admin: applies a policy under `request_id` (see
    /// [`Client::create_token_once`]): however many attempts reach the
    /// control plane, the text is applied once and each answer is the
    /// first one's, even if another admin applied another text meanwhile.
    pub async fn apply_policy_once(
        &self,
        admin_token: &str,
        req: ApplyPolicyRequest,
        request_id: &str,
    ) -> Result<ApplyPolicyResponse, ClientError> {
        let (bearer, id) = (bearer(admin_token)?, request_id_value(request_id)?);
        self.retrying("ApplyPolicy", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request_once(req.clone(), &bearer, &id);
            async move { c.apply_policy(r).await }
        })
        .await
    }

    /// Admin: revokes `peer` under `request_id`: one revocation, and each
    /// answer names the first attempt's end.
    pub async fn revoke_node_once(
        &self,
        admin_token: &str,
        peer: &PeerId,
        reason: &str,
        request_id: &str,
    ) -> Result<RevokeNodeResponse, ClientError> {
        let (bearer, id) = (bearer(admin_token)?, request_id_value(request_id)?);
        let msg = RevokeNodeRequest {
            peer_id: peer.to_bytes(),
            reason: reason.to_string(),
        };
        self.retrying("RevokeNode", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request_once(msg.clone(), &bearer, &id);
            async move { c.revoke_node(r).await }
        })
        .await
    }

    /// Admin: revokes the token `token_id` under `request_id`: one
    /// revocation, and each answer names the first attempt's end.
    pub async fn revoke_token_once(
        &self,
        admin_token: &str,
        token_id: &str,
        reason: &str,
        request_id: &str,
    ) -> Result<RevokeTokenResponse, ClientError> {
        let (bearer, id) = (bearer(admin_token)?, request_id_value(request_id)?);
        let msg = RevokeTokenRequest {
            token_id: token_id.to_string(),
            reason: reason.to_string(),
        };
        self.retrying("RevokeToken", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request_once(msg.clone(), &bearer, &id);
            async move { c.revoke_token(r).await }
        })
        .await
    }

    /// An admin request carrying `request_id`.
    fn admin_request_once<T>(
        &self,
        msg: T,
        bearer: &MetadataValue<Ascii>,
        request_id: &MetadataValue<Ascii>,
    ) -> tonic::Request<T> {
        let mut r = self.admin_request(msg, bearer);
        r.metadata_mut()
            .insert(REQUEST_ID_METADATA, request_id.clone());
        r
    }

    /// Admin: one page of tokens (`page_token` empty for the first).
    pub async fn list_tokens(
        &self,
        admin_token: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<ListTokensResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("ListTokens", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(
                ListTokensRequest {
                    page_size,
                    page_token: page_token.to_string(),
                },
                &bearer,
            );
            async move { c.list_tokens(r).await }
        })
        .await
    }

    /// Admin: one page of enrolled nodes (`page_token` empty for the first).
    pub async fn list_nodes(
        &self,
        admin_token: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<ListNodesResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("ListNodes", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(
                ListNodesRequest {
                    page_size,
                    page_token: page_token.to_string(),
                },
                &bearer,
            );
            async move { c.list_nodes(r).await }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::ClientConfig;

    #[test]
    fn request_ids_are_fresh_and_valid_metadata() {
        let a = new_request_id("cli");
        let b = new_request_id("cli");
        assert_ne!(a, b);
        assert!(a.starts_with("cli-") && a.len() == 4 + 32, "{a}");
        assert!(request_id_value(&a).is_ok());
        assert!(request_id_value("bad\nid").is_err());
    }

    use crate::clock::SkipClock;

    #[tokio::test]
    async fn every_call_with_a_request_id_is_retried_after_a_lost_answer() {
        // A listener that accepts and never answers: every attempt's
        // outcome is ambiguous, which only a request id makes safe to retry.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        let c = Client::with_clock(
            ClientConfig {
                url,
                retry_budget: Duration::from_secs(5),
                rpc_timeout: Duration::from_millis(200),
                ca_pem: None,
            },
            Arc::new(SkipClock::default()),
        )
        .expect("valid config");
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            c.create_token_once(
                "admin-token-0123456789",
                CreateTokenRequest::default(),
                "id-1",
            ),
        )
        .await
        .expect("returns within the deadline");
        assert!(
            matches!(r, Err(ClientError::BudgetExhausted { attempts, .. }) if attempts >= 2),
            "{r:?}"
        );
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            c.rotate_key_now_once("admin-token-0123456789", "id-2"),
        )
        .await
        .expect("returns within the deadline");
        assert!(
            matches!(r, Err(ClientError::BudgetExhausted { attempts, .. }) if attempts >= 2),
            "{r:?}"
        );
        // The revocations and the apply, each under its id, alike.
        let admin = "admin-token-0123456789";
        let peer = agentmesh_proto::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id();
        let attempts = |r: Result<(), ClientError>| match r {
            Err(ClientError::BudgetExhausted { attempts, .. }) => attempts,
            other => panic!("expected retries until the budget, got {other:?}"),
        };
        let within = Duration::from_secs(60);
        let r = tokio::time::timeout(within, c.revoke_node_once(admin, &peer, "x", "id-3"));
        assert!(attempts(r.await.expect("bounded").map(drop)) >= 2);
        let r = tokio::time::timeout(within, c.revoke_token_once(admin, "t-1", "x", "id-4"));
        assert!(attempts(r.await.expect("bounded").map(drop)) >= 2);
        let req = ApplyPolicyRequest::default();
        let r = tokio::time::timeout(within, c.apply_policy_once(admin, req, "id-5"));
        assert!(attempts(r.await.expect("bounded").map(drop)) >= 2);
        task.abort();
    }
}
