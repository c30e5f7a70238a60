//! `/agentmesh/catalog/1`, both directions: every input is read as the
//! `CatalogRequest` a router receives (≤ 64 KiB) and as the
//! `CatalogResponse` a member or router receives (≤ 256 KiB), through the
//! pure frame decoder and the stream reader.
//!
//! A published record and every record of a lookup answer go through
//! `record::verify_record` at [`keys::NOW`] ([`record::check`]); seeds
//! carry records signed by `keys::peers()[0]`.

use agentmesh_proto::pb::mesh::{
    CatalogRequest, CatalogResponse, catalog_request, catalog_response,
};
use agentmesh_proto::protocols::{MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_wire::frame;

use crate::Report;
use crate::frames::check;
use crate::keys;
use crate::targets::record;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    let req = check::<CatalogRequest>(data, MAX_FRAME_BYTES, frame::decode(data, MAX_FRAME_BYTES));
    match req.map(|r| r.op) {
        Ok(Some(catalog_request::Op::Publish(signed))) => {
            report.push("request", "publish");
            report.push("record", record::check(&signed, keys::NOW));
        }
        Ok(Some(catalog_request::Op::Withdraw(_))) => report.push("request", "withdraw"),
        Ok(Some(catalog_request::Op::Lookup(_))) => report.push("request", "lookup"),
        Ok(Some(catalog_request::Op::LocalLookup(_))) => report.push("request", "local_lookup"),
        Ok(None) => report.push("request", "empty"),
        Err(e) => report.push("request", e),
    }
    let resp = check::<CatalogResponse>(
        data,
        MAX_CATALOG_FRAME_BYTES,
        frame::decode(data, MAX_CATALOG_FRAME_BYTES),
    );
    match resp.map(|r| r.result) {
        Ok(Some(catalog_response::Result::Ack(_))) => report.push("response", "ack"),
        Ok(Some(catalog_response::Result::Providers(found))) => {
            report.push("response", "providers");
            for signed in &found.records {
                report.push("record", record::check(signed, keys::NOW));
            }
        }
        Ok(Some(catalog_response::Result::Error(_))) => report.push("response", "error"),
        Ok(None) => report.push("response", "empty"),
        Err(e) => report.push("response", e),
    }
    report
}
