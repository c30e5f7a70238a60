//! The bench's own protocol on one byte stream (a TCP connection, a raw
//! libp2p stream, or an agentmesh call): the same bytes on every path, so
//! the paths differ only in what carries them.
//!
//! The client's first byte picks the mode; the server answers it with
//! [`ACK`] before anything else, so a client knows its stream was taken
//! (libp2p-stream drops an inbound stream that arrives while its accept
//! loop is busy with the previous one: the client opens the streams of a
//! concurrent run one by one, each acknowledged, then starts them):
//! - `S` (sink): a u64 big-endian length N, then N bytes; the server reads
//!   exactly N and answers with the u64 count it read. Length-prefixed
//!   rather than read-to-EOF, so no path needs to carry a half-close.
//! - `E` (echo): every byte read is written back at once, until EOF.
//!
//! A server never trusts the length: it reads at most N and only what
//! arrives; a short stream is an error, not a hang (the caller's deadline).

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Mode byte: sink N bytes, answer the count.
pub const MODE_SINK: u8 = b'S';
/// Mode byte: echo every byte.
pub const MODE_ECHO: u8 = b'E';
/// The server's answer to the mode byte.
pub const ACK: u8 = b'+';
/// Size of one write and one read: large enough that per-call overhead is
/// not what is measured, small enough to sit inside any window.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Serves one stream: sink or echo, as its first byte says.
pub async fn serve<S>(mut s: S) -> std::io::Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mode = s.read_u8().await?;
    if mode == MODE_SINK || mode == MODE_ECHO {
        s.write_u8(ACK).await?;
        s.flush().await?;
    }
    match mode {
        MODE_SINK => {
            let want = s.read_u64().await?;
            let mut buf = vec![0u8; CHUNK_BYTES];
            let mut got = 0u64;
            while got < want {
                let room = usize::try_from(want - got)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                let n = s.read(&mut buf[..room]).await?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("sink: stream ended after {got} of {want} bytes"),
                    ));
                }
                got += n as u64;
            }
            s.write_u64(got).await?;
            s.flush().await?;
            Ok(got)
        }
        MODE_ECHO => {
            let mut buf = vec![0u8; CHUNK_BYTES];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok(total);
                }
                s.write_all(&buf[..n]).await?;
                s.flush().await?;
                total += n as u64;
            }
        }
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown mode byte {other:#04x}"),
        )),
    }
}

/// Sends the mode byte and waits for the server's [`ACK`].
pub async fn hello<S>(s: &mut S, mode: u8) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    s.write_u8(mode).await?;
    s.flush().await?;
    match s.read_u8().await? {
        ACK => Ok(()),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("expected the server's ack, got {other:#04x}"),
        )),
    }
}

/// After [`hello`] with [`MODE_SINK`]: sends `bytes` and waits for the server's count; returns
/// the time from the first byte to the answer. A count other than `bytes`
/// is an error (the path lost or invented data).
pub async fn sink<S>(mut s: S, bytes: u64) -> std::io::Result<Duration>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    s.write_u64(bytes).await?;
    let buf = vec![0x5au8; CHUNK_BYTES];
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        s.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    s.flush().await?;
    let got = s.read_u64().await?;
    if got != bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("server counted {got} bytes, {bytes} were sent"),
        ));
    }
    Ok(start.elapsed())
}

/// After [`hello`] with [`MODE_ECHO`]: `count` one-byte round trips after `warmup` unrecorded
/// ones; returns each recorded round trip.
pub async fn echo<S>(mut s: S, warmup: u32, count: u32) -> std::io::Result<Vec<Duration>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut samples = Vec::with_capacity(count as usize);
    for i in 0..warmup + count {
        let byte = (i % 251) as u8;
        let t = Instant::now();
        s.write_all(&[byte]).await?;
        s.flush().await?;
        let back = s.read_u8().await?;
        let rtt = t.elapsed();
        if back != byte {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("echo sent {byte:#04x}, got {back:#04x}"),
            ));
        }
        if i >= warmup {
            samples.push(rtt);
        }
    }
    s.shutdown().await?;
    Ok(samples)
}

/// Buffer of each direction of a splice, bytes: the node's default
/// (`--splice-buffer-kib`).
const SPLICE_BUFFER_BYTES: usize = agentmesh_node::config::DEFAULT_SPLICE_BUFFER_KIB * 1024;

/// Splices `a` and `b` both ways as a node splices a call and its TCP
/// connection; returns the bytes copied a → b and b → a.
pub(super) async fn splice<A, B>(a: &mut A, b: &mut B) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    tokio::io::copy_bidirectional_with_sizes(a, b, SPLICE_BUFFER_BYTES, SPLICE_BUFFER_BYTES).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sink_and_echo_over_a_real_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..2 {
                let (s, _) = l.accept().await.expect("accept");
                served.push(serve(s).await.expect("serve"));
            }
            served
        });
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        hello(&mut c, MODE_SINK).await.expect("hello");
        sink(c, 3 * CHUNK_BYTES as u64 + 7).await.expect("sink");
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        hello(&mut c, MODE_ECHO).await.expect("hello");
        let rtts = echo(c, 2, 5).await.expect("echo");
        assert_eq!(rtts.len(), 5);
        assert_eq!(server.await.expect("join"), [3 * CHUNK_BYTES as u64 + 7, 7]);
    }

    #[tokio::test]
    async fn a_short_sink_is_an_error_not_a_hang() {
        let (mut client, server) = tokio::io::duplex(1024);
        let serve = tokio::spawn(serve(server));
        hello(&mut client, MODE_SINK).await.expect("hello");
        client.write_u64(1_000).await.expect("len");
        client.write_all(&[0; 10]).await.expect("data");
        drop(client);
        let err = serve.await.expect("join").expect_err("short");
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn an_unknown_mode_is_refused() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_u8(b'X').await.expect("mode");
        let err = serve(server).await.expect_err("unknown");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }
}
