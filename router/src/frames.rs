//! Framed reads and writes with a deadline each, for our own protocols.

use std::time::Duration;

use agentmesh_proto::framing::{FrameError, read_frame, write_frame};
use futures::{AsyncRead, AsyncWrite};
use prost::Message;

/// Why a frame exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer did not send or accept a frame in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The frame was malformed, oversized or the stream failed.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

impl WireError {
    /// Whether the peer sent bytes that are not the expected message.
    pub(crate) fn is_malformed(&self) -> bool {
        matches!(
            self,
            Self::Frame(
                FrameError::Decode(_) | FrameError::TooLarge { .. } | FrameError::BadLength
            )
        )
    }
}

/// Reads one frame of at most `max` bytes within `deadline`.
pub(crate) async fn read<M, S>(s: &mut S, max: usize, deadline: Duration) -> Result<M, WireError>
where
    M: Message + Default,
    S: AsyncRead + Unpin,
{
    tokio::time::timeout(deadline, read_frame(s, max))
        .await
        .map_err(|_| WireError::Timeout(deadline))?
        .map_err(WireError::from)
}

/// Writes one frame within `deadline`.
pub(crate) async fn write<M, S>(s: &mut S, msg: &M, deadline: Duration) -> Result<(), WireError>
where
    M: Message,
    S: AsyncWrite + Unpin,
{
    tokio::time::timeout(deadline, write_frame(s, msg))
        .await
        .map_err(|_| WireError::Timeout(deadline))?
        .map_err(WireError::from)
}
