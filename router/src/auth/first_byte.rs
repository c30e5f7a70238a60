//! The first byte of an auth stream, within a deadline of its own.
//!
//! A member writes its whole request at once, so its first byte arrives
//! with the stream. A stream that sends nothing holds an auth slot for no
//! purpose but to hold it; it gets a short deadline
//! (`--auth-first-byte-timeout-ms`) and counts as a failed login. Once a
//! byte arrived, the request has the full stream timeout: a stream that is
//! merely slow (the member or the router under load) is not punished.

use std::io;
use std::time::Duration;

use futures::{AsyncRead, AsyncReadExt as _};

/// What the start of a stream was.
#[derive(Debug)]
pub(crate) enum FirstByte {
    /// Its first byte.
    Byte(u8),
    /// Nothing within the deadline.
    Silent,
    /// It ended or failed before a byte (`None`: ended cleanly).
    Closed(Option<io::Error>),
}

/// Reads the first byte of `s` within `deadline`.
pub(crate) async fn first_byte<S: AsyncRead + Unpin>(s: &mut S, deadline: Duration) -> FirstByte {
    let mut b = [0u8; 1];
    match tokio::time::timeout(deadline, s.read(&mut b)).await {
        Err(_) => FirstByte::Silent,
        Ok(Ok(0)) => FirstByte::Closed(None),
        Ok(Ok(_)) => FirstByte::Byte(b[0]),
        Ok(Err(e)) => FirstByte::Closed(Some(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::AsyncWriteExt as _;

    #[tokio::test]
    async fn a_byte_silence_and_an_end_are_told_apart() {
        let d = Duration::from_millis(50);
        let mut bytes = futures::io::Cursor::new(vec![7u8, 8]);
        assert!(matches!(
            first_byte(&mut bytes, d).await,
            FirstByte::Byte(7)
        ));
        let mut empty = futures::io::Cursor::new(Vec::<u8>::new());
        assert!(matches!(
            first_byte(&mut empty, d).await,
            FirstByte::Closed(None)
        ));
        // A pipe whose writer never writes: silent.
        let (mut r, _w) = sluice();
        assert!(matches!(first_byte(&mut r, d).await, FirstByte::Silent));
        // A byte written late but within the deadline counts.
        let (mut r, mut w) = sluice();
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            w.write_all(&[1]).await.expect("write");
            w
        });
        assert!(matches!(
            first_byte(&mut r, Duration::from_secs(5)).await,
            FirstByte::Byte(1)
        ));
        drop(late.await);
    }

    /// An in-memory pipe.
    fn sluice() -> (
        impl AsyncRead + Unpin,
        impl futures::AsyncWrite + Unpin + Send + 'static,
    ) {
        let (a, b) = tokio::io::duplex(64);
        use tokio_util::compat::TokioAsyncReadCompatExt as _;
        (a.compat(), b.compat())
    }
}
