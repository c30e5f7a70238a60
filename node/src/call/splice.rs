//! A call's splice: bytes both ways between the call's stream and a local
//! TCP connection (the backend of an inbound call; the `--forward` or
//! Unix-socket client of an outbound one) until both sides are done, or
//! until the call ends for a reason of its own, whatever the other side
//! does:
//!
//! - **idle**: no byte moved either way for `--call-idle-timeout-secs`;
//! - **its connection closed**: the libp2p connection carrying the stream
//!   is gone ([`ConnectionClosed`]). A stream of a closed connection fails
//!   when it is polled (see `agentmesh_streams::yamux`), but a call whose
//!   caller half-closed no longer reads its stream and would otherwise
//!   wait on a silent backend forever;
//! - **stopped** by its holder (`stop`: a preempted slot, a policy that no
//!   longer allows it).
//!
//! Dropping the splice's result drops nothing: the caller owns both ends
//! and closes the local socket by dropping it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use agentmesh_streams::ConnectionClosed;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// How long a call whose stream failed waits to learn whether its
/// connection closed too (to count the end as `connection_closed` rather
/// than `stream_error`). A connection that fails wakes its streams just
/// before the swarm drops its handler, which fires [`ConnectionClosed`]:
/// microseconds apart, so this bound is only ever reached by a stream
/// that failed on its own. The local socket is closed before this wait.
pub(crate) const CLOSE_SETTLE: Duration = Duration::from_millis(250);

/// Why a splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Both directions reached their end.
    Finished,
    /// No byte either way for the idle deadline.
    IdleTimeout,
    /// The connection carrying the stream closed.
    ConnectionClosed,
    /// The stream failed; whether its connection closed is settled by
    /// [`Outcome::settle`].
    StreamFailed,
    /// The stream failed while its connection lived.
    StreamError,
    /// The local TCP side failed.
    LocalError,
    /// Stopped by the holder, with its reason label.
    Stopped(&'static str),
}

impl End {
    /// The `reason` label of `agentmesh_node_calls_ended_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Finished => "finished",
            Self::IdleTimeout => "idle_timeout",
            Self::ConnectionClosed => "connection_closed",
            Self::StreamFailed | Self::StreamError => "stream_error",
            Self::LocalError => "local_error",
            Self::Stopped(reason) => reason,
        }
    }
}

/// What a splice did.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Why it ended.
    pub(crate) end: End,
    /// Bytes read from the stream (written to the local side).
    pub(crate) from_stream: u64,
    /// Bytes read from the local side (written to the stream).
    pub(crate) to_stream: u64,
    /// The I/O error that ended it, if one did.
    pub(crate) error: Option<io::Error>,
}

impl Outcome {
    /// Settles a [`End::StreamFailed`]: `ConnectionClosed` if `closed`
    /// fires within [`CLOSE_SETTLE`], else `StreamError`. Other ends stay.
    pub(crate) async fn settle(mut self, closed: &ConnectionClosed) -> Self {
        if self.end == End::StreamFailed {
            let gone = closed.is_closed()
                || tokio::time::timeout(CLOSE_SETTLE, closed.wait())
                    .await
                    .is_ok();
            self.end = if gone {
                End::ConnectionClosed
            } else {
                End::StreamError
            };
        }
        self
    }
}

/// How a splice runs.
pub(crate) struct Limits<'a> {
    /// Buffer of each direction, bytes.
    pub(crate) buffer: usize,
    /// The idle deadline; `None`: none.
    pub(crate) idle: Option<Duration>,
    /// The stream's connection.
    pub(crate) closed: &'a ConnectionClosed,
    /// Told of every transfer (e.g. the call's fair slot, so an idle call
    /// is preempted before a busy one).
    pub(crate) on_activity: &'a (dyn Fn() + Sync),
}

/// Splices `stream` and `local` until both are done or the call ends for
/// one of the reasons in the module doc; `stop` ends it with its label.
/// An `End::StreamFailed` is returned as is: settle it with
/// [`Outcome::settle`] once the local side is closed.
pub(crate) async fn splice<S, L>(
    stream: &mut S,
    local: &mut L,
    limits: Limits<'_>,
    stop: impl Future<Output = &'static str>,
) -> Outcome
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
    L: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let activity = Activity::new(limits.on_activity);
    let mut s = Watched::new(stream, &activity);
    let mut l = Watched::new(local, &activity);
    let idle = async {
        match limits.idle {
            Some(limit) => activity.idle_for(limit).await,
            None => std::future::pending().await,
        }
    };
    let copy =
        tokio::io::copy_bidirectional_with_sizes(&mut s, &mut l, limits.buffer, limits.buffer);
    let (end, error) = tokio::select! {
        r = copy => match r {
            Ok(_) => (End::Finished, None),
            // The side that failed first decides; the stream's side may be
            // its connection closing (settled later).
            Err(e) if s.failed() => (End::StreamFailed, Some(e)),
            Err(e) => (End::LocalError, Some(e)),
        },
        () = idle => (End::IdleTimeout, None),
        () = limits.closed.wait() => (End::ConnectionClosed, None),
        reason = stop => (End::Stopped(reason), None),
    };
    Outcome {
        end,
        from_stream: s.read,
        to_stream: l.read,
        error,
    }
}

/// Splices an outbound call (`--forward`, the Unix socket's `CALL`) with
/// its local client until it ends (see the module doc; nothing stops it
/// but those), counts its end in `agentmesh_node_calls_ended_total{direction="outbound"}`
/// and returns it. Bytes are counted by the [`CallStream`] itself.
pub(crate) async fn outbound<L>(
    node: &crate::node::Node,
    local: &mut L,
    stream: &mut super::CallStream,
) -> Outcome
where
    L: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let closed = node.control.closed(stream.connection());
    let limits = Limits {
        buffer: node.config.calls.splice_buffer_bytes(),
        idle: node.config.calls.idle_deadline(),
        closed: &closed,
        on_activity: &|| {},
    };
    let out = splice(stream, local, limits, std::future::pending()).await;
    let out = out.settle(&closed).await;
    node.metrics.call_ended("outbound", out.end.label());
    out
}

/// When bytes last moved, either way.
struct Activity<'a> {
    start: Instant,
    /// Nanoseconds from `start` to the last transfer.
    last: AtomicU64,
    on_activity: &'a (dyn Fn() + Sync),
}

impl<'a> Activity<'a> {
    fn new(on_activity: &'a (dyn Fn() + Sync)) -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
            on_activity,
        }
    }

    fn touch(&self) {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(nanos, Ordering::Relaxed);
        (self.on_activity)();
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Completes once nothing moved for `limit`: sleeps to the deadline the
    /// last transfer set, and again while transfers pushed it on (no timer
    /// per byte).
    async fn idle_for(&self, limit: Duration) {
        loop {
            let due = self.last() + limit;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// One end of the splice: counts what is read from it, notes every
/// transfer in the [`Activity`], and remembers whether it failed.
struct Watched<'a, T: ?Sized> {
    inner: &'a mut T,
    activity: &'a Activity<'a>,
    read: u64,
    failed: bool,
}

impl<'a, T: ?Sized> Watched<'a, T> {
    fn new(inner: &'a mut T, activity: &'a Activity<'a>) -> Self {
        Self {
            inner,
            activity,
            read: 0,
            failed: false,
        }
    }

    fn failed(&self) -> bool {
        self.failed
    }

    fn note<R>(&mut self, r: &Poll<io::Result<R>>) {
        self.failed |= matches!(r, Poll::Ready(Err(_)));
    }
}

impl<T: AsyncRead + Unpin + ?Sized> AsyncRead for Watched<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.inner).poll_read(cx, buf);
        self.note(&r);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.read += n as u64;
            self.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin + ?Sized> AsyncWrite for Watched<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut *self.inner).poll_write(cx, data);
        self.note(&r);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut *self.inner).poll_flush(cx);
        self.note(&r);
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut *self.inner).poll_shutdown(cx);
        self.note(&r);
        r
    }
}

#[cfg(test)]
mod tests;
