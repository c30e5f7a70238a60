//! Yamux as a libp2p `StreamMuxer` with bounds of our own, shared by the
//! router and the member: libp2p-yamux fixes each connection's receive
//! window at 1 GiB, so both programs drive yamux 0.14 directly with a
//! config they bound, and buffer at most a fixed number of inbound streams
//! the swarm has not taken yet (more are dropped and counted).
//!
//! Streams end with their connection ([`Substream`]). yamux 0.14 wakes
//! and closes its streams when the connection fails or is dropped while
//! active, but not on a graceful close: `Connection::poll_close` moves the
//! active state into its closing handshake without touching the streams,
//! so each keeps its state "open" and the waker it parked in a read or a
//! write, and nothing ever wakes it. The swarm closes a connection that
//! way whenever it is asked to (`close_connection`, as after failed pings,
//! or at the end of keep-alive), so a task splicing a silent call on such
//! a stream waited forever, holding its slot and its backend socket. Here
//! every stream of a connection is woken when its connection starts to
//! close, fails or is dropped, and from then on a read or write it would
//! have parked in fails with `ConnectionReset` instead.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;
use futures::{AsyncRead, AsyncWrite, future, ready};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerEvent};
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade, UpgradeInfo};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

/// The yamux protocol id.
pub const YAMUX_PROTOCOL: &str = "/yamux/1.0.0";

/// The yamux upgrade with a bounded config.
#[derive(Debug, Clone)]
pub struct YamuxUpgrade {
    config: yamux::Config,
    inbound: InboundBuffer,
}

/// The bound on inbound streams a connection buffers while the swarm is not
/// asking for them, and the counter of streams dropped past it.
#[derive(Debug, Clone)]
pub struct InboundBuffer {
    /// Streams buffered at most; more are dropped (the remote sees a reset).
    pub max: usize,
    /// Counts every dropped stream.
    pub dropped: Counter,
}

impl YamuxUpgrade {
    /// Upgrades with `config` (its windows already bounded by the caller)
    /// and the inbound buffer `inbound`.
    pub fn new(config: yamux::Config, inbound: InboundBuffer) -> Self {
        Self { config, inbound }
    }

    /// The muxer over `io`; inbound and outbound differ only in `mode`.
    fn connect<C>(self, io: C, mode: yamux::Mode) -> Yamux<C>
    where
        C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Yamux::new(yamux::Connection::new(io, self.config, mode), self.inbound)
    }
}

impl UpgradeInfo for YamuxUpgrade {
    type Info = &'static str;
    type InfoIter = std::iter::Once<Self::Info>;

    fn protocol_info(&self) -> Self::InfoIter {
        std::iter::once(YAMUX_PROTOCOL)
    }
}

impl<C> InboundConnectionUpgrade<C> for YamuxUpgrade
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = Yamux<C>;
    type Error = io::Error;
    type Future = future::Ready<Result<Self::Output, Self::Error>>;

    fn upgrade_inbound(self, io: C, _: Self::Info) -> Self::Future {
        future::ready(Ok(self.connect(io, yamux::Mode::Server)))
    }
}

impl<C> OutboundConnectionUpgrade<C> for YamuxUpgrade
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Output = Yamux<C>;
    type Error = io::Error;
    type Future = future::Ready<Result<Self::Output, Self::Error>>;

    fn upgrade_outbound(self, io: C, _: Self::Info) -> Self::Future {
        future::ready(Ok(self.connect(io, yamux::Mode::Client)))
    }
}

/// A yamux connection as a libp2p `StreamMuxer`.
#[derive(Debug)]
pub struct Yamux<C> {
    connection: yamux::Connection<C>,
    inbound: VecDeque<yamux::Stream>,
    inbound_waker: Option<Waker>,
    buffer: InboundBuffer,
    /// The streams handed out, woken when the connection goes.
    streams: Arc<Streams>,
}

impl<C> Yamux<C> {
    fn new(connection: yamux::Connection<C>, buffer: InboundBuffer) -> Self {
        Self {
            connection,
            inbound: VecDeque::new(),
            inbound_waker: None,
            buffer,
            streams: Arc::default(),
        }
    }

    /// Inbound streams buffered that the swarm has not taken yet.
    pub fn buffered(&self) -> usize {
        self.inbound.len()
    }

    fn hand_out(&self, inner: yamux::Stream) -> Substream {
        Substream::new(inner, self.streams.clone())
    }
}

impl<C> Drop for Yamux<C> {
    fn drop(&mut self) {
        self.streams.close();
    }
}

/// The streams of one connection: whether it is gone, and each live
/// stream's wakers (entries added when a stream is handed out and removed
/// when it is dropped, so bounded by the connection's streams).
#[derive(Debug, Default)]
struct Streams {
    gone: AtomicBool,
    live: Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    next: u64,
    wakers: HashMap<u64, Arc<Wakers>>,
}

/// Where a stream parks its reader and its writer.
#[derive(Debug, Default)]
struct Wakers {
    read: AtomicWaker,
    write: AtomicWaker,
}

impl Streams {
    fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Marks the connection gone and wakes every stream (once).
    fn close(&self) {
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        for w in self.live.lock().wakers.values() {
            w.read.wake();
            w.write.wake();
        }
    }

    fn add(&self) -> (u64, Arc<Wakers>) {
        let mut live = self.live.lock();
        let id = live.next;
        live.next += 1;
        let w = Arc::new(Wakers::default());
        live.wakers.insert(id, w.clone());
        (id, w)
    }

    fn remove(&self, id: u64) {
        let wakers = &mut self.live.lock().wakers;
        wakers.remove(&id);
        if wakers.capacity() > 64 && wakers.len() * 4 < wakers.capacity() {
            wakers.shrink_to(wakers.len() * 2);
        }
    }
}

/// A stream of a [`Yamux`] connection: yamux's own stream, except that
/// once its connection is gone (closing, failed or dropped) a read, write,
/// flush or close that would wait fails with `ConnectionReset` (data
/// already received is still read first), and one already waiting is woken
/// to fail so. See the module doc for why.
#[derive(Debug)]
pub struct Substream {
    inner: yamux::Stream,
    streams: Arc<Streams>,
    wakers: Arc<Wakers>,
    id: u64,
}

impl Substream {
    fn new(inner: yamux::Stream, streams: Arc<Streams>) -> Self {
        let (id, wakers) = streams.add();
        Self {
            inner,
            streams,
            wakers,
            id,
        }
    }

    /// What a poll that would wait returns: still waiting, or (the
    /// connection gone) the error. The waker is parked before the check,
    /// so a close between the two is never missed.
    fn pending<T>(&self, waker: &AtomicWaker, cx: &Context<'_>) -> Poll<io::Result<T>> {
        waker.register(cx.waker());
        if self.streams.is_gone() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the stream's connection is closed",
            )));
        }
        Poll::Pending
    }
}

impl Drop for Substream {
    fn drop(&mut self) {
        self.streams.remove(self.id);
    }
}

impl AsyncRead for Substream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Pending => self.pending(&self.wakers.read, cx),
            r => r,
        }
    }
}

impl AsyncWrite for Substream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending(&self.wakers.write, cx),
            r => r,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending(&self.wakers.write, cx),
            r => r,
        }
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_close(cx) {
            Poll::Pending => self.pending(&self.wakers.write, cx),
            r => r,
        }
    }
}

impl<C> Yamux<C>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<yamux::Stream, io::Error>> {
        let e = match ready!(self.connection.poll_next_inbound(cx)) {
            Some(Ok(s)) => return Poll::Ready(Ok(s)),
            Some(Err(e)) => e,
            None => yamux::ConnectionError::Closed,
        };
        self.streams.close();
        Poll::Ready(Err(to_io(e)))
    }
}

fn to_io(e: yamux::ConnectionError) -> io::Error {
    match e {
        yamux::ConnectionError::Io(e) => e,
        e => io::Error::other(e),
    }
}

impl<C> StreamMuxer for Yamux<C>
where
    C: AsyncRead + AsyncWrite + Unpin + 'static,
{
    type Substream = Substream;
    type Error = io::Error;

    fn poll_inbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        if let Some(s) = self.inbound.pop_front() {
            return Poll::Ready(Ok(self.hand_out(s)));
        }
        if let Poll::Ready(r) = self.poll_next(cx) {
            return Poll::Ready(r.map(|s| self.hand_out(s)));
        }
        self.inbound_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_outbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let s = ready!(self.connection.poll_new_outbound(cx)).map_err(to_io)?;
        Poll::Ready(Ok(self.hand_out(s)))
    }

    /// Wakes and fails every stream first: yamux's graceful close does not
    /// (see the module doc).
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.streams.close();
        self.connection.poll_close(cx).map_err(to_io)
    }

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, Self::Error>> {
        let this = self.get_mut();
        let s = ready!(this.poll_next(cx))?;
        if this.inbound.len() >= this.buffer.max {
            this.buffer.dropped.inc();
            tracing::debug!(stream = %s, "dropping inbound stream: buffer full");
            drop(s);
        } else {
            this.inbound.push_back(s);
            if let Some(w) = this.inbound_waker.take() {
                w.wake();
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::future::poll_fn;
    use futures::{AsyncReadExt as _, AsyncWriteExt as _};
    use libp2p::core::muxing::StreamMuxerExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;

    use super::*;

    /// Generous: a woken read fails at once; without the fix it never does.
    const WAKE_DEADLINE: Duration = Duration::from_secs(10);

    fn pair() -> (
        Yamux<tokio_util::compat::Compat<tokio::io::DuplexStream>>,
        Yamux<tokio_util::compat::Compat<tokio::io::DuplexStream>>,
    ) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let upgrade = YamuxUpgrade::new(
            yamux::Config::default(),
            InboundBuffer {
                max: 8,
                dropped: Counter::default(),
            },
        );
        (
            upgrade.clone().connect(a.compat(), yamux::Mode::Client),
            upgrade.connect(b.compat(), yamux::Mode::Server),
        )
    }

    /// The member's side closes a connection gracefully (as the swarm
    /// does after failed pings) while a task waits to read a stream of it
    /// that the remote keeps silent: the read fails instead of waiting
    /// forever, data received before the close is still read, and a write
    /// afterwards fails too. (yamux alone parks that read for good.)
    #[tokio::test]
    async fn a_graceful_close_wakes_and_fails_a_parked_read() {
        let (mut remote, mut local) = pair();
        let mut out = poll_fn(|cx| remote.poll_outbound_unpin(cx))
            .await
            .expect("open");
        let drive_remote = tokio::spawn(async move {
            let _ = poll_fn(|cx| remote.poll_unpin(cx)).await;
        });
        out.write_all(b"x").await.expect("write");
        let mut stream = poll_fn(|cx| local.poll_inbound_unpin(cx))
            .await
            .expect("inbound");
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            stream.read_exact(&mut buf).await.expect("the byte sent");
            let _ = first_tx.send(buf[0]);
            // The remote sends nothing more: this read parks.
            let r = stream.read(&mut buf).await;
            (r, stream.write_all(b"y").await)
        });
        let first = tokio::select! {
            _ = poll_fn(|cx| local.poll_unpin(cx)) => panic!("the connection ended"),
            b = first_rx => b.expect("reader"),
        };
        assert_eq!(first, b'x');
        // Close gracefully, and keep the muxer (the swarm keeps it until
        // its closing handshake is done; dropping it would wake anyway).
        let mut close = local.close();
        let (read, write) = tokio::time::timeout(WAKE_DEADLINE, async {
            let _ = (&mut close).await;
            reader.await.expect("reader task")
        })
        .await
        .expect("the parked read was woken by the close");
        // yamux's own error once its channel to the connection is closed,
        // or ours: either way the read fails.
        read.expect_err("the read fails");
        assert!(write.is_err(), "a write after the close fails");
        drop(close);
        drive_remote.abort();
    }

    #[tokio::test]
    async fn dropped_streams_leave_no_wakers_behind() {
        let (mut remote, _local) = pair();
        let mut opened = Vec::new();
        for _ in 0..3 {
            let s = poll_fn(|cx| remote.poll_outbound_unpin(cx)).await;
            opened.push(s.expect("open"));
        }
        assert_eq!(remote.streams.live.lock().wakers.len(), 3);
        drop(opened);
        assert!(remote.streams.live.lock().wakers.is_empty());
    }
}
