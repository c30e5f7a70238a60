//! Two muxer layers:
//!
//! - [`yamux_upgrade`]: the shared bounded yamux muxer
//!   (`agentmesh_streams::yamux`) with `set_max_num_streams(n)` and a
//!   connection window of exactly n × 256 KiB, so no stream's window grows
//!   past 256 KiB, in place of libp2p-yamux's 1 GiB.
//! - [`Accounted`]: wraps any muxer (ours, QUIC) and hands out
//!   [`AccountedStream`]s that learn their protocol from the multistream-select
//!   message our side writes (confirmation inbound, proposal outbound), ask
//!   the [`ResourceManager`] before that message reaches the wire, and release
//!   their charge on drop. A refused stream fails that write: the handler's
//!   upgrade fails, the remote sees the negotiation fail, and the connection
//!   and its other streams live on. `poll_inbound` never fails for a refusal.
//!   Dropping it tells the manager the connection is down (see
//!   `ResourceManager::is_connected`), even while its streams linger.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{AsyncRead, AsyncWrite, ready};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerEvent};

use super::budget::{DATA_STREAM_CHARGE_BYTES, Proto};
use super::relay::{MAX_STOP_REQUEST_BYTES, StopSource, stop_permission_denied, stop_source};
use super::sniff::{Seen, Sniffer, accepted_reply_len};
use super::{ConnectionGuard, StreamGuard};

pub(crate) use agentmesh_streams::yamux::{InboundBuffer, YamuxUpgrade};

/// The yamux protocol id.
/// The yamux upgrade with bounded windows: at most `max_streams` streams per
/// connection (a backstop above the budgets: exceeding it closes the
/// connection) and a connection window of `max_streams` × 256 KiB, so each
/// stream keeps a 256 KiB window; inbound streams the swarm has not taken
/// yet are bounded by `inbound` (its drops count as `refused_total{
/// resource="stream",scope="connection",protocol="none"}`: no protocol is
/// negotiated yet).
pub(crate) fn yamux_upgrade(max_streams: usize, inbound: InboundBuffer) -> YamuxUpgrade {
    let n = max_streams.max(1);
    let mut config = yamux::Config::default();
    // Order matters: yamux asserts window >= streams × 256 KiB on each
    // call, and its default window (1 GiB) holds only 4096 streams; so
    // lift the window, set the streams, then bound the window.
    config.set_max_connection_receive_window(None);
    config.set_max_num_streams(n);
    config.set_max_connection_receive_window(Some(
        n.saturating_mul(DATA_STREAM_CHARGE_BYTES as usize),
    ));
    YamuxUpgrade::new(config, inbound)
}

/// Any muxer whose streams are accounted by the resource manager.
#[derive(Debug)]
pub(crate) struct Accounted<M> {
    inner: M,
    conn: Arc<ConnectionGuard>,
}

impl<M> Accounted<M> {
    /// Wraps `inner`; `conn` holds the connection's charge until the muxer
    /// and all its streams are gone.
    pub(crate) fn new(inner: M, conn: Arc<ConnectionGuard>) -> Self {
        Self { inner, conn }
    }
}

impl<M> Drop for Accounted<M> {
    /// The swarm drops the muxer when the connection closes (around the
    /// time it reports the close; on an error it may be just after, which
    /// the swarm loop's sweep of admissions without a connection covers):
    /// from then on the peer no longer counts as connected through it.
    fn drop(&mut self) {
        self.conn.muxer_dropped();
    }
}

impl<M> StreamMuxer for Accounted<M>
where
    M: StreamMuxer + Unpin,
    M::Substream: Unpin,
{
    type Substream = AccountedStream<M::Substream>;
    type Error = M::Error;

    fn poll_inbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let s = ready!(Pin::new(&mut self.inner).poll_inbound(cx))?;
        Poll::Ready(Ok(AccountedStream::new(s, self.conn.clone(), true)))
    }

    fn poll_outbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Substream, Self::Error>> {
        let s = ready!(Pin::new(&mut self.inner).poll_outbound(cx))?;
        Poll::Ready(Ok(AccountedStream::new(s, self.conn.clone(), false)))
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, Self::Error>> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

#[derive(Debug)]
enum Phase {
    /// Protocol not known yet.
    Sniffing(Sniffer),
    /// Admitted and charged (an unknown protocol is charged as other); the
    /// guard releases the charge when the stream drops.
    Open(StreamGuard),
    /// Refused: every write fails.
    Refused,
    /// An outbound STOP stream whose circuit the policy refused: the STOP
    /// request never reaches the destination. Reads pass on what is left
    /// of the destination's negotiation answer (`negotiation_left` bytes,
    /// never more), then give the relay `answer` (STATUS
    /// PERMISSION_DENIED) as if the destination had sent it, then end;
    /// writes are swallowed. The relay then denies the source's HOP with
    /// PERMISSION_DENIED: the caller sees a refusal, not a broken stream.
    Denied {
        negotiation_left: usize,
        answer: Vec<u8>,
        sent: usize,
    },
}

/// A substream that holds its charge until dropped.
#[derive(Debug)]
pub(crate) struct AccountedStream<S> {
    inner: S,
    conn: Arc<ConnectionGuard>,
    inbound: bool,
    phase: Phase,
    /// Outbound STOP streams: bytes of the remote's multistream-select
    /// answer still to come; the first byte after them is the destination's
    /// answer to the STOP request, which ends the handshake.
    reply_left: usize,
    /// Outbound STOP streams: the STOP request's bytes written so far,
    /// until it names the circuit's source (then `None`).
    stop_request: Option<Vec<u8>>,
    /// An outbound STOP stream whose destination answered: the circuit's
    /// bytes from then on, written (towards the destination) and read
    /// (towards the source). See [`RelayedBytes`].
    relayed: Option<RelayedBytes>,
}

/// The bytes a circuit carries, counted on its destination's STOP stream
/// (`agentmesh_router_relayed_bytes_total{direction}`). libp2p-relay copies
/// the circuit's bytes between the source's HOP stream and this stream
/// inside its own handler, out of our reach; this stream is the nearest
/// point that is ours. Counted: every byte the relay writes to it after
/// the destination's answer to the STOP request (the source's bytes), and
/// every byte read from it after the read that carried that answer (the
/// destination's bytes for the source). Not counted: the handshakes, and
/// any bytes of the destination that arrive in the same read as its answer
/// (in agentmesh's protocols the source speaks first). Each byte is
/// counted once: the source's HOP stream is not counted.
#[derive(Debug)]
struct RelayedBytes {
    to_destination: prometheus_client::metrics::counter::Counter,
    to_source: prometheus_client::metrics::counter::Counter,
}

impl<S> AccountedStream<S> {
    fn new(inner: S, conn: Arc<ConnectionGuard>, inbound: bool) -> Self {
        Self {
            inner,
            conn,
            inbound,
            phase: Phase::Sniffing(Sniffer::default()),
            reply_left: 0,
            stop_request: None,
            relayed: None,
        }
    }

    /// Decides on the stream once its protocol (`id`, if any) is known.
    fn decide(&mut self, proto: Proto, id: Option<&str>) -> io::Result<()> {
        match self
            .conn
            .manager()
            .clone()
            .open_stream(&self.conn, proto, self.inbound)
        {
            Ok(g) => {
                if g.in_handshake() {
                    self.reply_left = id.map_or(0, accepted_reply_len);
                    self.stop_request = Some(Vec::new());
                }
                self.phase = Phase::Open(g);
                Ok(())
            }
            Err(r) => {
                self.phase = Phase::Refused;
                Err(refused_error(proto, r))
            }
        }
    }
}

impl<S> AccountedStream<S> {
    /// Outbound STOP streams: once the STOP request (the relay's write
    /// after negotiation, `next` included) names the circuit's source,
    /// checks the policy (the source must be granted something the
    /// destination owns: this is the one place that sees both ends, see
    /// `super::circuits`), then charges the circuit to it. A policy
    /// refusal answers the relay in the destination's place
    /// ([`Phase::Denied`]: the source is told PERMISSION_DENIED); a budget
    /// refusal fails the stream (the relay denies the circuit to its
    /// source as failed).
    fn charge_stop_source(&mut self, next: &[u8]) -> io::Result<()> {
        let (Some(written), Phase::Open(g)) = (&self.stop_request, &mut self.phase) else {
            return Ok(());
        };
        match stop_source(written, next) {
            StopSource::Incomplete => return Ok(()),
            StopSource::Unknown => {}
            StopSource::Source(source) => {
                let sweeps = self.conn.manager().circuit_sweeps();
                if !self.conn.manager().circuit_allowed(&source, &g.peer()) {
                    self.deny_stop();
                    return Ok(());
                }
                if let Err(r) = self.conn.manager().charge_circuit_source(g, source) {
                    self.stop_request = None;
                    self.phase = Phase::Refused;
                    return Err(refused_error(Proto::RelayStop, r));
                }
                // A policy change swept the live circuits between the check
                // and the registration: check again under the new policy.
                if self.conn.manager().circuit_sweeps() != sweeps
                    && !self.conn.manager().circuit_allowed(&source, &g.peer())
                {
                    self.deny_stop();
                    return Ok(());
                }
            }
        }
        self.stop_request = None;
        Ok(())
    }
}

impl<S> AccountedStream<S> {
    /// The policy refused this STOP stream's circuit: answer the relay
    /// ourselves (see [`Phase::Denied`]); its charge is released.
    fn deny_stop(&mut self) {
        self.stop_request = None;
        self.phase = Phase::Denied {
            negotiation_left: self.reply_left,
            answer: stop_permission_denied(),
            sent: 0,
        };
    }
}

/// The error a cut circuit's reads and writes end with.
fn circuit_cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "circuit closed: the policy no longer allows it",
    )
}

fn refused_error(proto: Proto, r: super::budget::Refusal) -> io::Error {
    io::Error::other(format!(
        "{} stream refused: {} budget ({} scope) exhausted",
        proto.as_str(),
        r.resource.as_str(),
        r.scope.as_str()
    ))
}

impl<S: AsyncRead + Unpin> AsyncRead for AccountedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Phase::Open(g) = &this.phase
            && g.poll_is_cut(cx)
        {
            return Poll::Ready(Err(circuit_cut()));
        }
        if let Phase::Denied {
            negotiation_left,
            answer,
            sent,
        } = &mut this.phase
        {
            if *negotiation_left > 0 {
                let cap = (*negotiation_left).min(buf.len());
                let n = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut buf[..cap]))?;
                *negotiation_left = negotiation_left.saturating_sub(n);
                return Poll::Ready(Ok(n));
            }
            let rest = &answer[(*sent).min(answer.len())..];
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            *sent += n;
            return Poll::Ready(Ok(n));
        }
        let n = ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(r) = &this.relayed {
            r.to_source.inc_by(n as u64);
        }
        if let Phase::Open(g) = &mut this.phase
            && g.in_handshake()
        {
            // EOF (n = 0) ends it too: the stream is done either way.
            if n > this.reply_left || (n == 0 && !buf.is_empty()) {
                g.end_handshake();
                if n > this.reply_left {
                    // The destination answered: the circuit's bytes follow.
                    let (to_destination, to_source) =
                        this.conn.manager().metrics.relayed_counters();
                    this.relayed = Some(RelayedBytes {
                        to_destination,
                        to_source,
                    });
                }
            } else {
                this.reply_left -= n;
            }
        }
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AccountedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Phase::Open(g) = &this.phase
            && g.poll_is_cut(cx)
        {
            return Poll::Ready(Err(circuit_cut()));
        }
        if matches!(this.phase, Phase::Denied { .. }) {
            // Nothing more reaches the destination.
            return Poll::Ready(Ok(buf.len()));
        }
        let sniffing = matches!(this.phase, Phase::Sniffing(_));
        if let Phase::Sniffing(sniffer) = &this.phase {
            match sniffer.inspect(buf) {
                Seen::Undecided => {}
                Seen::Protocol(id) => this.decide(Proto::from_protocol_id(&id), Some(&id))?,
                Seen::GiveUp => this.decide(Proto::Other, None)?,
            }
        } else {
            this.charge_stop_source(buf)?;
            if matches!(this.phase, Phase::Denied { .. }) {
                // The STOP request, kept from the destination.
                return Poll::Ready(Ok(buf.len()));
            }
        }
        if matches!(this.phase, Phase::Refused) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "stream refused by the resource manager",
            )));
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if let Some(r) = &this.relayed {
            r.to_destination.inc_by(n as u64);
        }
        if let Phase::Sniffing(sniffer) = &mut this.phase {
            sniffer.wrote(&buf[..n]);
        }
        // The write that named the protocol is negotiation, not the request.
        if let (false, Some(written)) = (sniffing, &mut this.stop_request) {
            let room = MAX_STOP_REQUEST_BYTES.saturating_sub(written.len());
            written.extend_from_slice(&buf[..n.min(room)]);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_streams::yamux::YAMUX_PROTOCOL;
    use futures::future;
    use libp2p::core::upgrade::InboundConnectionUpgrade as _;
    use prometheus_client::metrics::counter::Counter;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;

    fn buffer(max: usize) -> InboundBuffer {
        InboundBuffer {
            max,
            dropped: Counter::default(),
        }
    }

    #[test]
    fn any_stream_cap_builds_without_panicking() {
        // Above 4096 streams yamux's default 1 GiB window used to trip its
        // assertion (e.g. `--peer-stream-budget-total 100000`).
        for n in [0, 1, 512, 4096, 4097, 100_000, u32::MAX as usize * 2 + 64] {
            let _ = yamux_upgrade(n, buffer(1));
        }
    }

    #[tokio::test]
    async fn dropping_the_accounted_muxer_marks_the_connection_down() {
        let resources = crate::resources::ResourceManager::new(
            crate::resources::budgets_of(&Default::default(), 64 << 20),
            &mut prometheus_client::registry::Registry::default(),
            Default::default(),
            crate::resources::Deps::nobody(),
        );
        let peer = libp2p::PeerId::random();
        let endpoint = libp2p::core::ConnectedPoint::Listener {
            local_addr: "/ip4/127.0.0.1/tcp/4001".parse().expect("addr"),
            send_back_addr: "/ip4/127.0.0.1/tcp/5000".parse().expect("addr"),
        };
        let guard = resources
            .open_connection(peer, &endpoint)
            .expect("admitted");
        let (ours, _theirs) = tokio::io::duplex(1 << 16);
        let muxer = yamux_upgrade(8, buffer(1))
            .upgrade_inbound(ours.compat(), YAMUX_PROTOCOL)
            .await
            .expect("muxer");
        let accounted = Accounted::new(muxer, guard.clone());
        assert!(resources.is_connected(&peer));
        drop(accounted);
        assert!(
            !resources.is_connected(&peer),
            "down with its muxer, while the guard is still held"
        );
        drop(guard);
    }

    #[tokio::test]
    async fn inbound_streams_past_the_buffer_are_dropped_and_counted() {
        const OPENED: usize = 5;
        const BUFFERED: usize = 2;
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let inbound = buffer(BUFFERED);
        let dropped = inbound.dropped.clone();
        let mut server = yamux_upgrade(64, inbound)
            .upgrade_inbound(ours.compat(), YAMUX_PROTOCOL)
            .await
            .expect("server");
        let mut client = yamux::Connection::new(
            theirs.compat(),
            yamux::Config::default(),
            yamux::Mode::Client,
        );
        // The remote opens streams (a stream's first byte carries its SYN)
        // and keeps its connection running.
        let remote = tokio::spawn(async move {
            let mut streams = Vec::new();
            for _ in 0..OPENED {
                let s = future::poll_fn(|cx| client.poll_new_outbound(cx))
                    .await
                    .expect("open");
                streams.push(s);
            }
            let write = async {
                for s in &mut streams {
                    futures::AsyncWriteExt::write_all(s, b"x")
                        .await
                        .expect("write");
                }
                future::pending::<()>().await
            };
            let drive = async {
                while let Some(Ok(_)) = future::poll_fn(|cx| client.poll_next_inbound(cx)).await {}
            };
            futures::join!(write, drive);
        });
        // Our swarm never asks for inbound streams: the muxer buffers two
        // and drops the rest, counting each.
        let want = (OPENED - BUFFERED) as u64;
        let polled = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            future::poll_fn(|cx| {
                let _ = Pin::new(&mut server).poll(cx);
                if dropped.get() >= want {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }),
        )
        .await;
        remote.abort();
        assert!(polled.is_ok(), "dropped {} of {want}", dropped.get());
        assert_eq!(dropped.get(), want);
        assert_eq!(server.buffered(), BUFFERED);
    }

    /// A multistream-select message (length-prefixed line).
    fn ms(line: &str) -> Vec<u8> {
        let mut out = vec![u8::try_from(line.len() + 1).expect("short")];
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        out
    }

    /// An outbound STOP stream as the relay drives it: negotiation and the
    /// STOP request (not counted), the destination's answer (not counted),
    /// then the circuit's bytes each way, counted by direction.
    #[tokio::test]
    async fn a_circuits_bytes_after_its_stop_handshake_are_counted_by_direction() {
        use futures::{AsyncReadExt as _, AsyncWriteExt as _};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        const STOP: &str = "/libp2p/circuit/relay/0.2.0/stop";
        let (mgr, _) = crate::resources::tests::manager(|_| {});
        let dst = mgr
            .open_connection(
                libp2p::PeerId::random(),
                &crate::resources::tests::inbound_from("10.0.0.1"),
            )
            .expect("conn");
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut s = AccountedStream::new(ours.compat(), dst.clone(), false);
        let counted = || {
            let (d, s) = mgr.metrics.relayed_counters();
            (d.get(), s.get())
        };
        let mut hello = ms("/multistream/1.0.0");
        hello.extend(ms(STOP));
        s.write_all(&hello).await.expect("negotiate");
        let request = super::super::relay::tests::connect_from(libp2p::PeerId::random());
        s.write_all(&request).await.expect("STOP request");
        assert!(matches!(s.phase, Phase::Open(_)), "{:?}", s.phase);
        // The destination accepts the protocol and answers STATUS OK.
        let mut answer = hello.clone();
        answer.extend([4, 0x08, 0x01, 0x20, 100]);
        theirs.write_all(&answer).await.expect("answer");
        let mut got = vec![0u8; answer.len()];
        s.read_exact(&mut got).await.expect("read the answer");
        assert_eq!(counted(), (0, 0), "handshakes are not the circuit's bytes");
        // The circuit's bytes: 3000 from the source, 1000 back.
        s.write_all(&[7u8; 3000]).await.expect("to the destination");
        theirs.write_all(&[9u8; 1000]).await.expect("to the source");
        let mut back = vec![0u8; 1000];
        s.read_exact(&mut back).await.expect("read");
        let mut seen = vec![0u8; hello.len() + request.len() + 3000];
        theirs
            .read_exact(&mut seen)
            .await
            .expect("destination reads");
        assert_eq!(counted(), (3000, 1000));
    }
}
