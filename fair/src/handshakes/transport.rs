//! The libp2p transport wrappers that keep a listener's handshakes fair:
//!
//! - [`Watch`] wraps the raw transport (TCP): every inbound stream becomes
//!   a [`Watched`] one whose bytes advance the handshake's progress, and
//!   the progress is handed to the [`Guarded`] above it.
//! - [`Guarded`] wraps the upgraded transport (noise, muxer, timeout): it
//!   admits each inbound connection when it is accepted, before a byte of
//!   it is read and before the swarm sees it ([`Handshakes::admit`]); a
//!   refused one is closed at once and never reported; an admitted one's
//!   upgrade future ends with [`HandshakeError::Shed`] as soon as it gives
//!   way to a newcomer, which drops its socket. Its slot is freed when the
//!   upgrade ends either way.
//!
//! The two meet through a one-place handoff: `Guarded::poll` polls the
//! upgraded transport, which polls `Watch` and passes its event up in the
//! same call, so the progress `Watch` left is the event's own (checked by
//! the remote address). Without a `Watch` below (QUIC, whose packets share
//! one socket), handshakes stay at stage 0 and give way oldest first.

use std::error::Error;
use std::fmt;
use std::future::Future;

use futures::FutureExt as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::Multiaddr;
use libp2p::core::transport::{DialOpts, ListenerId, Transport, TransportError, TransportEvent};
use libp2p::multiaddr::Protocol;
use libp2p::tcp::tokio::TcpStream;
use parking_lot::Mutex;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::watched::Watched;
use super::{Admission, Handshakes, Progress};

/// Connections refused in one poll before the wrapper yields (and asks to
/// be polled again): a flood of refusals must not hold the task that polls
/// the listener.
const MAX_REFUSED_PER_POLL: usize = 64;

/// The progress of the connection `Watch` just yielded, for `Guarded`.
type Handoff = Arc<Mutex<Option<(Multiaddr, Arc<Progress>)>>>;

/// The source IP of a remote address (`/ip4/..` or `/ip6/..` first).
fn ip_of(addr: &Multiaddr) -> Option<IpAddr> {
    match addr.iter().next()? {
        Protocol::Ip4(ip) => Some(ip.into()),
        Protocol::Ip6(ip) => Some(ip.into()),
        _ => None,
    }
}

impl Handshakes {
    /// A guarded listener over the raw transport `raw` (TCP): `upgrade`
    /// builds the upgraded transport (security, muxer, timeout) on the
    /// watched one, and the result is guarded by this table.
    pub fn tcp<T, U>(&self, raw: T, upgrade: impl FnOnce(Watch<T>) -> U) -> Guarded<U>
    where
        T: Transport,
    {
        let handoff = Handoff::default();
        let watched = Watch {
            inner: raw,
            handshakes: self.clone(),
            handoff: handoff.clone(),
        };
        Guarded {
            inner: upgrade(watched),
            handshakes: self.clone(),
            handoff: Some(handoff),
        }
    }

    /// `transport` guarded by this table, its bytes unseen (QUIC): its
    /// handshakes give way oldest first.
    pub fn guard<U: Transport>(&self, transport: U) -> Guarded<U> {
        Guarded {
            inner: transport,
            handshakes: self.clone(),
            handoff: None,
        }
    }
}

/// The raw TCP transport whose inbound streams count their handshake's
/// progress (see the module docs).
pub struct Watch<T> {
    inner: T,
    handshakes: Handshakes,
    handoff: Handoff,
}

impl<T: fmt::Debug> fmt::Debug for Watch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").field("inner", &self.inner).finish()
    }
}

/// A future of the raw transport's whose stream comes out [`Watched`].
pub struct WatchFuture<F, E> {
    inner: Option<F>,
    /// The outcome, when the raw upgrade was ready at accept.
    done: Option<Result<Watched, E>>,
    progress: Option<Arc<Progress>>,
}

impl<F, E> WatchFuture<F, E>
where
    F: Future<Output = Result<TcpStream, E>> + Unpin,
{
    /// An inbound upgrade with `progress`: resolved at once if it is ready
    /// (the TCP listener's is: the socket is accepted), so the table can
    /// look at the socket before the connection's task first runs.
    fn inbound(mut upgrade: F, progress: Arc<Progress>) -> Self {
        match (&mut upgrade).now_or_never() {
            Some(r) => Self {
                inner: None,
                done: Some(r.map(|s| Watched::new(s.0, Some(progress)))),
                progress: None,
            },
            None => Self {
                inner: Some(upgrade),
                done: None,
                progress: Some(progress),
            },
        }
    }

    fn dialed(dial: F) -> Self {
        Self {
            inner: Some(dial),
            done: None,
            progress: None,
        }
    }
}

impl<F, E> Future for WatchFuture<F, E>
where
    F: Future<Output = Result<TcpStream, E>> + Unpin,
    E: Unpin,
{
    type Output = Result<Watched, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(done) = self.done.take() {
            return Poll::Ready(done);
        }
        let Some(inner) = &mut self.inner else {
            return Poll::Pending; // polled after completion: never again
        };
        let s = std::task::ready!(Pin::new(inner).poll(cx))?;
        self.inner = None;
        Poll::Ready(Ok(Watched::new(s.0, self.progress.take())))
    }
}

impl<T> Transport for Watch<T>
where
    T: Transport<Output = TcpStream> + Unpin,
    T::ListenerUpgrade: Unpin,
    T::Dial: Unpin,
    T::Error: Unpin,
{
    type Output = Watched;
    type Error = T::Error;
    type ListenerUpgrade = WatchFuture<T::ListenerUpgrade, T::Error>;
    type Dial = WatchFuture<T::Dial, T::Error>;

    fn listen_on(
        &mut self,
        id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        self.inner.listen_on(id, addr)
    }

    fn remove_listener(&mut self, id: ListenerId) -> bool {
        self.inner.remove_listener(id)
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        Ok(WatchFuture::dialed(self.inner.dial(addr, opts)?))
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
        let ev = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        let ev = match ev {
            TransportEvent::Incoming {
                listener_id,
                upgrade,
                local_addr,
                send_back_addr,
            } => {
                let progress = self.handshakes.arriving();
                *self.handoff.lock() = Some((send_back_addr.clone(), progress.clone()));
                TransportEvent::Incoming {
                    listener_id,
                    upgrade: WatchFuture::inbound(upgrade, progress),
                    local_addr,
                    send_back_addr,
                }
            }
            other => other.map_upgrade(WatchFuture::dialed),
        };
        Poll::Ready(ev)
    }
}

/// The upgraded transport whose inbound handshakes are admitted, shed and
/// released by a [`Handshakes`] table (see the module docs).
pub struct Guarded<T> {
    inner: T,
    handshakes: Handshakes,
    handoff: Option<Handoff>,
}

impl<T: fmt::Debug> fmt::Debug for Guarded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("inner", &self.inner)
            .field("handshakes", &self.handshakes)
            .finish()
    }
}

impl<T> Guarded<T> {
    /// The progress `Watch` left for the connection from `remote`, or a
    /// fresh one (nothing watches its bytes).
    fn progress_of(&self, remote: &Multiaddr) -> Arc<Progress> {
        let left = self.handoff.as_ref().and_then(|h| h.lock().take());
        match left {
            Some((addr, p)) if addr == *remote => p,
            _ => self.handshakes.arriving(),
        }
    }
}

/// A transport's error, or a handshake shed for a newcomer.
#[derive(Debug)]
pub enum HandshakeError<E> {
    /// The wrapped transport failed.
    Transport(E),
    /// The handshake gave way to a newcomer (see [`Handshakes`]).
    Shed,
}

impl<E: fmt::Display> fmt::Display for HandshakeError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(e) => e.fmt(f),
            Self::Shed => {
                f.write_str("handshake shed for a newcomer (its source's share was full)")
            }
        }
    }
}

impl<E: Error + 'static> Error for HandshakeError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Transport(e) => Some(e),
            Self::Shed => None,
        }
    }
}

/// An upgrade in progress holding its handshake slot (inbound), or a dial
/// passing through.
pub struct PendingHandshake<F> {
    inner: Pin<Box<F>>,
    admission: Option<Admission>,
    shed: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<F> PendingHandshake<F> {
    fn new(inner: F, admission: Option<Admission>) -> Self {
        let shed = admission.as_ref().map(|a| Box::pin(a.shed()));
        Self {
            inner: Box::pin(inner),
            admission,
            shed,
        }
    }
}

impl<F, O, E> Future for PendingHandshake<F>
where
    F: Future<Output = Result<O, E>>,
{
    type Output = Result<O, HandshakeError<E>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(shed) = &mut self.shed
            && shed.as_mut().poll(cx).is_ready()
        {
            self.shed = None;
            self.admission = None;
            return Poll::Ready(Err(HandshakeError::Shed));
        }
        let r = std::task::ready!(self.inner.as_mut().poll(cx));
        // Done either way: free the slot now, not when the swarm drops us.
        self.shed = None;
        self.admission = None;
        Poll::Ready(r.map_err(HandshakeError::Transport))
    }
}

impl<T> Transport for Guarded<T>
where
    T: Transport + Unpin,
    T::Error: 'static,
{
    type Output = T::Output;
    type Error = HandshakeError<T::Error>;
    type ListenerUpgrade = PendingHandshake<T::ListenerUpgrade>;
    type Dial = PendingHandshake<T::Dial>;

    fn listen_on(
        &mut self,
        id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        self.inner
            .listen_on(id, addr)
            .map_err(|e| e.map(HandshakeError::Transport))
    }

    fn remove_listener(&mut self, id: ListenerId) -> bool {
        self.inner.remove_listener(id)
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        let dial = self
            .inner
            .dial(addr, opts)
            .map_err(|e| e.map(HandshakeError::Transport))?;
        Ok(PendingHandshake::new(dial, None))
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
        for _ in 0..MAX_REFUSED_PER_POLL {
            let ev = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
            match ev {
                TransportEvent::Incoming {
                    listener_id,
                    upgrade,
                    local_addr,
                    send_back_addr,
                } => {
                    let progress = self.progress_of(&send_back_addr);
                    let admission = match ip_of(&send_back_addr) {
                        // Not from an address (relayed): not ours to share.
                        None => None,
                        Some(ip) => match self.handshakes.admit(ip, progress) {
                            Some(a) => Some(a),
                            // Refused: its socket closes with `upgrade`.
                            None => continue,
                        },
                    };
                    return Poll::Ready(TransportEvent::Incoming {
                        listener_id,
                        upgrade: PendingHandshake::new(upgrade, admission),
                        local_addr,
                        send_back_addr,
                    });
                }
                other => {
                    return Poll::Ready(
                        other
                            .map_upgrade(|u| PendingHandshake::new(u, None))
                            .map_err(HandshakeError::Transport),
                    );
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
