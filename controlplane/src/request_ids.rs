//! Request ids of the admin calls that change something (`CreateToken`,
//! `RotateKeyNow`, `ApplyPolicy`, `RevokeNode`, `RevokeToken`): a client
//! retrying after a lost answer sends the same `request-id` metadata, and
//! the control plane answers the first attempt's answer instead of minting
//! a second token, rotating twice, applying a text again that another
//! admin replaced meanwhile, or answering a revocation with a later end.
//!
//! The store records (id, method, digest of the request, answer) in the
//! transaction that does the work (see `store::admin_requests`), so the
//! record exists exactly when the work does, on every replica sharing the
//! database. Here: reading and checking the id, the request's digest, and
//! turning an earlier record into the answer or a refusal.

use prost::Message;
use sha2::{Digest as _, Sha256};

use crate::{
    status::ServiceError,
    store::{AdminRequest, MAX_REQUEST_ID_LEN, PriorRequest, RequestOnce},
};

/// The gRPC metadata key carrying a request id.
pub const REQUEST_ID_METADATA: &str = "request-id";

/// The request id in `metadata`, checked: `None` when absent; refused
/// when empty, longer than [`MAX_REQUEST_ID_LEN`] or holding anything but
/// `A-Z a-z 0-9 . _ : -`.
pub fn from_metadata(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Option<String>, ServiceError> {
    let Some(v) = metadata.get(REQUEST_ID_METADATA) else {
        return Ok(None);
    };
    let id = v
        .to_str()
        .map_err(|_| ServiceError::Invalid("request-id is not printable ASCII".into()))?;
    check(id)?;
    Ok(Some(id.to_string()))
}

/// Refuses an id that is empty, too long or holds other characters than
/// `A-Z a-z 0-9 . _ : -`.
pub fn check(id: &str) -> Result<(), ServiceError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if id.is_empty() || id.len() > MAX_REQUEST_ID_LEN || !id.chars().all(ok_char) {
        return Err(ServiceError::Invalid(format!(
            "request-id must be 1..={MAX_REQUEST_ID_LEN} bytes of A-Z a-z 0-9 . _ : -"
        )));
    }
    Ok(())
}

/// SHA-256 of the method and the request as encoded: the same request
/// retried has the same digest.
pub fn digest(method: &str, request: &impl Message) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update([0]);
    h.update(request.encode_to_vec());
    h.finalize().into()
}

/// The record of a request about to be done, with its answer.
pub fn record(
    request_id: &str,
    method: &'static str,
    digest: [u8; 32],
    at: i64,
    response: &impl Message,
) -> AdminRequest {
    AdminRequest {
        request_id: request_id.to_string(),
        method,
        digest,
        at,
        response: response.encode_to_vec(),
    }
}

/// The record of a request whose answer its work gives: `answer` makes it
/// from the work's result (`None`: nothing was done, nothing recorded).
pub fn once<T, R: Message>(
    request_id: &str,
    method: &'static str,
    digest: [u8; 32],
    at: i64,
    answer: impl Fn(&T) -> Option<R> + Send + Sync + 'static,
) -> RequestOnce<T> {
    RequestOnce {
        request_id: request_id.to_string(),
        method,
        digest,
        at,
        answer: std::sync::Arc::new(move |done: &T| answer(done).map(|r| r.encode_to_vec())),
    }
}

/// The answer to a request whose id was recorded already: the recorded
/// answer when it was this same request, else a refusal saying why.
pub fn replay<R: Message + Default>(
    request_id: &str,
    method: &'static str,
    digest: [u8; 32],
    prior: PriorRequest,
) -> Result<R, ServiceError> {
    if prior.method != method || prior.digest != digest {
        return Err(ServiceError::Invalid(format!(
            "request-id {request_id:?} was used at unix {} for another request ({} with other \
             fields); nothing was done: send this request with a new request id",
            prior.at, prior.method
        )));
    }
    tracing::info!(
        request_id,
        method,
        at = prior.at,
        "admin request retried: first answer returned"
    );
    R::decode(prior.response.as_slice()).map_err(|e| {
        ServiceError::Store(crate::store::StoreError::Corrupt {
            table: "admin_requests",
            what: format!("answer of {request_id:?}: {e}"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_proto::pb::controlplane::{CreateTokenRequest, CreateTokenResponse};

    #[test]
    fn ids_are_checked() {
        for ok in [
            "a",
            "cli-0123abcd",
            "A.b_c:d-e",
            &"x".repeat(MAX_REQUEST_ID_LEN),
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in ["", " x", "a/b", "é", &"x".repeat(MAX_REQUEST_ID_LEN + 1)] {
            assert!(
                matches!(check(bad), Err(ServiceError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_replay_answers_only_the_same_request() {
        let req = CreateTokenRequest {
            max_uses: 2,
            ..Default::default()
        };
        let d = digest("CreateToken", &req);
        let answer = CreateTokenResponse {
            token: "amt_x".into(),
            token_id: "t1".into(),
            expires_at_unix_secs: 9,
        };
        let rec = record("id1", "CreateToken", d, 5, &answer);
        let prior = PriorRequest {
            method: rec.method.to_string(),
            digest: rec.digest,
            at: rec.at,
            response: rec.response.clone(),
        };
        let got: CreateTokenResponse =
            replay("id1", "CreateToken", d, prior.clone()).expect("same request");
        assert_eq!(got, answer);
        let other = digest(
            "CreateToken",
            &CreateTokenRequest {
                max_uses: 3,
                ..Default::default()
            },
        );
        assert_ne!(other, d);
        let e = replay::<CreateTokenResponse>("id1", "CreateToken", other, prior.clone())
            .expect_err("another request");
        assert!(e.to_string().contains("new request id"), "{e}");
        // The same bytes under another method are another request.
        assert!(replay::<CreateTokenResponse>("id1", "RotateKeyNow", d, prior).is_err());
    }
}
