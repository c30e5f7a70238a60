//! One length-prefixed protobuf frame (unsigned-varint length, then the
//! message) with a size cap, read or written within a deadline. A frame over
//! the cap or that does not decode is an error for that stream only.

use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use prost::Message;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer did not send or accept the frame in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
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
    /// Bytes follow the frame, or the frame ends before its announced length.
    #[error("frame of {announced} bytes carries {actual}")]
    LengthMismatch {
        /// Length the prefix announced.
        announced: usize,
        /// Bytes present after the prefix.
        actual: usize,
    },
}

impl FrameError {
    /// Whether the peer sent bytes that are not the expected message.
    pub fn is_malformed(&self) -> bool {
        matches!(
            self,
            Self::Decode(_) | Self::TooLarge { .. } | Self::BadLength | Self::LengthMismatch { .. }
        )
    }
}

/// Decodes one whole frame (prefix and body, nothing after) of at most
/// `max` body bytes. Pure: the same check the stream reader makes.
pub fn decode<M: Message + Default>(bytes: &[u8], max: usize) -> Result<M, FrameError> {
    let (len, body) = unsigned_varint::decode::usize(bytes).map_err(|_| FrameError::BadLength)?;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    if body.len() != len {
        return Err(FrameError::LengthMismatch {
            announced: len,
            actual: body.len(),
        });
    }
    Ok(M::decode(body)?)
}

/// Encodes `msg` as one frame (the inverse of [`decode`]).
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut prefix = unsigned_varint::encode::usize_buffer();
    let prefix = unsigned_varint::encode::usize(body.len(), &mut prefix);
    let mut out = Vec::with_capacity(prefix.len() + body.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(&body);
    out
}

/// Reads one length-prefixed frame of at most `max` bytes and decodes it,
/// with no deadline of its own (the caller bounds it; [`read`] does). An
/// announced length over `max` is refused before a byte of the body is
/// read or allocated.
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

/// Encodes `msg` and writes it as one frame, then flushes, with no
/// deadline of its own (the caller bounds it; [`write`] does).
pub async fn write_frame<M, S>(stream: &mut S, msg: &M) -> Result<(), FrameError>
where
    M: Message,
    S: AsyncWrite + Unpin,
{
    stream.write_all(&encode(msg)).await?;
    stream.flush().await?;
    Ok(())
}

/// Reads the varint length prefix, one byte at a time (never past it).
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

/// Reads one frame of at most `max` bytes within `deadline`.
pub async fn read<M, S>(s: &mut S, max: usize, deadline: Duration) -> Result<M, FrameError>
where
    M: Message + Default,
    S: AsyncRead + Unpin,
{
    tokio::time::timeout(deadline, read_frame(s, max))
        .await
        .map_err(|_| FrameError::Timeout(deadline))?
}

/// Writes one frame (and flushes) within `deadline`.
pub async fn write<M, S>(s: &mut S, msg: &M, deadline: Duration) -> Result<(), FrameError>
where
    M: Message,
    S: AsyncWrite + Unpin,
{
    tokio::time::timeout(deadline, write_frame(s, msg))
        .await
        .map_err(|_| FrameError::Timeout(deadline))?
}

/// What a client's read of the answer fails with when the stream ended
/// before a byte of it: the peer refused the stream (or the connection
/// closed). Members open streams optimistically (multistream-select
/// `V1Lazy`), so a stream the peer refused during negotiation fails here,
/// at the first read, not at the open; a peer that does not speak the
/// protocol answers `na` instead (read as "protocol negotiation failed").
pub const CLOSED_UNANSWERED: &str = "the peer closed the stream without answering: it refused \
     the stream (a router refuses streams past its budgets during negotiation, counted in \
     its agentmesh_router_refused_total) or the connection closed";

/// A client's half of one exchange: writes `request`, then reads the answer
/// (at most `max` bytes). The outer deadline of each protocol's client
/// bounds both; each frame gets the whole `deadline`. A stream that ends
/// before a byte of the answer fails as `Io(UnexpectedEof)` saying
/// [`CLOSED_UNANSWERED`].
pub async fn write_then_read<Req, Resp, S>(
    s: &mut S,
    request: &Req,
    max: usize,
    deadline: Duration,
) -> Result<Resp, FrameError>
where
    Req: Message,
    Resp: Message + Default,
    S: AsyncRead + AsyncWrite + Unpin,
{
    write(s, request, deadline).await?;
    let mut counted = CountRead { inner: s, read: 0 };
    match read(&mut counted, max, deadline).await {
        Err(FrameError::Io(e))
            if counted.read == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Err(FrameError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                CLOSED_UNANSWERED,
            )))
        }
        other => other,
    }
}

/// Counts the bytes read through it.
struct CountRead<'a, S> {
    inner: &'a mut S,
    read: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for CountRead<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut *this.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = polled {
            this.read += n;
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Silent;
    use agentmesh_proto::pb::mesh::{AuthRequest, Purpose};
    use futures::executor::block_on;
    use futures::io::Cursor;
    use proptest::prelude::*;

    fn sample() -> AuthRequest {
        AuthRequest {
            credential: None,
            purpose: Purpose::Attach as i32,
            attached_routers: vec![vec![1, 2, 3]],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn stream_and_pure_decoder_agree() {
        let mut cur = Cursor::new(Vec::new());
        write(&mut cur, &sample(), Duration::from_secs(1))
            .await
            .expect("write");
        let bytes = cur.get_ref().clone();
        assert_eq!(bytes, encode(&sample()));
        assert_eq!(
            decode::<AuthRequest>(&bytes, 1024).expect("decode"),
            sample()
        );
        cur.set_position(0);
        let got: AuthRequest = read(&mut cur, 1024, Duration::from_secs(1))
            .await
            .expect("read");
        assert_eq!(got, sample());
    }

    #[test]
    fn oversized_and_truncated_frames_are_refused() {
        let bytes = encode(&sample());
        let err = decode::<AuthRequest>(&bytes, 2).expect_err("over the cap");
        assert!(matches!(err, FrameError::TooLarge { max: 2, .. }), "{err}");
        assert!(err.is_malformed());
        let err = decode::<AuthRequest>(&bytes[..bytes.len() - 1], 1024).expect_err("short");
        assert!(matches!(err, FrameError::LengthMismatch { .. }), "{err}");
    }

    #[tokio::test]
    async fn an_answer_that_never_starts_reads_as_refused_and_a_cut_one_does_not() {
        let t = Duration::from_secs(5);
        // Through a reader that hands out the request's bytes as an answer
        // cut short: an early end, not a refusal.
        let mut cut = encode(&sample());
        cut.truncate(cut.len() - 1);
        let mut both = DuplexVec(Cursor::new(cut));
        let err = write_then_read::<_, AuthRequest, _>(&mut both, &sample(), 1024, t)
            .await
            .expect_err("cut");
        assert!(!err.to_string().contains("refused"), "{err}");
        // Nothing at all to read: refused.
        let mut none = DuplexVec(Cursor::new(Vec::new()));
        let err = write_then_read::<_, AuthRequest, _>(&mut none, &sample(), 1024, t)
            .await
            .expect_err("nothing");
        assert!(err.to_string().contains(CLOSED_UNANSWERED), "{err}");
    }

    /// Reads from its cursor, swallows writes.
    struct DuplexVec(Cursor<Vec<u8>>);

    impl AsyncRead for DuplexVec {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for DuplexVec {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let err = read::<AuthRequest, _>(&mut Silent, 1024, Duration::from_millis(20))
            .await
            .expect_err("nothing sent");
        assert!(matches!(err, FrameError::Timeout(_)), "{err}");
        assert!(!err.is_malformed());
    }

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

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<AuthRequest>(&bytes, 1024);
        }
    }
}
