//! `/agentmesh/policy/1`: a router pushes the signed policy and signed
//! revocation list it holds to one member in one `PolicyPush` frame; the
//! member answers one `PolicyAck` with what it holds after it, and the
//! stream closes.
//! One short stream per push, never one held open per member, so a
//! member costs the router nothing between pushes.
//!
//! - client (the router): [`push`];
//! - server (the member): [`receive`] then [`acknowledge`] (the member
//!   checks the push in between, so the ack says what it kept);
//! - pure decoders: [`decode_push`], [`decode_ack`].

use std::time::Duration;

use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush};
use agentmesh_proto::protocols::{MAX_FRAME_BYTES, MAX_POLICY_FRAME_BYTES, POLICY};
use agentmesh_streams::Control;
use futures::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use libp2p::PeerId;

use crate::ExchangeFailure;
use crate::frame::{self, FrameError};
use crate::open::{OpenError, open};

/// Why a policy push failed (an ack that says "ignored" is an answer).
#[derive(Debug, thiserror::Error)]
pub enum PolicyPushError {
    /// The stream could not be opened.
    #[error("cannot open {POLICY}: {0}")]
    Open(#[from] OpenError),
    /// Reading or writing a frame failed.
    #[error("{POLICY}: {0}")]
    Frame(#[from] FrameError),
    /// The whole exchange did not end within its deadline.
    #[error("{POLICY}: not done within {0:?}")]
    Timeout(Duration),
}

impl ExchangeFailure for PolicyPushError {
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

/// Decodes one whole `PolicyPush` frame.
pub fn decode_push(bytes: &[u8]) -> Result<PolicyPush, FrameError> {
    frame::decode(bytes, MAX_POLICY_FRAME_BYTES)
}

/// Decodes one whole `PolicyAck` frame.
pub fn decode_ack(bytes: &[u8]) -> Result<PolicyAck, FrameError> {
    frame::decode(bytes, MAX_FRAME_BYTES)
}

/// Client (router): opens `/agentmesh/policy/1` to `peer`, writes `msg`
/// and returns the member's ack, all within `deadline`.
pub async fn push(
    mut control: Control,
    peer: PeerId,
    msg: &PolicyPush,
    deadline: Duration,
) -> Result<PolicyAck, PolicyPushError> {
    let exchange = async {
        let mut s = open(&mut control, peer, POLICY).await?;
        frame::write(&mut s, msg, deadline).await?;
        let ack: PolicyAck = frame::read(&mut s, MAX_FRAME_BYTES, deadline).await?;
        let _ = s.close().await;
        Ok(ack)
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| PolicyPushError::Timeout(deadline))?
}

/// Server (member): reads the push (≤ [`MAX_POLICY_FRAME_BYTES`]) within
/// `deadline`. A malformed frame is an error for this stream only.
pub async fn receive<S: AsyncRead + Unpin>(
    s: &mut S,
    deadline: Duration,
) -> Result<PolicyPush, FrameError> {
    frame::read(s, MAX_POLICY_FRAME_BYTES, deadline).await
}

/// Server (member): answers with what it holds now and closes.
pub async fn acknowledge<S: AsyncWrite + Unpin>(
    s: &mut S,
    ack: &PolicyAck,
    deadline: Duration,
) -> Result<(), FrameError> {
    frame::write(s, ack, deadline).await?;
    let _ = s.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Silent;
    use agentmesh_proto::pb::credential::{SignedPolicy, SignedRevocations};
    use proptest::prelude::*;

    #[test]
    fn a_push_and_its_ack_round_trip_through_their_frames() {
        let p = PolicyPush {
            policy: Some(SignedPolicy {
                document: vec![1; 300],
                signature: vec![2; 64],
            }),
            revocations: Some(SignedRevocations {
                list: vec![3; 120],
                signature: vec![4; 64],
            }),
        };
        assert_eq!(decode_push(&frame::encode(&p)).expect("push"), p);
        let a = PolicyAck {
            epoch: 3,
            version: 4,
            ignored: "stale".into(),
            revocations_epoch: 3,
            revocations_generation: 9,
            revocations_ignored: "bad_signature".into(),
        };
        assert_eq!(decode_ack(&frame::encode(&a)).expect("ack"), a);
    }

    #[test]
    fn a_push_over_its_cap_is_refused() {
        let p = PolicyPush {
            policy: Some(SignedPolicy {
                document: vec![0; MAX_POLICY_FRAME_BYTES],
                signature: vec![],
            }),
            revocations: None,
        };
        assert!(decode_push(&frame::encode(&p)).is_err());
    }

    #[tokio::test]
    async fn a_silent_router_times_out() {
        let err = receive(&mut Silent, Duration::from_millis(20))
            .await
            .expect_err("nothing sent");
        assert!(matches!(err, FrameError::Timeout(_)), "{err}");
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_push(&bytes);
            let _ = decode_ack(&bytes);
        }
    }
}
