//! [`DialTcp`]: a dial-only TCP transport over tokio whose sockets may be
//! bound to one source IP before they connect. libp2p's own TCP transport
//! cannot bind a dial to an address without listening on it. Members use
//! it (`--dial-source-ip`: one process holding more connections to a
//! router than one address has ephemeral ports), and so does the hostile
//! harness (an attack from an address of its own, any of 127.0.0.0/8 on
//! loopback, counted by the router as that source). [`ip_target`] is the
//! address check it shares with the member's QUIC dialer.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt as _;
use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::{DialOpts, ListenerId, TransportError, TransportEvent};
use libp2p::core::{Multiaddr, Transport};

/// Dial-only TCP over tokio. With `source_ip`, every outgoing socket is
/// bound to `source_ip:0` first. `/dns*` addresses are resolved with the
/// system resolver (when a DNS transport in front has not already), to an
/// address of the source IP's family. Sockets are `TCP_NODELAY`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DialTcp {
    /// Where dials leave from, if anywhere in particular.
    pub source_ip: Option<IpAddr>,
}

/// Where a TCP dial goes: an IP or a name to resolve, and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Ip(SocketAddr),
    Dns(String, u16),
}

/// What an address dialed over IP is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpTarget {
    /// `/ip4|ip6/A/tcp/P`.
    Tcp(SocketAddr),
    /// `/ip4|ip6/A/udp/P/quic-v1`.
    Quic(SocketAddr),
}

/// The socket address a plain TCP or QUIC address points at
/// (`/ip4|ip6/A/tcp/P` or `/ip4|ip6/A/udp/P/quic-v1`, a trailing `/p2p/ID`
/// allowed); `None` for anything else (names, circuits, port 0, an
/// unspecified address).
pub fn ip_target(addr: &Multiaddr) -> Option<IpTarget> {
    let mut iter = addr.iter();
    let ip: IpAddr = match iter.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    let target = match iter.next()? {
        Protocol::Tcp(port) => IpTarget::Tcp(SocketAddr::new(ip, port)),
        Protocol::Udp(port) if matches!(iter.next()?, Protocol::QuicV1) => {
            IpTarget::Quic(SocketAddr::new(ip, port))
        }
        _ => return None,
    };
    let (IpTarget::Tcp(sa) | IpTarget::Quic(sa)) = target;
    (sa.port() != 0 && !ip.is_unspecified() && only_peer_ids(iter)).then_some(target)
}

/// Whether only `/p2p/ID` follows (anything else, p2p-circuit or ws, is
/// not a plain dial).
fn only_peer_ids<'a>(mut rest: impl Iterator<Item = Protocol<'a>>) -> bool {
    rest.all(|p| matches!(p, Protocol::P2p(_)))
}

fn target_of(addr: &Multiaddr) -> Option<Target> {
    if let Some(IpTarget::Tcp(sa)) = ip_target(addr) {
        return Some(Target::Ip(sa));
    }
    let mut iter = addr.iter();
    let (Protocol::Dns(h) | Protocol::Dns4(h) | Protocol::Dns6(h)) = iter.next()? else {
        return None;
    };
    match iter.next()? {
        Protocol::Tcp(port) if port != 0 && only_peer_ids(iter) => {
            Some(Target::Dns(h.to_string(), port))
        }
        _ => None,
    }
}

async fn connect(target: Target, source_ip: Option<IpAddr>) -> io::Result<tokio::net::TcpStream> {
    let addr = match target {
        Target::Ip(a) => a,
        Target::Dns(host, port) => {
            let mut addrs = tokio::net::lookup_host((host.as_str(), port)).await?;
            let want_v4 = source_ip.map(|ip| ip.is_ipv4());
            addrs
                .find(|a| want_v4.is_none_or(|v4| a.is_ipv4() == v4))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{host} has no usable address"),
                    )
                })?
        }
    };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_nodelay(true)?;
    if let Some(ip) = source_ip {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(addr).await
}

impl Transport for DialTcp {
    type Output = libp2p::tcp::tokio::TcpStream;
    type Error = io::Error;
    type ListenerUpgrade = futures::future::Pending<Result<Self::Output, io::Error>>;
    type Dial = Pin<Box<dyn Future<Output = Result<Self::Output, io::Error>> + Send>>;

    fn listen_on(
        &mut self,
        _id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<io::Error>> {
        Err(TransportError::MultiaddrNotSupported(addr))
    }

    fn remove_listener(&mut self, _id: ListenerId) -> bool {
        false
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        _opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<io::Error>> {
        let Some(target) = target_of(&addr) else {
            return Err(TransportError::MultiaddrNotSupported(addr));
        };
        let source_ip = self.source_ip;
        Ok(async move {
            let s = connect(target, source_ip).await?;
            Ok(libp2p::tcp::tokio::TcpStream(s))
        }
        .boxed())
    }

    fn poll(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, io::Error>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_tcp_addresses_are_ours() {
        let ok: Multiaddr =
            "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
                .parse()
                .expect("addr");
        assert_eq!(
            target_of(&ok),
            Some(Target::Ip("127.0.0.1:4001".parse().expect("sa")))
        );
        let dns: Multiaddr = "/dns4/router.example/tcp/4001".parse().expect("addr");
        assert!(matches!(target_of(&dns), Some(Target::Dns(_, 4001))));
        for bad in [
            "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA/p2p-circuit",
            "/ip4/127.0.0.1/tcp/4001/p2p-circuit",
            "/ip4/0.0.0.0/tcp/4001",
            "/ip4/127.0.0.1/tcp/0",
            "/ip4/127.0.0.1/udp/4001/quic-v1",
        ] {
            let a: Multiaddr = bad.parse().expect("addr");
            assert!(target_of(&a).is_none(), "{bad}");
        }
    }

    #[test]
    fn quic_addresses_are_told_apart() {
        let quic: Multiaddr = "/ip4/127.0.0.1/udp/4001/quic-v1".parse().expect("addr");
        assert_eq!(
            ip_target(&quic),
            Some(IpTarget::Quic("127.0.0.1:4001".parse().expect("sa")))
        );
        for bad in ["/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/udp/4001"] {
            let a: Multiaddr = bad.parse().expect("addr");
            assert!(ip_target(&a).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn dials_bind_to_the_source_ip() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let source: IpAddr = "127.0.0.2".parse().expect("ip");
        let mut t = DialTcp {
            source_ip: Some(source),
        };
        let addr: Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse().expect("addr");
        let dial = t
            .dial(
                addr,
                DialOpts {
                    role: libp2p::core::Endpoint::Dialer,
                    port_use: libp2p::core::transport::PortUse::New,
                },
            )
            .expect("ours");
        let (dialed, accepted) = tokio::join!(dial, listener.accept());
        let _s = dialed.expect("connected");
        let (_, peer) = accepted.expect("accepted");
        assert_eq!(peer.ip(), source);
    }

    #[tokio::test]
    async fn a_dial_leaves_from_the_source_ip() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let to = l.local_addr().expect("addr");
        let from: IpAddr = "127.0.0.66".parse().expect("ip");
        let (dialed, accepted) = tokio::join!(connect(Target::Ip(to), Some(from)), l.accept());
        let _dialed = dialed.expect("connect");
        let (_, peer) = accepted.expect("accept");
        assert_eq!(peer.ip(), from);
    }
}
