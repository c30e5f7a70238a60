//! Streams the protocol tests run their halves over.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{AsyncRead, AsyncWrite};
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt as _};

/// A peer that takes every byte written and never sends one.
pub(crate) struct Silent;

impl AsyncRead for Silent {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Pending
    }
}

impl AsyncWrite for Silent {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Both ends of an in-memory byte stream (a client's and a server's).
pub(crate) fn pipe() -> (
    Compat<tokio::io::DuplexStream>,
    Compat<tokio::io::DuplexStream>,
) {
    let (a, b) = tokio::io::duplex(1 << 20);
    (a.compat(), b.compat())
}
