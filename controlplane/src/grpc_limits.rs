//! Connection-level bounds on the gRPC listener: at most
//! `--grpc-max-connections` open connections, shared fairly by sources, and
//! at most `--grpc-max-concurrent-streams-per-connection` calls in flight on
//! one.
//!
//! Every member and router keeps one HTTP/2 connection to the control plane,
//! so connections grow with the fleet; without a bound they end at the
//! process's file-descriptor limit, where tonic's own accept loop treats
//! `EMFILE` as fatal and stops serving gRPC altogether. [`BoundedIncoming`]
//! accepts and takes a slot of an [`agentmesh_fair::FairSlots`]: while
//! slots are free anyone gets one; when all are taken, a source holding
//! fewer than the busiest source takes that source's oldest connection
//! (closed at its next read or write, the waker is registered; counted in
//! `grpc_connections_preempted_total`), and a source already holding its
//! share is closed at accept (`grpc_connections_refused_total`). So one host
//! opening connections can take every slot while nobody else asks, and
//! only its share once others do. The client sees the connection close and
//! retries with its backoff and jitter. Refusals are logged at most once a
//! minute per source. The listener never hands tonic an error: accept
//! errors are counted, logged at most once a minute, and resource errors
//! pause accepting for 100 ms.
//!
//! [`StreamLimit`] counts the calls in flight per connection (a call is in
//! flight until its response body is dropped, so a server-streaming call
//! counts for as long as it streams) and refuses one past the bound with
//! `RESOURCE_EXHAUSTED` + `retry-after: 1` (counted as
//! `limiter_refusals_total{limiter="streams_per_connection"}`), rather than
//! queueing it silently as tonic's `concurrency_limit_per_connection` would.
//! HTTP/2's own `SETTINGS_MAX_CONCURRENT_STREAMS` is set to twice the bound,
//! so a client cannot even open more streams than that.
//!
//! A slot is taken at accept, before the TLS handshake and the HTTP/2
//! preface, and neither tonic nor hyper puts a deadline on the preface, so a
//! silent socket would hold its slot forever. Each [`LimitedConn`] therefore
//! carries a handshake deadline (`--grpc-handshake-timeout-secs`) that ends
//! when [`StreamLimit`] sees the connection's first call (matched through
//! [`Handshakes`] by peer address, the same key the per-connection count
//! uses); a connection still without a call then fails its next read, so
//! tonic closes it, and is counted in
//! `agentmesh_control_plane_grpc_handshake_timeouts_total`. After the first
//! call, HTTP/2 keepalive (set in `server.rs`) closes a peer that stops
//! answering PINGs.

use std::{
    collections::HashMap,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use hyper::body::Frame;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::{Instant, Sleep},
};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tonic::{
    Status,
    codegen::{Body, Bytes, Service, http},
    metadata::MetadataValue,
    transport::server::{Connected, TcpConnectInfo, TlsConnectInfo},
};

use agentmesh_fair::{FairSlots, Slot as ConnectionSlot};

use crate::{client::RETRY_AFTER_METADATA, metrics::Metrics, refusal_log::RefusalLog};

/// How long accepting pauses after a resource error (`EMFILE`, `ENFILE`, ...).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// Refusals and accept errors are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Accepted connections that have not carried a call yet, by peer address.
///
/// [`BoundedIncoming`] registers each connection at accept; [`StreamLimit`]
/// marks it at its first call and drops the entry, so the map holds only
/// connections still in their handshake (at most `--grpc-max-connections`).
#[derive(Debug, Default)]
pub struct Handshakes {
    pending: Mutex<HashMap<SocketAddr, Arc<AtomicBool>>>,
}

impl Handshakes {
    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<AtomicBool>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, peer: SocketAddr) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        self.pending().insert(peer, done.clone());
        done
    }

    /// Marks `peer`'s connection as past its handshake (its first call arrived).
    fn first_call(&self, peer: SocketAddr) {
        if let Some(done) = self.pending().remove(&peer) {
            done.store(true, Ordering::Release);
        }
    }

    /// Drops `peer`'s entry if it is still this connection's (an address can
    /// be reused by a later connection once this one closed).
    fn forget(&self, peer: SocketAddr, done: &Arc<AtomicBool>) {
        let mut pending = self.pending();
        if pending.get(&peer).is_some_and(|d| Arc::ptr_eq(d, done)) {
            pending.remove(&peer);
        }
    }

    /// Connections still waiting for their first call.
    pub fn len(&self) -> usize {
        self.pending().len()
    }

    /// Whether no connection is waiting for its first call.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The gRPC listener with a bound on open connections. Yields only accepted
/// connections that got a slot; see the module docs.
pub struct BoundedIncoming {
    listener: TcpListener,
    slots: FairSlots,
    handshake_timeout: Duration,
    handshakes: Arc<Handshakes>,
    metrics: Metrics,
    log: RefusalLog,
    pause: Option<Pin<Box<Sleep>>>,
    last_error_log: Option<Instant>,
}

impl std::fmt::Debug for BoundedIncoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedIncoming")
            .field("max", &self.slots.capacity())
            .finish_non_exhaustive()
    }
}

fn due(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|l| now.duration_since(l) < LOG_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// Accept errors that mean "out of a resource", worth a pause before retrying.
fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl BoundedIncoming {
    /// Serves `listener`, keeping at most `slots.capacity()` connections
    /// open, shared fairly by sources, each of which must carry its first
    /// call within `handshake_timeout`; `handshakes` is shared with the
    /// [`StreamLimit`] in front of the routes; refusals are logged through
    /// `log` (once a minute per source).
    pub fn new(
        listener: TcpListener,
        slots: FairSlots,
        handshake_timeout: Duration,
        handshakes: Arc<Handshakes>,
        metrics: Metrics,
        log: RefusalLog,
    ) -> Self {
        Self {
            listener,
            slots,
            handshake_timeout,
            handshakes,
            metrics,
            log,
            pause: None,
            last_error_log: None,
        }
    }
}

impl Stream for BoundedIncoming {
    type Item = io::Result<LimitedConn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pause = None;
            }
            match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => match this.slots.try_acquire(peer.ip()) {
                    Ok(acquired) => {
                        if let Some(from) = acquired.preempted {
                            this.metrics.grpc_connection_preempted();
                            if this.log.due(peer.ip()).is_some() {
                                tracing::warn!(
                                    %peer,
                                    %from,
                                    max = this.slots.capacity(),
                                    "gRPC connections full (--grpc-max-connections): the busiest \
                                     source's oldest connection closed for this one (logged once \
                                     a minute per source; see grpc_connections_preempted_total)"
                                );
                            }
                        }
                        let _ = stream.set_nodelay(true);
                        this.metrics.grpc_connection_opened();
                        let handshake = Handshake {
                            done: this.handshakes.register(peer),
                            deadline: Box::pin(tokio::time::sleep(this.handshake_timeout)),
                            table: this.handshakes.clone(),
                            peer,
                        };
                        let revoked = Box::pin(acquired.slot.revoked_owned());
                        return Poll::Ready(Some(Ok(LimitedConn {
                            stream,
                            slot: acquired.slot,
                            revoked,
                            handshake: Some(handshake),
                            expired: false,
                            metrics: this.metrics.clone(),
                        })));
                    }
                    Err(refusal) => {
                        this.metrics.grpc_connection_refused();
                        if this.log.due(peer.ip()).is_some() {
                            tracing::warn!(
                                %peer,
                                source = %refusal.source,
                                held = refusal.held,
                                fair_share = refusal.fair_share,
                                max = this.slots.capacity(),
                                "gRPC connection refused: --grpc-max-connections reached and \
                                 this source holds its share (logged once a minute per source; \
                                 see grpc_connections_refused_total)"
                            );
                        }
                        drop(stream);
                    }
                },
                Poll::Ready(Err(e)) => {
                    this.metrics.grpc_accept_error();
                    if due(&mut this.last_error_log) {
                        tracing::warn!(error = %e, "gRPC accept failed (logged once a minute)");
                    }
                    if is_resource_error(&e) {
                        this.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_PAUSE)));
                    }
                }
            }
        }
    }
}

/// A connection's handshake deadline, until its first call.
struct Handshake {
    done: Arc<AtomicBool>,
    deadline: Pin<Box<Sleep>>,
    table: Arc<Handshakes>,
    peer: SocketAddr,
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.table.forget(self.peer, &self.done);
    }
}

/// An accepted connection holding one of the listener's slots until dropped
/// (or until the slot is taken for another source: then every read and
/// write fails, so tonic closes it).
pub struct LimitedConn {
    stream: TcpStream,
    slot: ConnectionSlot,
    /// Completes once `slot` is taken for another source.
    revoked: Pin<Box<WaitForCancellationFutureOwned>>,
    /// `Some` until the first call arrives.
    handshake: Option<Handshake>,
    /// The handshake deadline passed: every read and write fails from now on.
    expired: bool,
    metrics: Metrics,
}

impl Drop for LimitedConn {
    fn drop(&mut self) {
        self.metrics.grpc_connection_closed();
    }
}

fn handshake_expired() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no gRPC call within --grpc-handshake-timeout-secs of accept",
    )
}

fn slot_taken() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection closed: --grpc-max-connections were open and its slot went to a source \
         holding fewer",
    )
}

impl LimitedConn {
    /// Checks the handshake deadline and the slot; `Err` once the deadline
    /// has passed without a call or the slot was taken. Polling both
    /// registers the waker, so an idle connection is woken (and fails).
    fn check_handshake(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.expired {
            return Err(handshake_expired());
        }
        if self.slot.is_revoked() || self.revoked.as_mut().poll(cx).is_ready() {
            return Err(slot_taken());
        }
        let Some(h) = self.handshake.as_mut() else {
            return Ok(());
        };
        if h.done.load(Ordering::Acquire) {
            self.handshake = None;
            return Ok(());
        }
        if h.deadline.as_mut().poll(cx).is_ready() {
            self.expired = true;
            self.handshake = None;
            self.metrics.grpc_handshake_timeout();
            tracing::debug!("gRPC connection closed: no call within the handshake timeout");
            return Err(handshake_expired());
        }
        Ok(())
    }
}

impl Connected for LimitedConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_handshake(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(handshake_expired()));
        }
        if this.slot.is_revoked() {
            return Poll::Ready(Err(slot_taken()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(handshake_expired()));
        }
        if this.slot.is_revoked() {
            return Poll::Ready(Err(slot_taken()));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Calls in flight per connection, keyed by the peer's address (one TCP
/// connection per address on one listener). An entry lives while its count
/// is above zero, so the map holds at most one entry per open connection.
struct InFlight {
    max: usize,
    calls: Mutex<HashMap<SocketAddr, usize>>,
    metrics: Metrics,
}

/// One call's place in its connection's count; gives it back when dropped.
struct Slot {
    shared: Arc<InFlight>,
    peer: SocketAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut calls = self.shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = calls.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                calls.remove(&self.peer);
            }
        }
    }
}

impl InFlight {
    fn take(self: &Arc<Self>, peer: SocketAddr) -> Option<Slot> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let n = calls.entry(peer).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            shared: self.clone(),
            peer,
        })
    }
}

/// Wraps the gRPC routes: refuses a call past the per-connection bound; see
/// the module docs.
#[derive(Clone)]
pub struct StreamLimit<S> {
    inner: S,
    shared: Arc<InFlight>,
    handshakes: Arc<Handshakes>,
}

impl<S> StreamLimit<S> {
    /// At most `max` calls in flight per connection (at least 1) in front of
    /// `inner`; each call also ends its connection's handshake deadline in
    /// `handshakes` (shared with the [`BoundedIncoming`] that accepted it).
    pub fn new(inner: S, max: usize, handshakes: Arc<Handshakes>, metrics: Metrics) -> Self {
        Self {
            inner,
            shared: Arc::new(InFlight {
                max: max.max(1),
                calls: Mutex::new(HashMap::new()),
                metrics,
            }),
            handshakes,
        }
    }
}

/// The remote address tonic put in a request's extensions (plain or TLS).
pub(crate) fn peer_of<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|t| t.get_ref().remote_addr())
        })
}

fn refusal(max: usize) -> http::Response<tonic::body::Body> {
    let mut status = Status::resource_exhausted(format!(
        "streams_per_connection limit reached: more than {max} calls in flight on this \
         connection (--grpc-max-concurrent-streams-per-connection)"
    ));
    status
        .metadata_mut()
        .insert(RETRY_AFTER_METADATA, MetadataValue::from_static("1"));
    status.into_http()
}

impl<S, B> Service<http::Request<B>> for StreamLimit<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<SlotBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let peer = peer_of(&req);
        if let Some(peer) = peer {
            // Even a call refused below proves a live HTTP/2 client.
            self.handshakes.first_call(peer);
        }
        let slot = match peer {
            Some(peer) => match self.shared.take(peer) {
                Some(slot) => Some(slot),
                None => {
                    self.shared.metrics.limited("streams_per_connection");
                    let max = self.shared.max;
                    return Box::pin(async move {
                        Ok(refusal(max).map(|inner| SlotBody { inner, _slot: None }))
                    });
                }
            },
            None => None,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|inner| SlotBody { inner, _slot: slot }))
        })
    }
}

/// A response body that holds its call's slot until it is dropped (sent in
/// full, or the stream reset).
pub struct SlotBody {
    inner: tonic::body::Body,
    _slot: Option<Slot>,
}

impl Body for SlotBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
