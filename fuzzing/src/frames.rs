//! One frame through both of our frame decoders: the pure one of
//! `agentmesh-wire` (a whole frame, nothing after it) and its stream reader
//! (`frame::read_frame`) that the programs read streams with. They must agree
//! on every input, and what they decode must survive a round trip.

use std::fmt::Debug;

use agentmesh_wire::frame::{self, FrameError, read_frame};
use futures::executor::block_on;
use futures::io::Cursor;
use prost::Message;

/// A short label for a frame refusal.
pub fn label(e: &FrameError) -> &'static str {
    match e {
        FrameError::Timeout(_) => "timeout",
        FrameError::Io(_) => "io",
        FrameError::BadLength => "bad_length",
        FrameError::TooLarge { .. } => "too_large",
        FrameError::Decode(_) => "decode",
        FrameError::LengthMismatch { .. } => "length_mismatch",
    }
}

/// Checks `pure` (what a protocol's pure decoder made of `data`) against
/// the stream reader on the same bytes with the same cap, then the round
/// trip; returns the message or the refusal's label.
///
/// Panics where they disagree: the pure decoder accepts exactly the frames
/// the stream reader accepts with no byte left over, both refuse the same
/// oversized length, and a decoded message encodes to a frame that decodes
/// to it again.
pub fn check<M>(data: &[u8], max: usize, pure: Result<M, FrameError>) -> Result<M, &'static str>
where
    M: Message + Default + PartialEq + Debug,
{
    let mut cur = Cursor::new(data);
    let streamed = block_on(read_frame::<M, _>(&mut cur, max));
    let left = data.len() - cur.position() as usize;
    match (&pure, &streamed) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "the two decoders read different messages");
            assert_eq!(left, 0, "the pure decoder accepted trailing bytes");
        }
        (Ok(m), Err(e)) => panic!("pure decoder accepted {m:?}, the stream reader refused: {e}"),
        (Err(e), Ok(_)) => assert!(
            left > 0 && matches!(e, FrameError::LengthMismatch { .. }),
            "the stream reader accepted a frame the pure decoder refused ({e}) with {left} bytes left"
        ),
        (Err(a), Err(b)) => {
            if let FrameError::TooLarge { len, .. } = a {
                assert!(
                    matches!(b, FrameError::TooLarge { len: l, .. } if l == len),
                    "pure decoder: {a}; stream reader: {b}"
                );
            }
            if let FrameError::TooLarge { len, .. } = b {
                assert!(
                    matches!(a, FrameError::TooLarge { len: l, .. } if l == len),
                    "pure decoder: {a}; stream reader: {b}"
                );
            }
        }
    }
    let msg = pure.map_err(|e| label(&e))?;
    let again = frame::encode(&msg);
    match frame::decode::<M>(&again, usize::MAX) {
        Ok(m) => assert_eq!(m, msg, "a decoded message does not survive a round trip"),
        Err(e) => panic!("a decoded message re-encodes to a frame that does not decode: {e}"),
    }
    Ok(msg)
}
