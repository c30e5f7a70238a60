//! [`ReuseTcp`]: the member's TCP transport when direct connections are
//! on. It listens on one port (`--listen-port`, on `--listen-ip`) and
//! every dial asking for port reuse (libp2p's default, so routers,
//! transit routers and hole punches alike) leaves from that same port,
//! bound to `--dial-source-ip` when one is given.
//!
//! Why: a NAT maps one internal (address, port) to a public one. The
//! routers observe the mapping of the connection the member made to them
//! and tell the member (admission answer); a punch works only if it
//! leaves from the socket address that mapping belongs to. libp2p-tcp's
//! own port reuse binds dials to `0.0.0.0:PORT` (never to a source IP)
//! and, when the tuple is still taken, quietly dials from a new port, so
//! the punch leaves from a port nobody observed.
//!
//! **TIME_WAIT.** With a fixed local port every redial of one
//! destination reuses one 4-tuple; the side that closed it first holds it
//! in TIME_WAIT for 60 s and `connect` fails with `EADDRNOTAVAIL`
//! (`EADDRINUSE` when another live socket holds it). The dial then leaves
//! from a fresh port (a call or an attach must not wait a minute), counted
//! in `agentmesh_node_port_reuse_fallbacks_total`, and the destination is
//! noted in [`ReuseLog`]: the address a router observes on such a
//! connection is not the listening port's mapping, so the engine leaves it
//! out of the NAT classification rather than misread the NAT as
//! endpoint-dependent. A punch's dial (the direct-connection behaviour
//! marks it in [`ReuseLog`]) never falls back: from a fresh port its NAT
//! mapping is new, so it fails where the peer is behind a filtering NAT
//! and, where the peer can be reached unsolicited, makes a second direct
//! connection beside the one holding the tuple (dcutr's retry after the
//! first attempt connected). It fails instead and the call stays relayed
//! or on the connection already up; the next punch, after the backoff,
//! leaves from the listening port again.
//!
//! **A punch that lands on the listening port.** In a punch both sides
//! dial at once from their listening ports, the side the relayed
//! connection reached in the listener's role (libp2p-dcutr's role
//! override), the other as the dialer. When one side can be reached
//! unsolicited (a public host, a full-cone NAT) the other's SYN may arrive
//! before its own dial left: the listener accepts it, and its own dial
//! finds the tuple taken. Upgraded as an inbound connection it would pair
//! two listeners (neither speaks first, the handshake hangs until the
//! connect timeout) and the fallback from a fresh port is dropped by a
//! filtering NAT on the far side. So a connection accepted on the
//! listening port is held back from the swarm (`held`) until its remote
//! sends a byte (a dialer speaks first: an ordinary inbound connection)
//! or for at most [`held::HOLD`]; a dial from the listening port whose
//! tuple is taken first waits up to [`CLAIM_WAIT`] for a held connection
//! from its destination and, if one comes, takes it as its own (counted in
//! `agentmesh_node_port_reuse_adopted_total`): the 4-tuple the punch was
//! meant to open, in the role the punch gave this side. The swarm's
//! upgrade of that inbound connection fails (it is the dial's now). Where
//! none comes (TIME_WAIT) the dial falls back as above, [`CLAIM_WAIT`]
//! later; a punch's dial fails instead (one in the listener's role, from
//! a fresh port, would reach the peer's listening port as a second
//! listener and hang to the connect timeout). That is also what happens
//! when the peer's SYN took the tuple and spoke before we could take its
//! connection over (two members on one host behind a hairpinning NAT do
//! it every time): its connection is the punch's, up as inbound.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

pub(crate) use crate::direct::ReuseLog;

use agentmesh_streams::dial::{IpTarget, ip_target};
use futures::FutureExt as _;
use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::{DialOpts, ListenerId, PortUse, TransportError, TransportEvent};
use libp2p::core::{Endpoint, Multiaddr, Transport};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;

mod held;

/// Connections the listening socket queues before the swarm accepts them.
const LISTEN_BACKLOG: u32 = 128;

/// How long a dial from the listening port whose tuple is taken waits for
/// a connection from its destination to be accepted and held (about one
/// round trip: the far side's SYN arrived, its handshake is completing).
pub(crate) const CLAIM_WAIT: Duration = Duration::from_millis(500);

/// The one listener.
struct Listener {
    id: ListenerId,
    socket: tokio::net::TcpListener,
    /// Its bound address (port resolved when 0 was asked).
    local: SocketAddr,
    /// `NewAddress` not reported yet.
    announce: bool,
}

/// TCP that listens on one port and dials from it; see the module doc.
pub(crate) struct ReuseTcp {
    source_ip: Option<IpAddr>,
    listener: Option<Listener>,
    /// The bound listening address, shared with dial futures.
    bound: Arc<Mutex<Option<SocketAddr>>>,
    log: ReuseLog,
    fallbacks: Counter,
    /// Accepted connections a dial may take over.
    held: held::Held,
    adopted: Counter,
    /// `TCP_USER_TIMEOUT` of every socket, dialed or accepted.
    user_timeout: Option<std::time::Duration>,
}

impl ReuseTcp {
    /// A transport whose dials leave from `source_ip` (if any), counting
    /// fallbacks to a fresh port in `fallbacks` and noting them in `log`.
    pub(crate) fn new(source_ip: Option<IpAddr>, log: ReuseLog, fallbacks: Counter) -> Self {
        Self {
            source_ip,
            listener: None,
            bound: Arc::new(Mutex::new(None)),
            log,
            fallbacks,
            held: held::Held::default(),
            adopted: Counter::default(),
            user_timeout: None,
        }
    }

    /// The same, every socket's unacknowledged bytes bounded by
    /// `user_timeout` (`TCP_USER_TIMEOUT`; `None`: the kernel's default):
    /// a path that stops carrying bytes fails its connection within it.
    pub(crate) fn with_user_timeout(mut self, user_timeout: Option<std::time::Duration>) -> Self {
        self.user_timeout = user_timeout;
        self
    }

    /// The same, counting in `adopted` the dials that took over a
    /// connection accepted from their destination.
    pub(crate) fn with_adopted(mut self, adopted: Counter) -> Self {
        self.adopted = adopted;
        self
    }
}

/// Sets `TCP_USER_TIMEOUT` on `socket` when a bound is given.
fn bound_unacked<S: std::os::fd::AsFd>(
    socket: &S,
    user_timeout: Option<std::time::Duration>,
) -> io::Result<()> {
    match user_timeout {
        Some(d) => socket2::SockRef::from(socket).set_tcp_user_timeout(Some(d)),
        None => Ok(()),
    }
}

/// A TCP socket of `addr`'s family with `SO_REUSEADDR` and `SO_REUSEPORT`
/// (the listener and every dial from its port must all set both).
fn reusable_socket(addr: &SocketAddr) -> io::Result<tokio::net::TcpSocket> {
    let s = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.set_reuseport(true)?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// The local address a dial to `to` binds, if any: the listening port
/// (when reuse is asked and a listener of that family exists) on the
/// source IP, else the listener's IP when it is specific, else the
/// unspecified address; without reuse, the source IP and any port.
fn bind_for(
    to: &SocketAddr,
    port_use: PortUse,
    listening: Option<SocketAddr>,
    source_ip: Option<IpAddr>,
) -> Option<SocketAddr> {
    let same_family = |ip: &IpAddr| ip.is_ipv4() == to.is_ipv4();
    let source_ip = source_ip.filter(same_family);
    match listening.filter(|l| same_family(&l.ip())) {
        Some(l) if port_use == PortUse::Reuse => {
            let ip = source_ip
                .or(Some(l.ip()).filter(|ip| !ip.is_unspecified()))
                .unwrap_or(if to.is_ipv4() {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                } else {
                    IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                });
            Some(SocketAddr::new(ip, l.port()))
        }
        _ => source_ip.map(|ip| SocketAddr::new(ip, 0)),
    }
}

/// Whether a connect from a fixed port failed because its tuple is taken.
fn tuple_taken(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::AddrNotAvailable | io::ErrorKind::AddrInUse
    )
}

/// What a dial shares with the transport.
#[derive(Clone)]
struct Shared {
    source_ip: Option<IpAddr>,
    log: ReuseLog,
    fallbacks: Counter,
    held: held::Held,
    adopted: Counter,
    user_timeout: Option<std::time::Duration>,
}

/// `may_fall_back`: whether the dial may leave from a fresh port when its
/// tuple is taken; never for a punch's (the direct-connection behaviour
/// marked it, or it dials in the listener's role, libp2p-dcutr's role
/// override), see below.
async fn connect(
    to: SocketAddr,
    bind: Option<SocketAddr>,
    may_fall_back: bool,
    shared: Shared,
) -> io::Result<tokio::net::TcpStream> {
    let Shared {
        source_ip,
        log,
        fallbacks,
        held,
        adopted,
        user_timeout,
    } = shared;
    let reused = bind.is_some_and(|b| b.port() != 0);
    let s = reusable_socket(&to)?;
    bound_unacked(&s, user_timeout)?;
    if let Some(b) = bind {
        s.bind(b)?;
    }
    match s.connect(to).await {
        Ok(stream) => {
            if reused {
                log.note(to, false);
            }
            Ok(stream)
        }
        Err(e) if reused && tuple_taken(&e) => {
            if let Some(stream) = held.claim(to, CLAIM_WAIT).await {
                tracing::debug!(%to, "the destination connected to the listening port first (a punch): the dial takes that connection");
                adopted.inc();
                log.note(to, false);
                return Ok(stream);
            }
            if !may_fall_back {
                // The tuple is taken by a connection between the two
                // listening ports, up already (the peer's punch delivered
                // as an ordinary inbound one, or our own dial of an
                // earlier attempt), or by TIME_WAIT, where a fresh port's
                // new NAT mapping fails the punch anyway. From a fresh
                // port a dial in the listener's role would reach the
                // peer's listening port as a second listener and hang to
                // the connect timeout; one in the dialer's role would make
                // a second direct connection wherever the peer can be
                // reached unsolicited.
                tracing::debug!(%to, ?bind, error = %e, "a punch dial finds its tuple taken and nothing to take over: it fails rather than dial from a fresh port");
                return Err(e);
            }
            tracing::debug!(%to, ?bind, error = %e, "the listening port cannot reach this destination now (tuple in TIME_WAIT or taken): dialing from a fresh port");
            fallbacks.inc();
            log.note(to, true);
            let s = reusable_socket(&to)?;
            bound_unacked(&s, user_timeout)?;
            if let Some(ip) = source_ip.filter(|ip| ip.is_ipv4() == to.is_ipv4()) {
                s.bind(SocketAddr::new(ip, 0))?;
            }
            s.connect(to).await
        }
        Err(e) => Err(e),
    }
}

fn listen_target(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut it = addr.iter();
    let ip: IpAddr = match it.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    let Protocol::Tcp(port) = it.next()? else {
        return None;
    };
    it.next().is_none().then_some(SocketAddr::new(ip, port))
}

/// `/ip4|ip6/A/tcp/P` of a socket address.
pub(crate) fn tcp_multiaddr(a: SocketAddr) -> Multiaddr {
    Multiaddr::from(a.ip()).with(Protocol::Tcp(a.port()))
}

impl ReuseTcp {
    fn bind_listener(&mut self, id: ListenerId, at: SocketAddr) -> io::Result<()> {
        let s = reusable_socket(&at)?;
        s.bind(at)?;
        let socket = s.listen(LISTEN_BACKLOG)?;
        let local = socket.local_addr()?;
        *self.bound.lock() = Some(local);
        self.listener = Some(Listener {
            id,
            socket,
            local,
            announce: true,
        });
        Ok(())
    }
}

impl Transport for ReuseTcp {
    type Output = libp2p::tcp::tokio::TcpStream;
    type Error = io::Error;
    type ListenerUpgrade = Pin<Box<dyn Future<Output = Result<Self::Output, io::Error>> + Send>>;
    type Dial = Pin<Box<dyn Future<Output = Result<Self::Output, io::Error>> + Send>>;

    fn listen_on(
        &mut self,
        id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<io::Error>> {
        let Some(at) = listen_target(&addr) else {
            return Err(TransportError::MultiaddrNotSupported(addr));
        };
        if self.listener.is_some() {
            // One listening port per member: its mapping is the one
            // routers observe.
            return Err(TransportError::Other(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the member listens on one TCP port only",
            )));
        }
        self.bind_listener(id, at).map_err(TransportError::Other)
    }

    fn remove_listener(&mut self, id: ListenerId) -> bool {
        if self.listener.as_ref().is_some_and(|l| l.id == id) {
            self.listener = None;
            *self.bound.lock() = None;
            return true;
        }
        false
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<io::Error>> {
        let Some(IpTarget::Tcp(to)) = ip_target(&addr) else {
            return Err(TransportError::MultiaddrNotSupported(addr));
        };
        let bind = bind_for(&to, opts.port_use, *self.bound.lock(), self.source_ip);
        // Taken whatever the role, so no mark outlives its dial.
        let punch = self.log.take_punch(&to);
        let may_fall_back = opts.role == Endpoint::Dialer && !punch;
        let shared = Shared {
            source_ip: self.source_ip,
            log: self.log.clone(),
            fallbacks: self.fallbacks.clone(),
            held: self.held.clone(),
            adopted: self.adopted.clone(),
            user_timeout: self.user_timeout,
        };
        Ok(async move {
            let s = connect(to, bind, may_fall_back, shared).await?;
            Ok(libp2p::tcp::tokio::TcpStream(s))
        }
        .boxed())
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, io::Error>> {
        let this = &mut *self;
        let Some(l) = this.listener.as_mut() else {
            return Poll::Pending;
        };
        if l.announce {
            l.announce = false;
            return Poll::Ready(TransportEvent::NewAddress {
                listener_id: l.id,
                listen_addr: tcp_multiaddr(l.local),
            });
        }
        match l.socket.poll_accept(cx) {
            Poll::Ready(Ok((stream, remote))) => {
                let _ = stream.set_nodelay(true);
                if let Err(error) = bound_unacked(&stream, this.user_timeout) {
                    tracing::debug!(%remote, %error, "TCP_USER_TIMEOUT not set on an accepted connection");
                }
                let upgrade = this
                    .held
                    .hold(remote, stream, held::HOLD)
                    .map(|r| r.map(libp2p::tcp::tokio::TcpStream));
                Poll::Ready(TransportEvent::Incoming {
                    listener_id: l.id,
                    upgrade: upgrade.boxed(),
                    local_addr: tcp_multiaddr(l.local),
                    send_back_addr: tcp_multiaddr(remote),
                })
            }
            // A failed accept (out of descriptors, a connection reset
            // before it was taken) does not end the listener.
            Poll::Ready(Err(error)) => Poll::Ready(TransportEvent::ListenerError {
                listener_id: l.id,
                error,
            }),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
