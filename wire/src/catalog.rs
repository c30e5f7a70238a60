//! `/agentmesh/catalog/1`: the client sends one `CatalogRequest` (publish,
//! withdraw, lookup, or a router's local lookup); the router answers one
//! `CatalogResponse` (an ack, records, or a refusal with its reason).
//!
//! - client: [`request`] (a member publishing, withdrawing or looking up;
//!   a router asking another router for its own members' records), built
//!   from [`publish`], [`withdraw`], [`lookup`] or [`local_lookup`]; a
//!   member telling its router a circuit was upgraded away, [`upgraded`];
//!   [`exchange`] on a stream already open;
//! - server: [`read_request`], then one of [`write_ack`],
//!   [`write_records`], [`write_refused`];
//! - pure decoders: [`decode_request`], [`decode_response`], [`answer`].
//!
//! Requests are capped at [`MAX_FRAME_BYTES`], answers (which carry many
//! signed records) at [`MAX_CATALOG_FRAME_BYTES`].

use std::time::Duration;

use agentmesh_proto::pb::mesh::{
    self as pb, CatalogRequest, CatalogResponse, LookupResult, PublishAck, SignedRecord, Withdraw,
    catalog_request, catalog_response,
};
use agentmesh_proto::protocols::{CATALOG, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_streams::Control;
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use libp2p::PeerId;

use crate::exchange::{Exchange, ExchangeError};
use crate::frame::{self, FrameError};

/// A router's answer to a catalog request.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogAnswer {
    /// A publish or withdraw was taken; the record expires at this instant
    /// (Unix seconds; 0 for a withdraw).
    Ack(i64),
    /// The records a lookup found.
    Records(Vec<SignedRecord>),
    /// Refused, with the reason.
    Refused(String),
}

/// Why a catalog exchange failed (not a refusal: those are answers); the
/// peer is the router.
pub type CatalogError = ExchangeError;

/// A member's request to replace its record with `signed`.
pub fn publish(signed: SignedRecord) -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::Publish(signed)),
    }
}

/// A member's request to drop its record.
pub fn withdraw() -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::Withdraw(Withdraw {})),
    }
}

/// A member's request for at most `limit` providers of `service` anywhere
/// in the mesh (0: as many as the router allows).
pub fn lookup(service: &str, limit: u32) -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::Lookup(pb::Lookup {
            service: service.to_string(),
            limit,
        })),
    }
}

/// A router's request for another router's own members that provide
/// `service`, at most `limit`.
pub fn local_lookup(service: &str, limit: u32) -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::LocalLookup(pb::Lookup {
            service: service.to_string(),
            limit,
        })),
    }
}

/// A member's notice that its circuit through the router with `peer` was
/// replaced by a direct connection (acked, or refused with the reason).
pub fn upgraded(peer: &PeerId) -> CatalogRequest {
    CatalogRequest {
        op: Some(catalog_request::Op::Upgraded(pb::Upgraded {
            peer: peer.to_bytes(),
        })),
    }
}

/// The peer an upgrade notice names; `None` when its bytes are not a
/// PeerId (the router refuses it as malformed).
pub fn upgraded_peer(u: &pb::Upgraded) -> Option<PeerId> {
    agentmesh_proto::protocols::peer_id_from_bytes(&u.peer)
}

/// The answer a response carries; `None` when it names no result.
pub fn answer(resp: CatalogResponse) -> Option<CatalogAnswer> {
    Some(match resp.result? {
        catalog_response::Result::Ack(a) => CatalogAnswer::Ack(a.expires_at_unix_secs),
        catalog_response::Result::Providers(p) => CatalogAnswer::Records(p.records),
        catalog_response::Result::Error(e) => CatalogAnswer::Refused(e.reason),
    })
}

/// Decodes one whole request frame (at most [`MAX_FRAME_BYTES`]).
pub fn decode_request(bytes: &[u8]) -> Result<CatalogRequest, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES)
}

/// Decodes one whole answer frame (at most [`MAX_CATALOG_FRAME_BYTES`]);
/// `Ok(None)` when it names no result.
pub fn decode_response(bytes: &[u8]) -> Result<Option<CatalogAnswer>, FrameError> {
    frame::decode(bytes, MAX_CATALOG_FRAME_BYTES).map(answer)
}

/// Client: opens `/agentmesh/catalog/1` to `router`, sends `request` and
/// reads the answer, all within `deadline`.
pub async fn request(
    mut control: Control,
    router: PeerId,
    request: CatalogRequest,
    deadline: Duration,
) -> Result<CatalogAnswer, CatalogError> {
    let ex = Exchange::new(CATALOG, router);
    ex.within(deadline, async move {
        let mut s = ex.open(&mut control).await?;
        exchange(&mut s, router, &request, deadline).await
    })
    .await
}

/// Client, on a stream to `router` already open: sends `request`, reads
/// the answer and closes, all within `deadline`.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    router: PeerId,
    request: &CatalogRequest,
    deadline: Duration,
) -> Result<CatalogAnswer, CatalogError> {
    let ex = Exchange::new(CATALOG, router);
    ex.within(deadline, async {
        let resp: CatalogResponse = ex
            .ask(s, request, MAX_CATALOG_FRAME_BYTES, deadline)
            .await?;
        let _ = s.close().await;
        answer(resp).ok_or(ex.empty())
    })
    .await
}

/// Server: reads the request (≤ 64 KiB) within `deadline`.
pub async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<CatalogRequest, FrameError> {
    frame::read(s, MAX_FRAME_BYTES, deadline).await
}

/// Server: answers a publish (the record expires at `expires`, Unix
/// seconds) or a withdraw (0).
pub async fn write_ack<S: AsyncWrite + Unpin>(
    s: &mut S,
    expires: i64,
    deadline: Duration,
) -> Result<(), FrameError> {
    let r = catalog_response::Result::Ack(PublishAck {
        expires_at_unix_secs: expires,
    });
    write_result(s, r, deadline).await
}

/// Server: answers a lookup with `records` (the caller keeps them within
/// [`MAX_CATALOG_FRAME_BYTES`]; a larger answer fails at the client).
pub async fn write_records<S: AsyncWrite + Unpin>(
    s: &mut S,
    records: Vec<SignedRecord>,
    deadline: Duration,
) -> Result<(), FrameError> {
    let r = catalog_response::Result::Providers(LookupResult { records });
    write_result(s, r, deadline).await
}

/// Server: refuses, naming the reason.
pub async fn write_refused<S: AsyncWrite + Unpin>(
    s: &mut S,
    reason: String,
    deadline: Duration,
) -> Result<(), FrameError> {
    let r = catalog_response::Result::Error(pb::CatalogError { reason });
    write_result(s, r, deadline).await
}

async fn write_result<S: AsyncWrite + Unpin>(
    s: &mut S,
    result: catalog_response::Result,
    deadline: Duration,
) -> Result<(), FrameError> {
    let resp = CatalogResponse {
        result: Some(result),
    };
    frame::write(s, &resp, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExchangeFailure as _;
    use crate::testing::{Silent, pipe};
    use futures::io::Cursor;
    use proptest::prelude::*;

    const T: Duration = Duration::from_secs(5);

    fn record(n: u8) -> SignedRecord {
        SignedRecord {
            record: vec![n; 40],
            signature: vec![n; 64],
        }
    }

    #[test]
    fn an_upgrade_notice_names_its_peer_and_garbage_names_none() {
        let peer = PeerId::random();
        let req = decode_request(&frame::encode(&upgraded(&peer))).expect("decode");
        let Some(catalog_request::Op::Upgraded(u)) = req.op else {
            panic!("not an upgrade notice: {req:?}");
        };
        assert_eq!(upgraded_peer(&u), Some(peer));
        let garbage = pb::Upgraded {
            peer: vec![0xff; 7],
        };
        assert_eq!(upgraded_peer(&garbage), None);
    }

    #[tokio::test]
    async fn each_server_answer_decodes_to_its_answer() {
        let mut cur = Cursor::new(Vec::new());
        write_ack(&mut cur, 42, T).await.expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(CatalogAnswer::Ack(42))
        );
        let mut cur = Cursor::new(Vec::new());
        write_records(&mut cur, vec![record(1), record(2)], T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(CatalogAnswer::Records(vec![record(1), record(2)]))
        );
        let mut cur = Cursor::new(Vec::new());
        write_refused(&mut cur, "not admitted".into(), T)
            .await
            .expect("write");
        assert_eq!(
            decode_response(cur.get_ref()).expect("decode"),
            Some(CatalogAnswer::Refused("not admitted".into()))
        );
        let empty = frame::encode(&CatalogResponse { result: None });
        assert_eq!(decode_response(&empty).expect("decode"), None);
    }

    #[test]
    fn each_request_round_trips_through_its_frame() {
        for req in [
            publish(record(3)),
            withdraw(),
            lookup("db", 7),
            local_lookup("db", 0),
        ] {
            assert_eq!(decode_request(&frame::encode(&req)).expect("decode"), req);
        }
    }

    #[test]
    fn oversized_truncated_and_trailing_frames_are_refused() {
        // A request the size of a large answer: over the request cap.
        let big = publish(SignedRecord {
            record: vec![0; MAX_FRAME_BYTES],
            signature: Vec::new(),
        });
        let err = decode_request(&frame::encode(&big)).expect_err("over the cap");
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
        // ... yet an answer of that size is within the answer cap.
        let many = CatalogResponse {
            result: Some(catalog_response::Result::Providers(LookupResult {
                records: vec![big_record(); 3],
            })),
        };
        let bytes = frame::encode(&many);
        assert!(bytes.len() > MAX_FRAME_BYTES && bytes.len() < MAX_CATALOG_FRAME_BYTES);
        assert!(matches!(
            decode_response(&bytes),
            Ok(Some(CatalogAnswer::Records(r))) if r.len() == 3
        ));
        let bytes = frame::encode(&lookup("db", 1));
        let err = decode_request(&bytes[..bytes.len() - 1]).expect_err("short");
        assert!(matches!(err, FrameError::LengthMismatch { .. }), "{err}");
        let mut long = bytes.clone();
        long.push(0);
        let err = decode_request(&long).expect_err("trailing byte");
        assert!(matches!(err, FrameError::LengthMismatch { .. }), "{err}");
        // A body that is not a response: field 1 announced as 5 bytes, 1 given.
        let err = decode_response(&[3, 0x0a, 5, 0]).expect_err("garbage");
        assert!(err.is_malformed(), "{err}");
    }

    fn big_record() -> SignedRecord {
        SignedRecord {
            record: vec![1; 30 * 1024],
            signature: vec![2; 64],
        }
    }

    #[tokio::test]
    async fn client_and_server_halves_speak_to_each_other() {
        let (mut client, mut server) = pipe();
        let router = PeerId::random();
        let serve = async {
            let req = read_request(&mut server, T).await.expect("request");
            assert_eq!(req, lookup("db", 2));
            write_records(&mut server, vec![record(9)], T)
                .await
                .expect("answer");
        };
        let req = lookup("db", 2);
        let (got, ()) = tokio::join!(exchange(&mut client, router, &req, T), serve);
        assert_eq!(
            got.expect("exchange"),
            CatalogAnswer::Records(vec![record(9)])
        );
    }

    #[tokio::test]
    async fn an_empty_answer_and_a_silent_router_are_errors() {
        let (mut client, mut server) = pipe();
        let router = PeerId::random();
        let serve = async {
            let _ = read_request(&mut server, T).await.expect("request");
            frame::write(&mut server, &CatalogResponse { result: None }, T)
                .await
                .expect("answer");
        };
        let req = withdraw();
        let (got, ()) = tokio::join!(exchange(&mut client, router, &req, T), serve);
        let err = got.expect_err("empty");
        assert!(matches!(err, CatalogError::Empty { .. }), "{err}");
        assert!(!err.is_timeout() && !err.is_connection_failure());

        let err = exchange(&mut Silent, router, &withdraw(), Duration::from_millis(20))
            .await
            .expect_err("nothing answered");
        assert!(err.is_timeout(), "{err}");
        assert!(err.to_string().contains(&router.to_string()), "{err}");
    }

    #[tokio::test]
    async fn a_server_reading_a_silent_client_times_out() {
        let err = read_request(&mut Silent, Duration::from_millis(20))
            .await
            .expect_err("nothing sent");
        assert!(matches!(err, FrameError::Timeout(_)), "{err}");
    }

    #[tokio::test]
    async fn a_closed_stream_is_a_connection_failure() {
        let (mut client, server) = pipe();
        drop(server);
        let err = exchange(&mut client, PeerId::random(), &withdraw(), T)
            .await
            .expect_err("closed");
        assert!(err.is_connection_failure(), "{err}");
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }

        #[test]
        fn any_lookup_round_trips(service in ".{0,64}", limit in any::<u32>()) {
            let req = lookup(&service, limit);
            prop_assert_eq!(decode_request(&frame::encode(&req)).expect("decode"), req);
        }

        #[test]
        fn any_cut_of_an_answer_is_an_error(records in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..64), proptest::collection::vec(any::<u8>(), 0..64)), 0..8),
            cut in any::<prop::sample::Index>()) {
            let resp = CatalogResponse {
                result: Some(catalog_response::Result::Providers(LookupResult {
                    records: records.into_iter().map(|(record, signature)| SignedRecord { record, signature }).collect(),
                })),
            };
            let bytes = frame::encode(&resp);
            prop_assert_eq!(decode_response(&bytes).expect("whole").map(|a| matches!(a, CatalogAnswer::Records(_))), Some(true));
            let cut = cut.index(bytes.len());
            prop_assert!(decode_response(&bytes[..cut]).is_err());
        }
    }
}
