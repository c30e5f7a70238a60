//! The client half that auth, catalog and call share: open a stream of the
//! protocol to a peer, write one request, read one answer, all within one
//! deadline; and the one error type that says which of those steps failed,
//! naming the protocol and the peer. Each protocol's module keeps what is
//! its own: the messages, the frame caps and what an answer means.

use std::future::Future;
use std::time::Duration;

use agentmesh_streams::{ConnectionInfo, Control};
use futures::{AsyncRead, AsyncWrite};
use libp2p::{PeerId, Stream};
use prost::Message;

use crate::ExchangeFailure;
use crate::frame::{self, FrameError};
use crate::open::{OpenError, open_with_info};

/// Why a client exchange failed (not a refusal: those are answers). Each
/// variant names the protocol and the peer (a router, or a call's
/// provider).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The stream could not be opened.
    #[error("cannot open {protocol} to {peer}: {source}")]
    Open {
        /// The protocol.
        protocol: &'static str,
        /// The peer.
        peer: PeerId,
        /// What went wrong.
        source: OpenError,
    },
    /// Reading or writing a frame failed.
    #[error("{protocol} with {peer}: {source}")]
    Frame {
        /// The protocol.
        protocol: &'static str,
        /// The peer.
        peer: PeerId,
        /// The framing error.
        source: FrameError,
    },
    /// The deadline passed.
    #[error("{protocol} with {peer}: no answer within {after:?}")]
    Timeout {
        /// The protocol.
        protocol: &'static str,
        /// The peer.
        peer: PeerId,
        /// The deadline (a step's timeout, or what was left of a call's
        /// budget).
        after: Duration,
    },
    /// The answer was well-formed but names no result.
    #[error("{protocol} with {peer}: empty response")]
    Empty {
        /// The protocol.
        protocol: &'static str,
        /// The peer.
        peer: PeerId,
    },
}

impl ExchangeFailure for ExchangeError {
    /// The whole exchange's deadline, or one frame's.
    fn is_timeout(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. }
                | Self::Frame {
                    source: FrameError::Timeout(_),
                    ..
                }
        )
    }

    /// Closed, reset or other I/O before an answer: says nothing about the
    /// peer's will.
    fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            Self::Open {
                source: OpenError::Connection(_),
                ..
            } | Self::Frame {
                source: FrameError::Io(_),
                ..
            }
        )
    }
}

/// One client exchange of `protocol` with `peer`: the steps, each failing
/// as the [`ExchangeError`] that names both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange {
    protocol: &'static str,
    peer: PeerId,
}

impl Exchange {
    /// An exchange of `protocol` with `peer`.
    pub(crate) fn new(protocol: &'static str, peer: PeerId) -> Self {
        Self { protocol, peer }
    }

    /// Runs `steps` within `deadline`; past it, [`ExchangeError::Timeout`].
    pub(crate) async fn within<T>(
        self,
        deadline: Duration,
        steps: impl Future<Output = Result<T, ExchangeError>>,
    ) -> Result<T, ExchangeError> {
        tokio::time::timeout(deadline, steps)
            .await
            .map_err(|_| ExchangeError::Timeout {
                protocol: self.protocol,
                peer: self.peer,
                after: deadline,
            })?
    }

    /// Opens a stream of the protocol to the peer.
    pub(crate) async fn open(self, control: &mut Control) -> Result<Stream, ExchangeError> {
        self.open_with_info(control).await.map(|(_, s)| s)
    }

    /// [`Exchange::open`], also saying which connection carries the stream
    /// (a call counts itself against it, so a draining router's connection
    /// lingers while the call lives).
    pub(crate) async fn open_with_info(
        self,
        control: &mut Control,
    ) -> Result<(ConnectionInfo, Stream), ExchangeError> {
        open_with_info(control, self.peer, self.protocol)
            .await
            .map_err(|source| ExchangeError::Open {
                protocol: self.protocol,
                peer: self.peer,
                source,
            })
    }

    /// Writes `request` and reads the answer (at most `max` bytes), each
    /// frame within `deadline`.
    pub(crate) async fn ask<Req, Resp, S>(
        self,
        s: &mut S,
        request: &Req,
        max: usize,
        deadline: Duration,
    ) -> Result<Resp, ExchangeError>
    where
        Req: Message,
        Resp: Message + Default,
        S: AsyncRead + AsyncWrite + Unpin,
    {
        frame::write_then_read(s, request, max, deadline)
            .await
            .map_err(|source| ExchangeError::Frame {
                protocol: self.protocol,
                peer: self.peer,
                source,
            })
    }

    /// The error for an answer that names no result.
    pub(crate) fn empty(self) -> ExchangeError {
        ExchangeError::Empty {
            protocol: self.protocol,
            peer: self.peer,
        }
    }
}
