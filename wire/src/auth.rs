//! `/agentmesh/auth/1`: the client shows its credential and purpose in one
//! `AuthRequest`; the router answers with one `AuthResponse` (admitted until
//! an instant, refused with a reason, or a go-away).
//!
//! - client: [`request`] (a node attaching or asking for transit, a router
//!   authenticating to another router);
//! - server: [`read_request`], then one of [`write_admitted`],
//!   [`write_refused`], [`write_busy`], [`write_go_away`];
//! - pure decoders: [`decode_request`], [`decode_response`], [`outcome`].

use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{
    Admitted, AuthRefusal, AuthRequest, AuthResponse, GoAway, PolicyPush, Purpose, Refused,
    auth_response,
};
use agentmesh_proto::protocols::{AUTH, MAX_FRAME_BYTES, MAX_POLICY_FRAME_BYTES};
use agentmesh_streams::Control;
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use libp2p::PeerId;

use crate::exchange::{Exchange, ExchangeError};
use crate::frame::{self, FrameError};

/// A router's answer to an auth request.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthOutcome {
    /// Admitted until `until` (Unix seconds), with the router's policy and
    /// signed revocation list when they supersede what the request said it
    /// held.
    Admitted {
        until: i64,
        policy: Option<Box<PolicyPush>>,
        /// The address the router observed us at, when it said one
        /// (undecodable bytes read as none: a router's mistake there must
        /// not cost the admission).
        observed: Option<libp2p::Multiaddr>,
    },
    /// Refused, with the reason and detail.
    Refused(AuthRefusal, String),
    /// The router is busy admitting others and could not serve this
    /// request in time: ask again (on the same connection) after about
    /// `retry_after`, with jitter. On the wire a refusal OVERLOADED with
    /// `retry_after_ms` set, so members that predate it go elsewhere.
    Busy {
        /// How long to wait before asking again, as the router said.
        retry_after: Duration,
        /// What the router said.
        detail: String,
    },
    /// Go elsewhere.
    GoAway(GoAway),
}

/// Why an auth exchange failed (not a refusal: those are answers); the
/// peer is the router.
pub type AuthError = ExchangeError;

/// The request a member sends: its credential, its purpose and (for
/// attach and transit) the routers it is attached to.
pub fn request_for(credential: Credential, purpose: Purpose, attached: &[PeerId]) -> AuthRequest {
    AuthRequest {
        credential: Some(credential),
        purpose: purpose as i32,
        attached_routers: attached.iter().map(|p| p.to_bytes()).collect(),
        policy_epoch: 0,
        policy_version: 0,
        policy_push_slot: 0,
        revocations_epoch: 0,
        revocations_generation: 0,
    }
}

/// The outcome an answer carries; `None` when it names no result.
pub fn outcome(resp: AuthResponse) -> Option<AuthOutcome> {
    Some(match resp.result? {
        auth_response::Result::Admitted(a) => AuthOutcome::Admitted {
            until: a.until_unix_secs,
            policy: a.policy.map(Box::new),
            observed: (!a.observed_addr.is_empty())
                .then(|| libp2p::Multiaddr::try_from(a.observed_addr).ok())
                .flatten(),
        },
        auth_response::Result::Refused(r) if r.retry_after_ms > 0 => AuthOutcome::Busy {
            retry_after: Duration::from_millis(u64::from(r.retry_after_ms)),
            detail: r.detail,
        },
        auth_response::Result::Refused(r) => AuthOutcome::Refused(
            AuthRefusal::try_from(r.reason).unwrap_or(AuthRefusal::Unspecified),
            r.detail,
        ),
        auth_response::Result::GoAway(g) => AuthOutcome::GoAway(g),
    })
}

/// Decodes one whole request frame.
pub fn decode_request(bytes: &[u8]) -> Result<AuthRequest, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES)
}

/// Decodes one whole answer frame; `Ok(None)` when it names no result.
pub fn decode_response(bytes: &[u8]) -> Result<Option<AuthOutcome>, FrameError> {
    frame::decode(bytes, MAX_POLICY_FRAME_BYTES).map(outcome)
}

/// Client: opens `/agentmesh/auth/1` to `router`, sends `request` and reads
/// the answer, all within `deadline`.
pub async fn request(
    mut control: Control,
    router: PeerId,
    request: AuthRequest,
    deadline: Duration,
) -> Result<AuthOutcome, AuthError> {
    let ex = Exchange::new(AUTH, router);
    ex.within(deadline, async move {
        let mut s = ex.open(&mut control).await?;
        // An admission may carry the policy: the larger cap.
        let resp: AuthResponse = ex
            .ask(&mut s, &request, MAX_POLICY_FRAME_BYTES, deadline)
            .await?;
        let _ = s.close().await;
        outcome(resp).ok_or(ex.empty())
    })
    .await
}

/// Server: reads the request (≤ 64 KiB) within `deadline`.
pub async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<AuthRequest, FrameError> {
    frame::read(s, MAX_FRAME_BYTES, deadline).await
}

/// Server: answers "admitted until `until`" (Unix seconds), with the
/// policy and the signed revocation list when the member lacks them.
pub async fn write_admitted<S: AsyncWrite + Unpin>(
    s: &mut S,
    until: i64,
    policy: Option<PolicyPush>,
    deadline: Duration,
) -> Result<(), FrameError> {
    write_admitted_observed(s, until, policy, None, deadline).await
}

/// [`write_admitted`], telling the member the address its connection was
/// observed coming from (only plain TCP or QUIC addresses are sent).
pub async fn write_admitted_observed<S: AsyncWrite + Unpin>(
    s: &mut S,
    until: i64,
    policy: Option<PolicyPush>,
    observed: Option<&libp2p::Multiaddr>,
    deadline: Duration,
) -> Result<(), FrameError> {
    let observed_addr = observed
        .filter(|a| agentmesh_streams::dial::ip_target(a).is_some())
        .map(|a| a.to_vec())
        .unwrap_or_default();
    let result = auth_response::Result::Admitted(Admitted {
        until_unix_secs: until,
        policy,
        observed_addr,
    });
    write_result(s, result, deadline).await
}

/// Server: answers with a refusal, its reason and a detail.
pub async fn write_refused<S: AsyncWrite + Unpin>(
    s: &mut S,
    reason: AuthRefusal,
    detail: String,
    deadline: Duration,
) -> Result<(), FrameError> {
    let result = auth_response::Result::Refused(Refused {
        reason: reason as i32,
        detail,
        retry_after_ms: 0,
    });
    write_result(s, result, deadline).await
}

/// Server: answers "busy, ask again after `retry_after`" (a refusal
/// OVERLOADED with `retry_after_ms`, at least 1 ms), with a detail.
pub async fn write_busy<S: AsyncWrite + Unpin>(
    s: &mut S,
    retry_after: Duration,
    detail: String,
    deadline: Duration,
) -> Result<(), FrameError> {
    let ms = u32::try_from(retry_after.as_millis())
        .unwrap_or(u32::MAX)
        .max(1);
    let result = auth_response::Result::Refused(Refused {
        reason: AuthRefusal::Overloaded as i32,
        detail,
        retry_after_ms: ms,
    });
    write_result(s, result, deadline).await
}

/// Server: answers with a go-away instead of an admission.
pub async fn write_go_away<S: AsyncWrite + Unpin>(
    s: &mut S,
    go_away: GoAway,
    deadline: Duration,
) -> Result<(), FrameError> {
    write_result(s, auth_response::Result::GoAway(go_away), deadline).await
}

async fn write_result<S: AsyncWrite + Unpin>(
    s: &mut S,
    result: auth_response::Result,
    deadline: Duration,
) -> Result<(), FrameError> {
    let resp = AuthResponse {
        result: Some(result),
    };
    frame::write(s, &resp, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::io::Cursor;
    use proptest::prelude::*;

    const T: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn each_server_answer_decodes_to_its_outcome() {
        let mut cur = Cursor::new(Vec::new());
        write_admitted(&mut cur, 42, None, T).await.expect("write");
        let bytes = std::mem::take(cur.get_mut());
        assert_eq!(
            decode_response(&bytes).expect("decode"),
            Some(AuthOutcome::Admitted {
                until: 42,
                policy: None,
                observed: None,
            })
        );
        // The observed address travels; anything but plain TCP or QUIC
        // is not sent.
        let seen: libp2p::Multiaddr = "/ip4/10.0.0.5/tcp/4500".parse().expect("addr");
        let mut cur = Cursor::new(Vec::new());
        write_admitted_observed(&mut cur, 42, None, Some(&seen), T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(AuthOutcome::Admitted {
                until: 42,
                policy: None,
                observed: Some(seen),
            })
        );
        let circuit: libp2p::Multiaddr = format!(
            "/ip4/10.0.0.5/tcp/4500/p2p/{}/p2p-circuit",
            libp2p::PeerId::random()
        )
        .parse()
        .expect("addr");
        let mut cur = Cursor::new(Vec::new());
        write_admitted_observed(&mut cur, 42, None, Some(&circuit), T)
            .await
            .expect("write");
        assert!(matches!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(AuthOutcome::Admitted { observed: None, .. })
        ));
        // Undecodable observed bytes read as none, the admission stands.
        let bad = AuthResponse {
            result: Some(auth_response::Result::Admitted(Admitted {
                until_unix_secs: 7,
                policy: None,
                observed_addr: vec![0xff, 0xff, 0xff],
            })),
        };
        assert_eq!(
            outcome(bad),
            Some(AuthOutcome::Admitted {
                until: 7,
                policy: None,
                observed: None,
            })
        );
        let mut cur = Cursor::new(Vec::new());
        write_refused(&mut cur, AuthRefusal::Expired, "old".into(), T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(AuthOutcome::Refused(AuthRefusal::Expired, "old".into()))
        );
        let mut cur = Cursor::new(Vec::new());
        write_busy(&mut cur, Duration::from_millis(1500), "queue".into(), T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(AuthOutcome::Busy {
                retry_after: Duration::from_millis(1500),
                detail: "queue".into()
            })
        );
        let empty = frame::encode(&AuthResponse { result: None });
        assert_eq!(decode_response(&empty).expect("decode"), None);
    }

    #[test]
    fn a_busy_answer_is_a_plain_overloaded_refusal_to_older_members() {
        // What a member that predates `retry_after_ms` decodes: the same
        // message without the field (prost skips unknown fields).
        #[derive(Clone, PartialEq, prost::Message)]
        struct OldRefused {
            #[prost(enumeration = "AuthRefusal", tag = "1")]
            reason: i32,
            #[prost(string, tag = "2")]
            detail: String,
        }
        let new = Refused {
            reason: AuthRefusal::Overloaded as i32,
            detail: "busy".into(),
            retry_after_ms: 2000,
        };
        let old =
            <OldRefused as prost::Message>::decode(prost::Message::encode_to_vec(&new).as_slice())
                .expect("an older member decodes it");
        assert_eq!(old.reason, AuthRefusal::Overloaded as i32);
        assert_eq!(old.detail, "busy");
        // And a refusal without it stays a refusal.
        let plain = AuthResponse {
            result: Some(auth_response::Result::Refused(Refused {
                reason: AuthRefusal::Overloaded as i32,
                detail: String::new(),
                retry_after_ms: 0,
            })),
        };
        assert_eq!(
            outcome(plain),
            Some(AuthOutcome::Refused(AuthRefusal::Overloaded, String::new()))
        );
    }

    #[test]
    fn an_unknown_refusal_reason_reads_as_unspecified() {
        let resp = AuthResponse {
            result: Some(auth_response::Result::Refused(Refused {
                reason: 9999,
                detail: String::new(),
                retry_after_ms: 0,
            })),
        };
        assert_eq!(
            outcome(resp),
            Some(AuthOutcome::Refused(
                AuthRefusal::Unspecified,
                String::new()
            ))
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }
    }
}
