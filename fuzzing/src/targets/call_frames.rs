//! `/agentmesh/call/1`, both directions: every input is read as the
//! `CallRequest` a provider receives and as the `CallResponse` a caller
//! receives (≤ 64 KiB each), through the pure frame decoder and the stream
//! reader.
//!
//! A request's credential is verified as presented by `keys::peer(0)`
//! ([`credential::check_member`]); an answer's refusal is read the way the
//! caller reads it (unknown reasons as unspecified).

use agentmesh_proto::pb::mesh::{CallRefusal, CallRequest, CallResponse};
use agentmesh_proto::protocols::MAX_FRAME_BYTES;
use agentmesh_wire::frame;

use crate::Report;
use crate::frames::check;
use crate::targets::credential;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    match check::<CallRequest>(data, MAX_FRAME_BYTES, frame::decode(data, MAX_FRAME_BYTES)) {
        Ok(req) => {
            report.push("request", "ok");
            match &req.credential {
                Some(c) => report.push("credential", credential::check_member(c)),
                None => report.push("credential", "missing"),
            }
        }
        Err(e) => report.push("request", e),
    }
    match check::<CallResponse>(data, MAX_FRAME_BYTES, frame::decode(data, MAX_FRAME_BYTES)) {
        Ok(resp) if resp.accepted => report.push("response", "accepted"),
        Ok(resp) => report.push(
            "response",
            match CallRefusal::try_from(resp.refusal).unwrap_or(CallRefusal::Unspecified) {
                CallRefusal::Unspecified => "refused_unspecified",
                _ => "refused",
            },
        ),
        Err(e) => report.push("response", e),
    }
    report
}
