//! Length-delimited protobuf frames (unsigned-varint length prefix) with a
//! size cap, over any `futures` stream. A frame over the cap or that does
//! not decode is an error for that stream only.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use prost::Message;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed or closed early.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The length prefix was not a valid varint.
    #[error("bad length prefix")]
    BadLength,
    /// The frame is larger than allowed.
    #[error("frame of {len} bytes exceeds the {max}-byte cap")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Cap in force.
        max: usize,
    },
    /// The bytes are not the expected message.
    #[error("malformed frame: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Reads one length-prefixed frame of at most `max` bytes and decodes it.
pub async fn read_frame<M, S>(stream: &mut S, max: usize) -> Result<M, FrameError>
where
    M: Message + Default,
    S: AsyncRead + Unpin,
{
    let len = read_len(stream).await?;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(M::decode(buf.as_slice())?)
}

/// Encodes `msg` and writes it as one length-prefixed frame, then flushes.
pub async fn write_frame<M, S>(stream: &mut S, msg: &M) -> Result<(), FrameError>
where
    M: Message,
    S: AsyncWrite + Unpin,
{
    let body = msg.encode_to_vec();
    let mut prefix = unsigned_varint::encode::usize_buffer();
    let prefix = unsigned_varint::encode::usize(body.len(), &mut prefix);
    let mut out = Vec::with_capacity(prefix.len() + body.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(&body);
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(())
}

async fn read_len<S: AsyncRead + Unpin>(stream: &mut S) -> Result<usize, FrameError> {
    let mut buf = [0u8; 10];
    for i in 0..buf.len() {
        stream.read_exact(&mut buf[i..=i]).await?;
        if buf[i] & 0x80 == 0 {
            let (len, _) =
                unsigned_varint::decode::usize(&buf[..=i]).map_err(|_| FrameError::BadLength)?;
            return Ok(len);
        }
    }
    Err(FrameError::BadLength)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::mesh::{AuthRequest, Purpose};
    use futures::executor::block_on;
    use futures::io::Cursor;

    #[test]
    fn round_trip() {
        let msg = AuthRequest {
            credential: None,
            purpose: Purpose::Attach as i32,
            attached_routers: vec![vec![1, 2, 3]],
            ..Default::default()
        };
        let mut buf = Cursor::new(Vec::new());
        block_on(write_frame(&mut buf, &msg)).expect("write");
        buf.set_position(0);
        let got: AuthRequest = block_on(read_frame(&mut buf, 1024)).expect("read");
        assert_eq!(got, msg);
    }

    #[test]
    fn oversized_frame_is_refused_before_reading_it() {
        // Prefix says 1 MiB, cap is 64 KiB: refused without allocating.
        let mut prefix = unsigned_varint::encode::usize_buffer();
        let p = unsigned_varint::encode::usize(1 << 20, &mut prefix).to_vec();
        let mut cur = Cursor::new(p);
        let err = block_on(read_frame::<AuthRequest, _>(&mut cur, 64 * 1024))
            .expect_err("oversized frame must be refused");
        assert!(
            matches!(err, FrameError::TooLarge { len: 1048576, .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut cur = Cursor::new(vec![0xff; 12]);
        assert!(block_on(read_frame::<AuthRequest, _>(&mut cur, 1024)).is_err());
        let mut cur = Cursor::new(vec![3, 0xff, 0xff, 0xff]);
        assert!(block_on(read_frame::<AuthRequest, _>(&mut cur, 1024)).is_err());
    }
}
