//! Frames of `/agentmesh/catalog/1`: one `CatalogRequest`, one `CatalogResponse`.

use std::time::Duration;

use agentmesh_proto::pb::mesh::{
    CatalogError, CatalogRequest, CatalogResponse, LookupResult, PublishAck, SignedRecord,
    catalog_response,
};
use agentmesh_proto::protocols::{MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use futures::{AsyncRead, AsyncWrite};

use agentmesh_wire::frame::{self as frames, FrameError as WireError};

/// Reads a request (≤ 64 KiB) within `deadline`.
pub(crate) async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<CatalogRequest, WireError> {
    frames::read(s, MAX_FRAME_BYTES, deadline).await
}

/// Answers a publish or withdraw.
pub(crate) async fn write_ack<S: AsyncWrite + Unpin>(
    s: &mut S,
    expires: i64,
    deadline: Duration,
) -> Result<(), WireError> {
    let r = catalog_response::Result::Ack(PublishAck {
        expires_at_unix_secs: expires,
    });
    frames::write(s, &CatalogResponse { result: Some(r) }, deadline).await
}

/// Answers a lookup.
pub(crate) async fn write_records<S: AsyncWrite + Unpin>(
    s: &mut S,
    records: Vec<SignedRecord>,
    deadline: Duration,
) -> Result<(), WireError> {
    let r = catalog_response::Result::Providers(LookupResult { records });
    frames::write(s, &CatalogResponse { result: Some(r) }, deadline).await
}

/// Answers with an error naming the reason.
pub(crate) async fn write_error<S: AsyncWrite + Unpin>(
    s: &mut S,
    reason: String,
    deadline: Duration,
) -> Result<(), WireError> {
    let r = catalog_response::Result::Error(CatalogError { reason });
    frames::write(s, &CatalogResponse { result: Some(r) }, deadline).await
}

/// Client side: sends `req`, reads the answer (≤ 256 KiB).
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: &CatalogRequest,
    deadline: Duration,
) -> Result<CatalogResponse, WireError> {
    frames::write(s, req, deadline).await?;
    frames::read(s, MAX_CATALOG_FRAME_BYTES, deadline).await
}
