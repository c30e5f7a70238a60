//! `/agentmesh/call/1`, both directions: every input is read as the
//! `CallRequest` a provider receives and as the `CallResponse` a caller
//! receives (≤ 64 KiB each), through `agentmesh_wire::call`'s pure decoders
//! and the stream reader ([`crate::frames::check`]); the typed answer
//! `decode_response` gives must be the one the message says.
//!
//! A request's credential is verified as presented by `keys::peer(0)`
//! ([`credential::check_member`]); an answer's refusal is read the way the
//! caller reads it (unknown reasons as unspecified).

use agentmesh_proto::pb::mesh::{CallRefusal, CallRequest, CallResponse};
use agentmesh_proto::protocols::MAX_FRAME_BYTES;
use agentmesh_wire::call::{self, CallAnswer};
use agentmesh_wire::frame;

use crate::Report;
use crate::frames::{self, check};
use crate::targets::credential;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    match check::<CallRequest>(data, MAX_FRAME_BYTES, call::decode_request(data)) {
        Ok(req) => {
            report.push("request", "ok");
            match &req.credential {
                Some(c) => report.push("credential", credential::check_member(c)),
                None => report.push("credential", "missing"),
            }
        }
        Err(e) => report.push("request", e),
    }
    let resp = check::<CallResponse>(data, MAX_FRAME_BYTES, frame::decode(data, MAX_FRAME_BYTES));
    match (resp, call::decode_response(data)) {
        (Ok(resp), Ok(answer)) => {
            // The model: accepted wins; otherwise the refusal as a known
            // reason (an unknown number reads as unspecified) and its detail.
            let expected = if resp.accepted {
                CallAnswer::Accepted
            } else {
                let reason =
                    CallRefusal::try_from(resp.refusal).unwrap_or(CallRefusal::Unspecified);
                CallAnswer::Refused(reason, resp.detail.clone())
            };
            assert_eq!(
                answer, expected,
                "decode_response disagrees with the message"
            );
            let label = match answer {
                CallAnswer::Accepted => "accepted",
                CallAnswer::Refused(CallRefusal::Unspecified, _) => "refused_unspecified",
                CallAnswer::Refused(..) => "refused",
            };
            report.push("response", label);
        }
        (Err(e), Err(f)) => {
            assert_eq!(e, frames::label(&f));
            report.push("response", e);
        }
        (r, a) => panic!("decode_response disagrees with the frame decoder: {r:?} / {a:?}"),
    }
    report
}
