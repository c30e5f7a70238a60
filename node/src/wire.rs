//! Our protocol exchanges as the node speaks them: open a stream, write one
//! frame, read one frame. Every exchange is bounded by the caller's deadline
//! and the frame caps of `agentmesh_proto::protocols`.

use std::time::Duration;

use agentmesh_proto::framing::{FrameError, read_frame, write_frame};
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{
    AuthRefusal, AuthRequest, AuthResponse, CallRequest, CallResponse, CatalogRequest,
    CatalogResponse, GoAway, Purpose, auth_response,
};
use agentmesh_proto::protocols::{AUTH, CALL, CATALOG, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_streams::Control;
use futures::AsyncWriteExt as _;
use libp2p::{PeerId, Stream, StreamProtocol};

/// Why an exchange failed (not a refusal: those are answers).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The stream could not be opened: the peer does not speak the protocol.
    #[error("cannot open {protocol} to {peer}: {detail}")]
    Open {
        /// Protocol id.
        protocol: &'static str,
        /// Remote.
        peer: PeerId,
        /// What went wrong.
        detail: String,
    },
    /// The connection under the stream failed (closed, reset, not
    /// connected): a fresh connection may succeed where this one did not.
    #[error("cannot open {protocol} to {peer}: connection failed: {detail}")]
    Connection {
        /// Protocol id.
        protocol: &'static str,
        /// Remote.
        peer: PeerId,
        /// What went wrong.
        detail: String,
    },
    /// Reading or writing a frame failed.
    #[error("{protocol} with {peer}: {source}")]
    Frame {
        /// Protocol id.
        protocol: &'static str,
        /// Remote.
        peer: PeerId,
        /// The framing error.
        source: FrameError,
    },
    /// The deadline passed.
    #[error("{protocol} with {peer}: no answer within {after:?}")]
    Timeout {
        /// Protocol id.
        protocol: &'static str,
        /// Remote.
        peer: PeerId,
        /// The deadline (a step's timeout, or what was left of a call's budget).
        after: Duration,
    },
    /// The answer was well-formed but empty or unexpected.
    #[error("{protocol} with {peer}: {what}")]
    Unexpected {
        /// Protocol id.
        protocol: &'static str,
        /// Remote.
        peer: PeerId,
        /// What was wrong.
        what: &'static str,
    },
}

impl WireError {
    /// Whether the connection (or the stream on it) failed rather than the
    /// peer answering: closed, reset or other I/O before an answer. Such a
    /// failure says nothing about the peer's will; a retry on a fresh
    /// connection or route may succeed.
    pub fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            Self::Connection { .. }
                | Self::Frame {
                    source: FrameError::Io(_),
                    ..
                }
        )
    }
}

/// A router's answer to an auth request.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthOutcome {
    /// Admitted until this instant (Unix seconds).
    Admitted(i64),
    /// Refused, with the reason and detail.
    Refused(AuthRefusal, String),
    /// Go elsewhere.
    GoAway(GoAway),
}

async fn open(
    control: &mut Control,
    peer: PeerId,
    protocol: &'static str,
) -> Result<Stream, WireError> {
    control
        .open_stream(peer, StreamProtocol::new(protocol))
        .await
        .map_err(|e| match e {
            agentmesh_streams::OpenStreamError::Io(e) => WireError::Connection {
                protocol,
                peer,
                detail: e.to_string(),
            },
            other => WireError::Open {
                protocol,
                peer,
                detail: other.to_string(),
            },
        })
}

async fn with_deadline<T>(
    deadline: Duration,
    protocol: &'static str,
    peer: PeerId,
    fut: impl Future<Output = Result<T, WireError>>,
) -> Result<T, WireError> {
    tokio::time::timeout(deadline, fut)
        .await
        .map_err(|_| WireError::Timeout {
            protocol,
            peer,
            after: deadline,
        })?
}

fn frame_err(protocol: &'static str, peer: PeerId) -> impl FnOnce(FrameError) -> WireError {
    move |source| WireError::Frame {
        protocol,
        peer,
        source,
    }
}

/// Runs `/agentmesh/auth/1` with `router`.
pub async fn auth(
    mut control: Control,
    router: PeerId,
    credential: Credential,
    purpose: Purpose,
    attached: Vec<PeerId>,
    deadline: Duration,
) -> Result<AuthOutcome, WireError> {
    with_deadline(deadline, AUTH, router, async move {
        let mut s = open(&mut control, router, AUTH).await?;
        let req = AuthRequest {
            credential: Some(credential),
            purpose: purpose as i32,
            attached_routers: attached.iter().map(|p| p.to_bytes()).collect(),
        };
        write_frame(&mut s, &req)
            .await
            .map_err(frame_err(AUTH, router))?;
        let resp: AuthResponse = read_frame(&mut s, MAX_FRAME_BYTES)
            .await
            .map_err(frame_err(AUTH, router))?;
        let _ = s.close().await;
        match resp.result {
            Some(auth_response::Result::Admitted(a)) => {
                Ok(AuthOutcome::Admitted(a.until_unix_secs))
            }
            Some(auth_response::Result::Refused(r)) => Ok(AuthOutcome::Refused(
                AuthRefusal::try_from(r.reason).unwrap_or(AuthRefusal::Unspecified),
                r.detail,
            )),
            Some(auth_response::Result::GoAway(g)) => Ok(AuthOutcome::GoAway(g)),
            None => Err(WireError::Unexpected {
                protocol: AUTH,
                peer: router,
                what: "empty auth response",
            }),
        }
    })
    .await
}

/// Runs one `/agentmesh/catalog/1` exchange with `router`.
pub async fn catalog(
    mut control: Control,
    router: PeerId,
    request: CatalogRequest,
    deadline: Duration,
) -> Result<CatalogResponse, WireError> {
    with_deadline(deadline, CATALOG, router, async move {
        let mut s = open(&mut control, router, CATALOG).await?;
        write_frame(&mut s, &request)
            .await
            .map_err(frame_err(CATALOG, router))?;
        let resp: CatalogResponse = read_frame(&mut s, MAX_CATALOG_FRAME_BYTES)
            .await
            .map_err(frame_err(CATALOG, router))?;
        let _ = s.close().await;
        Ok(resp)
    })
    .await
}

/// Opens `/agentmesh/call/1` to `provider` and runs the request/response.
/// On acceptance the stream is returned ready for raw bytes.
pub async fn call(
    mut control: Control,
    provider: PeerId,
    service: &str,
    credential: Credential,
    deadline: Duration,
) -> Result<(CallResponse, Stream), WireError> {
    with_deadline(deadline, CALL, provider, async move {
        let mut s = open(&mut control, provider, CALL).await?;
        let req = CallRequest {
            service: service.to_string(),
            credential: Some(credential),
        };
        write_frame(&mut s, &req)
            .await
            .map_err(frame_err(CALL, provider))?;
        let resp: CallResponse = read_frame(&mut s, MAX_FRAME_BYTES)
            .await
            .map_err(frame_err(CALL, provider))?;
        Ok((resp, s))
    })
    .await
}
