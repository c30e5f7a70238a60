//! `/agentmesh/goaway/1`: a router tells a member to go elsewhere in one
//! `GoAway` frame (reason, alternatives, how long to stay away); the member
//! answers one `GoAwayAck`.
//!
//! - client (the router): [`send`];
//! - server (the member): [`receive`];
//! - pure decoder: [`decode`].

use std::time::Duration;

use agentmesh_proto::pb::mesh::{GoAway, GoAwayAck};
use agentmesh_proto::protocols::{GOAWAY, MAX_FRAME_BYTES};
use agentmesh_streams::Control;
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use libp2p::PeerId;

use crate::ExchangeFailure;
use crate::frame::{self, FrameError};
use crate::open::{OpenError, open};

/// Why a go-away exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum GoAwayError {
    /// The stream could not be opened.
    #[error("cannot open {GOAWAY}: {0}")]
    Open(#[from] OpenError),
    /// Reading or writing a frame failed.
    #[error("{GOAWAY}: {0}")]
    Frame(#[from] FrameError),
    /// The whole exchange did not end within its deadline.
    #[error("{GOAWAY}: not done within {0:?}")]
    Timeout(Duration),
}

impl ExchangeFailure for GoAwayError {
    fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_) | Self::Frame(FrameError::Timeout(_)))
    }

    fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            Self::Open(OpenError::Connection(_)) | Self::Frame(FrameError::Io(_))
        )
    }
}

/// Decodes one whole `GoAway` frame.
pub fn decode(bytes: &[u8]) -> Result<GoAway, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES)
}

/// Client (router): opens `/agentmesh/goaway/1` to `peer`, writes `msg` and
/// waits for the ack, all within `deadline`.
pub async fn send(
    mut control: Control,
    peer: PeerId,
    msg: &GoAway,
    deadline: Duration,
) -> Result<(), GoAwayError> {
    let exchange = async {
        let mut s = open(&mut control, peer, GOAWAY).await?;
        frame::write(&mut s, msg, deadline).await?;
        let _: GoAwayAck = frame::read(&mut s, MAX_FRAME_BYTES, deadline).await?;
        let _ = s.close().await;
        Ok(())
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| GoAwayError::Timeout(deadline))?
}

/// Server (member): reads the go-away, acknowledges it and closes, all
/// within `deadline`.
pub async fn receive<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<GoAway, GoAwayError> {
    let exchange = async {
        let g: GoAway = frame::read(s, MAX_FRAME_BYTES, deadline).await?;
        frame::write(s, &GoAwayAck {}, deadline).await?;
        let _ = s.close().await;
        Ok(g)
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| GoAwayError::Timeout(deadline))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Silent;
    use agentmesh_proto::pb::mesh::GoAwayReason;
    use proptest::prelude::*;

    #[test]
    fn a_go_away_round_trips_through_its_frame() {
        let g = GoAway {
            reason: GoAwayReason::Draining as i32,
            ..Default::default()
        };
        assert_eq!(decode(&frame::encode(&g)).expect("decode"), g);
    }

    #[tokio::test]
    async fn a_silent_router_times_out() {
        let err = receive(&mut Silent, Duration::from_millis(20))
            .await
            .expect_err("nothing sent");
        assert!(err.is_timeout(), "{err}");
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }
    }
}
