//! `/agentmesh/call/1`: the caller sends one `CallRequest` (the service
//! and its credential); the provider answers one `CallResponse` (accepted,
//! or refused with a reason and a detail). After an acceptance the stream
//! carries the call's raw bytes both ways.
//!
//! - client: [`request`] (opens the stream and returns it, ready for raw
//!   bytes); [`exchange`] on a stream already open;
//! - server: [`read_request`], then [`write_accepted`] or [`write_refused`];
//! - pure decoders: [`decode_request`], [`decode_response`], [`answer`].

use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{CallRefusal, CallRequest, CallResponse};
use agentmesh_proto::protocols::{CALL, MAX_FRAME_BYTES};
use agentmesh_streams::{ConnectionInfo, Control};
use futures::{AsyncRead, AsyncWrite};
use libp2p::{PeerId, Stream};

use crate::exchange::{Exchange, ExchangeError};
use crate::frame::{self, FrameError};

/// A provider's answer to a call request.
#[derive(Debug, Clone, PartialEq)]
pub enum CallAnswer {
    /// The call goes ahead: raw bytes follow on the stream.
    Accepted,
    /// Refused, with the reason and a detail.
    Refused(CallRefusal, String),
}

/// Why a call exchange failed (not a refusal: those are answers); the
/// peer is the provider.
pub type CallExchangeError = ExchangeError;

/// The request for `service`, showing `credential`.
pub fn request_for(service: &str, credential: Credential) -> CallRequest {
    CallRequest {
        service: service.to_string(),
        credential: Some(credential),
        probe: false,
    }
}

/// The answer a response carries; an unknown refusal reason reads as
/// unspecified.
pub fn answer(resp: CallResponse) -> CallAnswer {
    if resp.accepted {
        CallAnswer::Accepted
    } else {
        CallAnswer::Refused(
            CallRefusal::try_from(resp.refusal).unwrap_or(CallRefusal::Unspecified),
            resp.detail,
        )
    }
}

/// Decodes one whole request frame.
pub fn decode_request(bytes: &[u8]) -> Result<CallRequest, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES)
}

/// Decodes one whole answer frame.
pub fn decode_response(bytes: &[u8]) -> Result<CallAnswer, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES).map(answer)
}

/// Client: opens `/agentmesh/call/1` to `provider`, asks for `service`
/// showing `credential` and reads the answer, all within `deadline`. The
/// stream comes back with the answer and the connection carrying it
/// (direct or relayed): after an acceptance it carries the call's bytes.
pub async fn request(
    control: Control,
    provider: PeerId,
    service: &str,
    credential: Credential,
    deadline: Duration,
) -> Result<(CallAnswer, Stream, ConnectionInfo), CallExchangeError> {
    send(
        control,
        provider,
        request_for(service, credential),
        deadline,
    )
    .await
}

/// [`request`] with a request built by the caller (a probe sets
/// [`CallRequest::probe`]).
pub async fn send(
    mut control: Control,
    provider: PeerId,
    req: CallRequest,
    deadline: Duration,
) -> Result<(CallAnswer, Stream, ConnectionInfo), CallExchangeError> {
    let ex = Exchange::new(CALL, provider);
    ex.within(deadline, async move {
        let (info, mut s) = ex.open_with_info(&mut control).await?;
        let a = exchange(&mut s, provider, &req, deadline).await?;
        Ok((a, s, info))
    })
    .await
}

/// Client, on a stream to `provider` already open: sends `request` and
/// reads the answer within `deadline`, leaving the stream open.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    provider: PeerId,
    request: &CallRequest,
    deadline: Duration,
) -> Result<CallAnswer, CallExchangeError> {
    let ex = Exchange::new(CALL, provider);
    ex.within(deadline, async {
        let resp: CallResponse = ex.ask(s, request, MAX_FRAME_BYTES, deadline).await?;
        Ok(answer(resp))
    })
    .await
}

/// Server: reads the request (≤ 64 KiB) within `deadline`.
pub async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<CallRequest, FrameError> {
    frame::read(s, MAX_FRAME_BYTES, deadline).await
}

/// Server: accepts the call (raw bytes follow).
pub async fn write_accepted<S: AsyncWrite + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<(), FrameError> {
    let resp = CallResponse {
        accepted: true,
        refusal: CallRefusal::Unspecified as i32,
        detail: String::new(),
    };
    frame::write(s, &resp, deadline).await
}

/// Server: refuses the call with `reason` and `detail`.
pub async fn write_refused<S: AsyncWrite + Unpin>(
    s: &mut S,
    reason: CallRefusal,
    detail: String,
    deadline: Duration,
) -> Result<(), FrameError> {
    let resp = CallResponse {
        accepted: false,
        refusal: reason as i32,
        detail,
    };
    frame::write(s, &resp, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExchangeFailure as _;
    use crate::testing::{Silent, pipe};
    use futures::io::Cursor;
    use futures::{AsyncReadExt as _, AsyncWriteExt as _};
    use proptest::prelude::*;

    const T: Duration = Duration::from_secs(5);

    fn credential() -> Credential {
        Credential {
            claims: vec![7; 32],
            signature: vec![8; 64],
        }
    }

    #[tokio::test]
    async fn each_server_answer_decodes_to_its_answer() {
        let mut cur = Cursor::new(Vec::new());
        write_accepted(&mut cur, T).await.expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            CallAnswer::Accepted
        );
        let mut cur = Cursor::new(Vec::new());
        write_refused(&mut cur, CallRefusal::NotAllowed, "rules".into(), T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            CallAnswer::Refused(CallRefusal::NotAllowed, "rules".into())
        );
    }

    #[test]
    fn an_unknown_refusal_reason_reads_as_unspecified() {
        let resp = CallResponse {
            accepted: false,
            refusal: 9999,
            detail: "?".into(),
        };
        assert_eq!(
            answer(resp),
            CallAnswer::Refused(CallRefusal::Unspecified, "?".into())
        );
    }

    #[test]
    fn requests_round_trip_and_bad_frames_are_refused() {
        let req = request_for("db", credential());
        let bytes = frame::encode(&req);
        assert_eq!(decode_request(&bytes).expect("decode"), req);
        let err = decode_request(&bytes[..bytes.len() - 1]).expect_err("short");
        assert!(matches!(err, FrameError::LengthMismatch { .. }), "{err}");
        let huge = request_for(&"x".repeat(MAX_FRAME_BYTES), credential());
        let err = decode_request(&frame::encode(&huge)).expect_err("over the cap");
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
        // `accepted` (field 1, varint) with a length-delimited wire type.
        let err = decode_response(&[3, 0x0a, 5, 0]).expect_err("garbage");
        assert!(err.is_malformed(), "{err}");
    }

    #[tokio::test]
    async fn an_accepted_call_carries_raw_bytes_after_the_answer() {
        let (mut client, mut server) = pipe();
        let provider = PeerId::random();
        let serve = async {
            let req = read_request(&mut server, T).await.expect("request");
            assert_eq!(req.service, "echo");
            write_accepted(&mut server, T).await.expect("answer");
            let mut buf = [0u8; 5];
            server.read_exact(&mut buf).await.expect("raw bytes");
            server.write_all(&buf).await.expect("echo");
        };
        let call = async {
            let req = request_for("echo", credential());
            let a = exchange(&mut client, provider, &req, T)
                .await
                .expect("exchange");
            client.write_all(b"hello").await.expect("write");
            let mut buf = [0u8; 5];
            client.read_exact(&mut buf).await.expect("read");
            (a, buf)
        };
        let ((a, echoed), ()) = tokio::join!(call, serve);
        assert_eq!(a, CallAnswer::Accepted);
        assert_eq!(&echoed, b"hello");
    }

    #[tokio::test]
    async fn silent_and_closed_providers_fail_as_what_they_are() {
        let provider = PeerId::random();
        let req = request_for("db", credential());
        let err = exchange(&mut Silent, provider, &req, Duration::from_millis(20))
            .await
            .expect_err("nothing answered");
        assert!(err.is_timeout() && !err.is_connection_failure(), "{err}");
        assert!(err.to_string().contains(&provider.to_string()), "{err}");

        let (mut client, server) = pipe();
        drop(server);
        let err = exchange(&mut client, provider, &req, T)
            .await
            .expect_err("closed");
        assert!(err.is_connection_failure() && !err.is_timeout(), "{err}");

        let err = read_request(&mut Silent, Duration::from_millis(20))
            .await
            .expect_err("nothing sent");
        assert!(matches!(err, FrameError::Timeout(_)), "{err}");
    }

    #[tokio::test]
    async fn a_garbage_answer_is_a_frame_error_not_a_refusal() {
        let (mut client, mut server) = pipe();
        let serve = async {
            let _ = read_request(&mut server, T).await.expect("request");
            server.write_all(&[3, 0x0a, 5, 0]).await.expect("garbage");
        };
        let req = request_for("db", credential());
        let (got, ()) = tokio::join!(exchange(&mut client, PeerId::random(), &req, T), serve);
        match got.expect_err("garbage") {
            CallExchangeError::Frame { source, .. } => assert!(source.is_malformed(), "{source}"),
            other => panic!("unexpected {other}"),
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }

        #[test]
        fn any_answer_round_trips(refusal in 1i32..=8, detail in ".{0,64}", accepted in any::<bool>()) {
            let resp = CallResponse { accepted, refusal, detail: detail.clone() };
            let expect = if accepted {
                CallAnswer::Accepted
            } else {
                CallAnswer::Refused(CallRefusal::try_from(refusal).expect("known"), detail)
            };
            prop_assert_eq!(decode_response(&frame::encode(&resp)).expect("decode"), expect);
        }

        #[test]
        fn any_cut_of_a_request_is_an_error(service in ".{0,64}", cut in any::<prop::sample::Index>()) {
            let bytes = frame::encode(&request_for(&service, credential()));
            prop_assert!(decode_request(&bytes[..cut.index(bytes.len())]).is_err());
        }
    }
}
