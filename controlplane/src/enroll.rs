//! Enroll and Refresh: the two calls that issue credentials.
//!
//! Both take the source's share of the unauthenticated budget, then
//! verify (a failure counts against the source in the failure guard, which
//! refuses only callers that do not prove themselves), and only then take a
//! token of their own budget ([`crate::request_limits`]), so a caller whose proof
//! or credential does not check out never spends what members need. Role
//! and labels come from the token.

use std::net::IpAddr;

use agentmesh_proto::{
    credential::{CredentialError, map_to_labels, sign, verify},
    identity::PeerId,
    pb::{
        controlplane::{EnrollRequest, EnrollResponse, RefreshRequest, RefreshResponse},
        credential::{Claims, Credential},
    },
    proof::{Bound, ProofError, verify_proof},
    unix_now,
};
use rand::RngCore;

use crate::{
    state::State,
    status::ServiceError,
    store::{EnrollRefusal, NodeRefusal, NodeRow},
    tokens,
};

fn proof_error(e: ProofError) -> ServiceError {
    match e {
        ProofError::BadKey => ServiceError::Invalid("proof public key does not decode".into()),
        other => refused_proof(other),
    }
}

/// A proof that does not verify for its request: `old_proof` when it is
/// in the old, unbound format (its maker predates this control plane; the
/// message says to upgrade it), else `bad_proof`. Both are failures for
/// the failure guard: anyone can make an old-format proof with a fresh key.
pub(crate) fn refused_proof(e: ProofError) -> ServiceError {
    let reason = match e {
        ProofError::OldFormat => "old_proof",
        _ => "bad_proof",
    };
    ServiceError::unauth(reason, format!("proof of possession refused: {e}"))
}

/// Maps a credential refusal onto a service error.
pub(crate) fn credential_error(e: CredentialError) -> ServiceError {
    match e {
        CredentialError::Malformed(m) => ServiceError::Invalid(format!("credential: {m}")),
        CredentialError::WrongPeer => ServiceError::unauth(
            "wrong_peer",
            "credential subject is not the key that signed the proof",
        ),
        CredentialError::Revoked => {
            ServiceError::denied("revoked", "credential subject is revoked")
        }
        // Checked after the signature: ours, only out of date.
        e @ CredentialError::Expired { .. } => {
            ServiceError::unauth("credential_expired", format!("credential refused: {e}"))
        }
        e @ CredentialError::NotYetValid { .. } => ServiceError::unauth(
            "credential_not_yet_valid",
            format!("credential refused: {e}"),
        ),
        other => ServiceError::unauth("bad_credential", format!("credential refused: {other}")),
    }
}

pub(crate) fn node_refusal(r: NodeRefusal) -> ServiceError {
    match r {
        NodeRefusal::UnknownNode => ServiceError::unauth(
            "unknown_node",
            "node is not enrolled (or was reaped); enroll again",
        ),
        NodeRefusal::Revoked => ServiceError::denied("revoked", "node is revoked"),
        NodeRefusal::NotARouter => ServiceError::denied(
            "wrong_role",
            "the node is not enrolled as a router (enroll with a router token)",
        ),
    }
}

impl State {
    /// Signs a credential for `node` (held by `peer`) issued at `now`.
    fn issue(&self, node: &NodeRow, peer: &PeerId, now: i64) -> Result<Credential, ServiceError> {
        let signer = self.keys.signer(now).ok_or(ServiceError::NoSigningKey)?;
        let claims = Claims {
            subject: peer.to_bytes(),
            node_id: node.node_id.clone(),
            role: node.role,
            token_kind: node.token_kind,
            labels: map_to_labels(&node.labels),
            issued_at_unix_secs: now,
            expires_at_unix_secs: now + self.config.credential_ttl_secs as i64,
            key_id: signer.key_id,
            // The token it enrolled with, so one revocation by token id
            // covers every credential the token led to (refresh keeps it:
            // it is read from the node's row).
            token_id: node.token_id.clone(),
        };
        Ok(sign(&claims, &signer.key))
    }

    /// `Enroll`, in [`crate::request_limits`]'s order: nothing to verify from a
    /// source over its failures is refused at once; the source's
    /// unauthenticated share; the proof; a token from a source over its
    /// failures must be one the token index holds; the enroll budget; the
    /// token in the database. Every failure is judged against the source.
    pub async fn enroll(
        &self,
        source: Option<IpAddr>,
        req: EnrollRequest,
    ) -> Result<EnrollResponse, ServiceError> {
        if req.token.trim().is_empty() || req.proof.is_none() {
            self.limits
                .refuse_unverifiable(source, "token and proof of possession")?;
        }
        self.limits.check_unauth(source)?;
        let r = self.enroll_checked(source, req).await;
        self.limits.judge(source, r)
    }

    async fn enroll_checked(
        &self,
        source: Option<IpAddr>,
        req: EnrollRequest,
    ) -> Result<EnrollResponse, ServiceError> {
        let token = req.token.trim().to_string();
        if token.is_empty() || token.len() > tokens::MAX_TOKEN_LEN {
            return Err(ServiceError::Invalid(format!(
                "token must be 1..={} bytes",
                tokens::MAX_TOKEN_LEN
            )));
        }
        let proof = req
            .proof
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("proof of possession missing".into()))?;
        let now = unix_now();
        // Bound to the token as sent: a proof seen with another token fails.
        let (_, peer) =
            verify_proof(&req.binding(), &self.public_url, proof, now).map_err(proof_error)?;
        let digest = tokens::digest(&token);
        self.limits
            .check_token(source, &digest, |limit| {
                self.db
                    .run(self.db.store().token_digests(unix_now(), limit))
            })
            .await?;
        self.limits.check_enroll(source)?;
        if self.keys.signer(now).is_none() {
            return Err(ServiceError::NoSigningKey);
        }
        let mut id = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut id);
        let new_node_id = format!("n-{}", hex::encode(id));
        let peer_bytes = peer.to_bytes();
        let source_ip = source.map(|ip| ip.to_string()).unwrap_or_default();
        let exp = now + self.config.credential_ttl_secs as i64;
        let outcome = self
            .db
            .run(
                self.db
                    .store()
                    .enroll(&digest, &peer_bytes, &new_node_id, &source_ip, now, exp),
            )
            .await?;
        let enrolled = outcome.map_err(|r| match r {
            EnrollRefusal::UnknownToken => {
                ServiceError::unauth("unknown_token", "token not recognised")
            }
            EnrollRefusal::TokenExpired => {
                ServiceError::unauth("token_expired", "token has expired")
            }
            EnrollRefusal::TokenUsedUp => {
                ServiceError::unauth("token_used_up", "token has no uses left")
            }
            EnrollRefusal::Revoked => ServiceError::denied("revoked", "this key's node is revoked"),
            EnrollRefusal::TokenRevoked => ServiceError::denied(
                "token_revoked",
                "token was revoked (RevokeToken): it enrolls no one",
            ),
        })?;
        let credential = self.issue(&enrolled.node, &peer, now)?;
        self.metrics.enrolled(enrolled.re_enrolled);
        tracing::debug!(node_id = %enrolled.node.node_id, %peer, re_enrolled = enrolled.re_enrolled, "enrolled");
        Ok(EnrollResponse {
            credential: Some(credential),
            keys: Some(self.keys.key_set(now)),
            node_id: enrolled.node.node_id,
        })
    }

    /// `Refresh`: a current (or just-expired, within the grace) credential
    /// plus a fresh proof from the same key. In [`crate::request_limits`]'s
    /// order: nothing to verify from a source over its failures is refused
    /// at once; the source's unauthenticated share; verify (a failure is
    /// judged against the source, a verified caller is served whatever its
    /// address's failures); only then the refresh budget.
    pub async fn refresh(
        &self,
        source: Option<IpAddr>,
        req: RefreshRequest,
    ) -> Result<RefreshResponse, ServiceError> {
        if req.credential.is_none() || req.proof.is_none() {
            self.limits
                .refuse_unverifiable(source, "credential and proof of possession")?;
        }
        self.limits.check_unauth(source)?;
        let now = unix_now();
        let peer = self.limits.judge(source, self.verify_refresh(req, now))?;
        self.limits.check_refresh(source)?;
        let peer_bytes = peer.to_bytes();
        let exp = now + self.config.credential_ttl_secs as i64;
        let node = self
            .db
            .run(self.db.store().touch_node(&peer_bytes, now, Some(exp)))
            .await?
            .map_err(node_refusal)?;
        let credential = self.issue(&node, &peer, now)?;
        Ok(RefreshResponse {
            credential: Some(credential),
            keys: Some(self.keys.key_set(now)),
        })
    }

    /// What a Refresh proves, checked without the database: the proof and
    /// the credential, signed for the proof's key.
    fn verify_refresh(&self, req: RefreshRequest, now: i64) -> Result<PeerId, ServiceError> {
        let cred = req
            .credential
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("credential missing".into()))?;
        let proof = req
            .proof
            .as_ref()
            .ok_or_else(|| ServiceError::Invalid("proof of possession missing".into()))?;
        // Bound to this credential: a proof seen with another one fails.
        let (_, peer) =
            verify_proof(&req.binding(), &self.public_url, proof, now).map_err(proof_error)?;
        let skew = self.config.clock_skew_secs as i64;
        let grace = self.config.refresh_grace_secs as i64;
        verify(cred, &self.keys.trust(now), now, Some(&peer), skew + grace)
            .map_err(credential_error)?;
        Ok(peer)
    }
}
