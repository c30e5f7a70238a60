//! Our protocol exchanges as the node speaks them: open a stream, write one
//! frame, read one frame. Every exchange is bounded by the caller's deadline
//! and the frame caps of `agentmesh_proto::protocols`.

use std::time::Duration;

use agentmesh_proto::framing::{FrameError, read_frame, write_frame};
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{CallRequest, CallResponse, CatalogRequest, CatalogResponse};
use agentmesh_proto::protocols::{CALL, CATALOG, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use agentmesh_streams::Control;
use agentmesh_wire::ExchangeFailure;
use agentmesh_wire::open::OpenError;
use futures::AsyncWriteExt as _;
use libp2p::{PeerId, Stream};

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

impl ExchangeFailure for WireError {
    fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// Closed, reset or other I/O before an answer: says nothing about the
    /// peer's will.
    fn is_connection_failure(&self) -> bool {
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

async fn open(
    control: &mut Control,
    peer: PeerId,
    protocol: &'static str,
) -> Result<Stream, WireError> {
    agentmesh_wire::open::open(control, peer, protocol)
        .await
        .map_err(|e| match e {
            OpenError::Connection(detail) => WireError::Connection {
                protocol,
                peer,
                detail,
            },
            OpenError::Unsupported(detail) | OpenError::Refused(detail) => WireError::Open {
                protocol,
                peer,
                detail,
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
