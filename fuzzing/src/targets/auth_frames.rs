//! `/agentmesh/auth/1`, both directions: every input is read as the
//! `AuthRequest` a router receives and as the `AuthResponse` a member
//! receives, through `agentmesh_wire::auth`'s pure decoders and the stream
//! reader ([`crate::frames::check`]).
//!
//! A request that decodes gets what the router does with it before policy:
//! its purpose, its attached routers parsed as PeerIds, its credential
//! verified against the test trust as presented by `keys::peer(0)` (seeds
//! carry credentials signed with the trusted key, so mutations of the
//! frame around them reach the checks behind the signature).

use agentmesh_proto::pb::mesh::{AuthResponse, Purpose, auth_response};
use agentmesh_proto::protocols::{MAX_FRAME_BYTES, MAX_POLICY_FRAME_BYTES, peer_id_from_bytes};
use agentmesh_wire::auth::{self, AuthOutcome};
use agentmesh_wire::frame;

use crate::Report;
use crate::frames::{self, check};
use crate::targets::credential;

/// Most attached routers a router reads from one request.
const MAX_ATTACHED_ROUTERS: usize = 16;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    match check(data, MAX_FRAME_BYTES, auth::decode_request(data)) {
        Ok(req) => {
            report.push("request", "ok");
            report.push(
                "purpose",
                match Purpose::try_from(req.purpose) {
                    Ok(Purpose::Attach) => "attach",
                    Ok(Purpose::Transit) => "transit",
                    Ok(Purpose::Router) => "router",
                    Ok(Purpose::Unspecified) | Err(_) => "malformed",
                },
            );
            for bytes in req.attached_routers.iter().take(MAX_ATTACHED_ROUTERS) {
                if let Some(p) = peer_id_from_bytes(bytes) {
                    assert_eq!(&p.to_bytes(), bytes, "a PeerId with two encodings");
                }
            }
            match &req.credential {
                Some(c) => report.push("credential", credential::check_member(c)),
                None => report.push("credential", "missing"),
            }
        }
        Err(e) => report.push("request", e),
    }
    // An admission may carry the policy: answers have the larger cap.
    let resp = check::<AuthResponse>(
        data,
        MAX_POLICY_FRAME_BYTES,
        frame::decode(data, MAX_POLICY_FRAME_BYTES),
    );
    let outcome = auth::decode_response(data);
    match (resp, outcome) {
        (Ok(resp), Ok(outcome)) => {
            let label = match (&resp.result, &outcome) {
                (None, None) => "empty",
                (
                    Some(auth_response::Result::Admitted(a)),
                    Some(AuthOutcome::Admitted {
                        until,
                        policy,
                        observed,
                    }),
                ) => {
                    assert_eq!(a.until_unix_secs, *until);
                    assert_eq!(a.policy.as_ref(), policy.as_deref());
                    // An observed address is only ever what the bytes say.
                    if let Some(o) = observed {
                        assert_eq!(o.to_vec(), a.observed_addr);
                    }
                    "admitted"
                }
                (Some(auth_response::Result::Refused(r)), Some(AuthOutcome::Refused(_, d))) => {
                    assert_eq!(r.retry_after_ms, 0);
                    assert_eq!(&r.detail, d);
                    "refused"
                }
                (
                    Some(auth_response::Result::Refused(r)),
                    Some(AuthOutcome::Busy {
                        retry_after,
                        detail,
                    }),
                ) => {
                    assert_eq!(retry_after.as_millis(), u128::from(r.retry_after_ms));
                    assert!(r.retry_after_ms > 0);
                    assert_eq!(&r.detail, detail);
                    "busy"
                }
                (Some(auth_response::Result::GoAway(g)), Some(AuthOutcome::GoAway(h))) => {
                    assert_eq!(g, h);
                    "go_away"
                }
                (r, o) => panic!("answer {r:?} read as {o:?}"),
            };
            report.push("response", label);
        }
        (Err(e), Err(f)) => {
            assert_eq!(e, frames::label(&f));
            report.push("response", e);
        }
        (r, o) => panic!("decode_response disagrees with the frame decoder: {r:?} / {o:?}"),
    }
    report
}
