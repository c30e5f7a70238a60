//! An inbound TCP connection whose bytes advance its handshake's
//! [`Progress`]: the socket under the security and muxer upgrades, so
//! progress is measured on the bytes the peer really sent, before any
//! parsing. The table may also look at the socket itself (a peek for bytes
//! not read yet, [`Progress::set_probe`]), which is why the stream is
//! shared: the probe holds it weakly, so the socket still closes when the
//! connection drops it.

use std::io;
use std::mem::MaybeUninit;
use std::net::Shutdown;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};

use futures::io::{AsyncRead, AsyncWrite};
use socket2::SockRef;
use tokio::net::TcpStream;

use super::progress::{Progress, Turns};

/// A TCP stream with its reads and writes counted as turns of a handshake
/// (inbound connections; a dialed one carries no progress).
#[derive(Debug)]
pub struct Watched {
    stream: Arc<TcpStream>,
    /// Until the handshake is over.
    progress: Option<(Arc<Progress>, Turns)>,
}

impl Watched {
    /// `stream`, its handshake's progress (inbound) given a probe of the
    /// socket.
    pub(crate) fn new(stream: TcpStream, progress: Option<Arc<Progress>>) -> Self {
        let stream = Arc::new(stream);
        if let Some(p) = &progress {
            let weak = Arc::downgrade(&stream);
            p.set_probe(Box::new(move || unread(&weak)));
        }
        Self {
            stream,
            progress: progress.map(|p| (p, Turns::default())),
        }
    }

    /// Counts with `f`; forgets the progress once its handshake is over.
    fn count(&mut self, f: impl FnOnce(&mut Turns, &Progress)) {
        if let Some((p, turns)) = &mut self.progress {
            if p.is_finished() {
                self.progress = None;
            } else {
                f(turns, p);
            }
        }
    }
}

/// Whether bytes wait unread on the socket (a non-blocking peek; the
/// stream is tokio's, so the socket never blocks).
fn unread(stream: &Weak<TcpStream>) -> bool {
    let Some(s) = stream.upgrade() else {
        return false;
    };
    let mut one = [MaybeUninit::<u8>::uninit(); 1];
    matches!(SockRef::from(&*s).peek(&mut one), Ok(n) if n > 0)
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            match self.stream.try_read(buf) {
                Ok(n) => {
                    self.count(|t, p| t.received(n, p));
                    return Poll::Ready(Ok(n));
                }
                // Readiness was cleared: wait for the next.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match self.stream.try_write(buf) {
                Ok(n) => {
                    self.count(|t, p| t.sent(n, p));
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // TCP has no buffer of ours to flush.
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(SockRef::from(&*self.stream).shutdown(Shutdown::Write))
    }
}
