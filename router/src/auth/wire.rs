//! Frames of `/agentmesh/auth/1`: one `AuthRequest`, one `AuthResponse`.

use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthRequest, AuthResponse, auth_response};
use agentmesh_proto::protocols::MAX_FRAME_BYTES;
use futures::{AsyncRead, AsyncWrite};

use super::Refusal;
use crate::frames::{self, WireError};

/// Reads the request (≤ 64 KiB) within `deadline`.
pub(crate) async fn read_request<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<AuthRequest, WireError> {
    frames::read(s, MAX_FRAME_BYTES, deadline).await
}

/// Answers "admitted until `until`".
pub(crate) async fn write_admitted<S: AsyncWrite + Unpin>(
    s: &mut S,
    until: i64,
    deadline: Duration,
) -> Result<(), WireError> {
    let resp = AuthResponse {
        result: Some(auth_response::Result::Admitted(
            agentmesh_proto::pb::mesh::Admitted {
                until_unix_secs: until,
            },
        )),
    };
    frames::write(s, &resp, deadline).await
}

/// Answers with a refusal and its reason.
pub(crate) async fn write_refused<S: AsyncWrite + Unpin>(
    s: &mut S,
    refusal: &Refusal,
    deadline: Duration,
) -> Result<(), WireError> {
    let resp = AuthResponse {
        result: Some(auth_response::Result::Refused(
            agentmesh_proto::pb::mesh::Refused {
                reason: refusal.reason as i32,
                detail: refusal.detail.clone(),
            },
        )),
    };
    frames::write(s, &resp, deadline).await
}

/// Answers with a go-away instead of an admission.
pub(crate) async fn write_go_away<S: AsyncWrite + Unpin>(
    s: &mut S,
    go_away: agentmesh_proto::pb::mesh::GoAway,
    deadline: Duration,
) -> Result<(), WireError> {
    let resp = AuthResponse {
        result: Some(auth_response::Result::GoAway(go_away)),
    };
    frames::write(s, &resp, deadline).await
}

/// Client side: sends `req` and reads the answer.
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    req: &AuthRequest,
    deadline: Duration,
) -> Result<AuthResponse, WireError> {
    frames::write(s, req, deadline).await?;
    frames::read(s, MAX_FRAME_BYTES, deadline).await
}
