//! Yamux as a libp2p `StreamMuxer` with bounds of our own, shared by the
//! router and the member: libp2p-yamux fixes each connection's receive
//! window at 1 GiB, so both programs drive yamux 0.14 directly with a
//! config they bound, and buffer at most a fixed number of inbound streams
//! the swarm has not taken yet (more are dropped and counted).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use futures::{AsyncRead, AsyncWrite, future, ready};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerEvent};
use libp2p::core::upgrade::{InboundConnectionUpgrade, OutboundConnectionUpgrade, UpgradeInfo};
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
}

impl<C> Yamux<C> {
    fn new(connection: yamux::Connection<C>, buffer: InboundBuffer) -> Self {
        Self {
            connection,
            inbound: VecDeque::new(),
            inbound_waker: None,
            buffer,
        }
    }

    /// Inbound streams buffered that the swarm has not taken yet.
    pub fn buffered(&self) -> usize {
        self.inbound.len()
    }
}

impl<C> Yamux<C>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<yamux::Stream, io::Error>> {
        match ready!(self.connection.poll_next_inbound(cx)) {
            Some(Ok(s)) => Poll::Ready(Ok(s)),
            Some(Err(e)) => Poll::Ready(Err(to_io(e))),
            None => Poll::Ready(Err(to_io(yamux::ConnectionError::Closed))),
        }
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
    type Substream = yamux::Stream;
    type Error = io::Error;

    fn poll_inbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        if let Some(s) = self.inbound.pop_front() {
            return Poll::Ready(Ok(s));
        }
        if let Poll::Ready(r) = self.poll_next(cx) {
            return Poll::Ready(r);
        }
        self.inbound_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_outbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        self.connection.poll_new_outbound(cx).map_err(to_io)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
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
