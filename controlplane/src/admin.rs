//! Admin RPCs: CreateToken, RevokeNode, RevokeToken, RotateKeyNow (each
//! with a request id when the caller sends one, see
//! [`crate::request_ids`]), behind a bearer token
//! compared in constant time. A missing or wrong token counts against the
//! caller's source IP in the same failure guard as failed enrollments, so
//! the token cannot be guessed at line rate.

use std::{collections::BTreeMap, net::IpAddr};

use agentmesh_proto::{
    identity::PeerId,
    pb::{
        controlplane::{
            CreateTokenRequest, CreateTokenResponse, RevokeNodeRequest, RevokeNodeResponse,
            RevokeTokenRequest, RevokeTokenResponse, RotateKeyNowRequest, RotateKeyNowResponse,
        },
        credential::{Role, TokenKind},
    },
    unix_now,
};

use crate::{request_ids, state::State, status::ServiceError, store::TokenRow, tokens};

/// Most labels a token may carry.
pub const MAX_TOKEN_LABELS: usize = 32;
/// Longest label key, bytes.
pub const MAX_LABEL_KEY_LEN: usize = 63;
/// Longest label value, bytes.
pub const MAX_LABEL_VALUE_LEN: usize = 255;
/// Most uses a token may allow.
pub const MAX_TOKEN_USES: u32 = 1_000_000;
/// Longest token lifetime, seconds (one year).
pub const MAX_TOKEN_TTL_SECS: u64 = 365 * 86_400;
/// Longest revocation reason, bytes.
pub const MAX_REASON_LEN: usize = 256;

/// What a new token allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpec {
    /// Bootstrap or ephemeral.
    pub kind: TokenKind,
    /// Member or router.
    pub role: Role,
    /// Labels members of this token get.
    pub labels: BTreeMap<String, String>,
    /// Enrollments it allows.
    pub max_uses: u32,
    /// Lifetime, seconds.
    pub ttl_secs: u64,
}

impl TokenSpec {
    /// Checks bounds; the error names the field.
    pub fn validate(&self) -> Result<(), ServiceError> {
        let bad = |m: String| Err(ServiceError::Invalid(m));
        if self.kind == TokenKind::Unspecified {
            return bad("kind must be bootstrap or ephemeral".into());
        }
        if self.role == Role::Unspecified {
            return bad("role must be member or router".into());
        }
        if !(1..=MAX_TOKEN_USES).contains(&self.max_uses) {
            return bad(format!("max_uses must be 1..={MAX_TOKEN_USES}"));
        }
        if !(1..=MAX_TOKEN_TTL_SECS).contains(&self.ttl_secs) {
            return bad(format!("ttl_secs must be 1..={MAX_TOKEN_TTL_SECS}"));
        }
        if self.labels.len() > MAX_TOKEN_LABELS {
            return bad(format!("at most {MAX_TOKEN_LABELS} labels"));
        }
        for (k, v) in &self.labels {
            if k.is_empty() || k.len() > MAX_LABEL_KEY_LEN || v.len() > MAX_LABEL_VALUE_LEN {
                return bad(format!(
                    "label {k:?}: key 1..={MAX_LABEL_KEY_LEN} bytes, value at most {MAX_LABEL_VALUE_LEN}"
                ));
            }
        }
        Ok(())
    }
}

/// Refuses a revocation reason over [`MAX_REASON_LEN`].
fn check_reason(reason: &str) -> Result<(), ServiceError> {
    if reason.len() > MAX_REASON_LEN {
        return Err(ServiceError::Invalid(format!(
            "reason is longer than {MAX_REASON_LEN} bytes"
        )));
    }
    Ok(())
}

impl State {
    /// Checks `authorization: Bearer <token>` from `source`: no header from
    /// a source over its failures is refused by the failure guard at once;
    /// a missing or wrong token is judged as a failure of the source (and
    /// refused by the guard once the source is over its limit); the right
    /// token is served whatever the source's failures.
    pub fn check_admin(
        &self,
        source: Option<IpAddr>,
        authorization: Option<&str>,
    ) -> Result<(), ServiceError> {
        if authorization.is_none() {
            self.limits
                .refuse_unverifiable(source, "authorization: Bearer <admin token>")?;
        }
        let r = self.compare_admin(authorization);
        self.limits.judge(source, r)
    }

    fn compare_admin(&self, authorization: Option<&str>) -> Result<(), ServiceError> {
        let Some(expected) = self.admin_token.as_deref() else {
            return Err(ServiceError::denied(
                "admin_token",
                "admin API disabled: start the control plane with --admin-token-file",
            ));
        };
        let given = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ServiceError::unauth("admin_token", "authorization: Bearer <admin token> missing")
            })?;
        if tokens::ct_eq(given, expected) {
            Ok(())
        } else {
            Err(ServiceError::unauth(
                "admin_token",
                "admin token does not match",
            ))
        }
    }

    /// Mints a token; returns (token, token_id, expires_at).
    pub async fn mint_token(&self, spec: TokenSpec) -> Result<(String, String, i64), ServiceError> {
        let r = self.mint(spec, None).await?;
        Ok((r.token, r.token_id, r.expires_at_unix_secs))
    }

    /// Mints a token, with `request` (its id and digest) recorded in the
    /// same transaction when given: a request id recorded already mints
    /// nothing and gets its first answer (or a refusal, for another
    /// request).
    async fn mint(
        &self,
        spec: TokenSpec,
        request: Option<(String, [u8; 32])>,
    ) -> Result<CreateTokenResponse, ServiceError> {
        const METHOD: &str = "CreateToken";
        spec.validate()?;
        let now = unix_now();
        let (token, token_id) = tokens::generate();
        let row = TokenRow {
            token_id: token_id.clone(),
            kind: spec.kind as i32,
            role: spec.role as i32,
            labels: spec.labels,
            max_uses: spec.max_uses,
            uses: 0,
            created_at: now,
            expires_at: now + spec.ttl_secs as i64,
        };
        let digest = tokens::digest(&token);
        let answer = CreateTokenResponse {
            token,
            token_id: token_id.clone(),
            expires_at_unix_secs: row.expires_at,
        };
        let store = self.db.store();
        match request {
            None => self.db.run(store.create_token(&digest, &row)).await?,
            Some((id, req_digest)) => {
                let rec = request_ids::record(&id, METHOD, req_digest, now, &answer);
                if let Err(prior) = self
                    .db
                    .run(store.create_token_once(&digest, &row, &rec))
                    .await?
                {
                    return request_ids::replay(&id, METHOD, req_digest, prior);
                }
            }
        }
        // A member may enroll with it from an address the guard refuses.
        self.limits.token_minted();
        tracing::info!(%token_id, kind = ?spec.kind, role = ?spec.role, "token created");
        Ok(answer)
    }

    /// `CreateToken`, with the caller's request id if it sent one.
    pub async fn create_token(
        &self,
        req: CreateTokenRequest,
        request_id: Option<String>,
    ) -> Result<CreateTokenResponse, ServiceError> {
        let request = request_id.map(|id| {
            let d = request_ids::digest("CreateToken", &req);
            (id, d)
        });
        let mut labels = BTreeMap::new();
        for l in &req.labels {
            if labels.insert(l.key.clone(), l.value.clone()).is_some() {
                return Err(ServiceError::Invalid(format!(
                    "label {:?} given twice",
                    l.key
                )));
            }
        }
        let spec = TokenSpec {
            kind: TokenKind::try_from(req.kind).unwrap_or(TokenKind::Unspecified),
            role: Role::try_from(req.role).unwrap_or(Role::Unspecified),
            labels,
            max_uses: req.max_uses,
            ttl_secs: req.ttl_secs,
        };
        self.mint(spec, request).await
    }

    /// `RevokeNode`, with the caller's request id if it sent one: a retry
    /// with it answers the first revocation's end and revokes nothing more.
    pub async fn revoke_node(
        &self,
        req: RevokeNodeRequest,
        request_id: Option<String>,
    ) -> Result<RevokeNodeResponse, ServiceError> {
        const METHOD: &str = "RevokeNode";
        let peer = PeerId::from_bytes(&req.peer_id)
            .map_err(|_| ServiceError::Invalid("peer_id is not a PeerId".into()))?;
        check_reason(&req.reason)?;
        let now = unix_now();
        let default_until =
            now + (self.config.credential_ttl_secs + self.config.clock_skew_secs) as i64;
        let (bytes, store) = (peer.to_bytes(), self.db.store());
        let until = match request_id {
            None => {
                let revoke = store.revoke(&bytes, &req.reason, now, default_until);
                self.db.run(revoke).await?
            }
            Some(id) => {
                let d = request_ids::digest(METHOD, &req);
                let rec = request_ids::once(&id, METHOD, d, now, |until: &i64| {
                    Some(RevokeNodeResponse {
                        until_unix_secs: *until,
                    })
                });
                let revoke = store.revoke_once(&bytes, &req.reason, now, default_until, &rec);
                match self.db.run(revoke).await? {
                    Ok(until) => until,
                    Err(prior) => return request_ids::replay(&id, METHOD, d, prior),
                }
            }
        };
        self.invalidate_directory();
        self.watch.changed();
        tracing::info!(%peer, until, "node revoked");
        Ok(RevokeNodeResponse {
            until_unix_secs: until,
        })
    }

    /// `RevokeToken`: the token enrolls no one again, its nodes are revoked,
    /// and the directory (and every watcher) carries one revocation by
    /// token id until every credential it could cover has expired: the
    /// credential lifetime plus the clock skew from now, or the last
    /// expiry of a credential issued to one of its nodes if later. With
    /// the caller's request id, a retry answers the first revocation's end
    /// (an unknown id records nothing: its retry is judged afresh).
    pub async fn revoke_token(
        &self,
        req: RevokeTokenRequest,
        request_id: Option<String>,
    ) -> Result<RevokeTokenResponse, ServiceError> {
        const METHOD: &str = "RevokeToken";
        let token_id = req.token_id.trim();
        if token_id.is_empty() || token_id.len() > tokens::MAX_TOKEN_LEN {
            return Err(ServiceError::Invalid(format!(
                "token_id must be 1..={} bytes",
                tokens::MAX_TOKEN_LEN
            )));
        }
        check_reason(&req.reason)?;
        let now = unix_now();
        let until = now + (self.config.credential_ttl_secs + self.config.clock_skew_secs) as i64;
        let store = self.db.store();
        let until = match request_id {
            None => {
                let revoke = store.revoke_token(token_id, &req.reason, now, until);
                self.db.run(revoke).await?
            }
            Some(id) => {
                let d = request_ids::digest(METHOD, &req);
                let rec = request_ids::once(&id, METHOD, d, now, |until: &Option<i64>| {
                    until.map(|u| RevokeTokenResponse { until_unix_secs: u })
                });
                let revoke = store.revoke_token_once(token_id, &req.reason, now, until, &rec);
                match self.db.run(revoke).await? {
                    Ok(until) => until,
                    Err(prior) => return request_ids::replay(&id, METHOD, d, prior),
                }
            }
        }
        .ok_or_else(|| {
            ServiceError::NotFound(format!("no token, node or revocation has id {token_id:?}"))
        })?;
        self.invalidate_directory();
        self.watch.changed();
        tracing::info!(%token_id, until, "token revoked");
        Ok(RevokeTokenResponse {
            until_unix_secs: until,
        })
    }

    /// `RotateKeyNow`, with the caller's request id if it sent one: a
    /// retry with it answers the first rotation's key and rotates nothing.
    pub async fn rotate_key_now(
        &self,
        req: RotateKeyNowRequest,
        request_id: Option<String>,
    ) -> Result<RotateKeyNowResponse, ServiceError> {
        const METHOD: &str = "RotateKeyNow";
        let now = unix_now();
        let (key_id, active_from) = match request_id {
            None => self.keys.rotate_now(&self.db, now).await?,
            Some(id) => {
                let d = request_ids::digest(METHOD, &req);
                let record = |key_id: &str, active_from: i64| {
                    let answer = RotateKeyNowResponse {
                        key_id: key_id.to_string(),
                        active_from_unix_secs: active_from,
                    };
                    request_ids::record(&id, METHOD, d, now, &answer)
                };
                match self.keys.rotate_now_once(&self.db, now, record).await? {
                    Ok(done) => done,
                    Err(prior) => return request_ids::replay(&id, METHOD, d, prior),
                }
            }
        };
        if let Some(next) = self.keys.next_rotation_at() {
            self.metrics.set_next_rotation(next);
        }
        self.watch.changed();
        Ok(RotateKeyNowResponse {
            key_id,
            active_from_unix_secs: active_from,
        })
    }
}
