//! `/agentmesh/catalog/1`, both directions: every input is read as the
//! `CatalogRequest` a router receives (≤ 64 KiB) and as the
//! `CatalogResponse` a member or router receives (≤ 256 KiB), through
//! `agentmesh_wire::catalog`'s pure decoders and the stream reader
//! ([`crate::frames::check`]); the typed answer `decode_response` gives
//! must be the one the message says.
//!
//! A published record and every record of a lookup answer go through
//! `record::verify_record` at [`keys::NOW`] ([`record::check`]); seeds
//! carry records signed by `keys::peers()[0]`.

use agentmesh_proto::pb::mesh::{CatalogRequest, CatalogResponse, catalog_request};
use agentmesh_proto::protocols::{MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_wire::catalog::{self, CatalogAnswer};
use agentmesh_wire::frame;

use crate::Report;
use crate::frames::{self, check};
use crate::keys;
use crate::targets::record;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    let req = check::<CatalogRequest>(data, MAX_FRAME_BYTES, catalog::decode_request(data));
    match req.map(|r| r.op) {
        Ok(Some(catalog_request::Op::Publish(signed))) => {
            report.push("request", "publish");
            report.push("record", record::check(&signed, keys::NOW));
        }
        Ok(Some(catalog_request::Op::Withdraw(_))) => report.push("request", "withdraw"),
        Ok(Some(catalog_request::Op::Lookup(_))) => report.push("request", "lookup"),
        Ok(Some(catalog_request::Op::LocalLookup(_))) => report.push("request", "local_lookup"),
        Ok(Some(catalog_request::Op::Upgraded(u))) => report.push(
            "request",
            if catalog::upgraded_peer(&u).is_some() {
                "upgraded"
            } else {
                "upgraded_malformed"
            },
        ),
        Ok(None) => report.push("request", "empty"),
        Err(e) => report.push("request", e),
    }
    let resp = check::<CatalogResponse>(
        data,
        MAX_CATALOG_FRAME_BYTES,
        frame::decode(data, MAX_CATALOG_FRAME_BYTES),
    );
    match (resp, catalog::decode_response(data)) {
        (Ok(resp), Ok(answer)) => {
            assert_eq!(
                catalog::answer(resp),
                answer,
                "decode_response disagrees with the message"
            );
            let label = match answer {
                None => "empty",
                Some(CatalogAnswer::Ack(_)) => "ack",
                Some(CatalogAnswer::Refused(_)) => "error",
                Some(CatalogAnswer::Records(records)) => {
                    for signed in &records {
                        report.push("record", record::check(signed, keys::NOW));
                    }
                    "providers"
                }
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
