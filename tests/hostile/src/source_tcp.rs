//! A dial-only TCP transport whose sockets are bound to one source IP
//! before they connect, so an attack comes from an address of its own
//! (any of 127.0.0.0/8 on loopback) and the router counts it as that
//! source. libp2p's own TCP transport cannot bind a dial to an address
//! without listening on it, hence this small transport; noise and yamux
//! are libp2p's.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::{Boxed, DialOpts, ListenerId, TransportError, TransportEvent};
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId, Transport, noise, yamux};

/// Deadline of one dial's TCP connect, noise and yamux handshakes.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(20);

/// Plain TCP from `source_ip:0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SourceTcp {
    pub(crate) source_ip: IpAddr,
}

/// `/ip4/A/tcp/P` or `/ip6/A/tcp/P` (a trailing `/p2p/ID` allowed).
fn target_of(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut iter = addr.iter();
    let ip: IpAddr = match iter.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    let Protocol::Tcp(port) = iter.next()? else {
        return None;
    };
    iter.all(|p| matches!(p, Protocol::P2p(_)))
        .then_some(SocketAddr::new(ip, port))
}

async fn connect(to: SocketAddr, from: IpAddr) -> io::Result<tokio::net::TcpStream> {
    let socket = if to.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_nodelay(true)?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

impl Transport for SourceTcp {
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
        let Some(to) = target_of(&addr) else {
            return Err(TransportError::MultiaddrNotSupported(addr));
        };
        let from = self.source_ip;
        Ok(async move { Ok(libp2p::tcp::tokio::TcpStream(connect(to, from).await?)) }.boxed())
    }

    fn poll(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, io::Error>> {
        Poll::Pending
    }
}

/// TCP from `source_ip`, noise with `key`, yamux.
pub(crate) fn transport(
    key: &Keypair,
    source_ip: IpAddr,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, noise::Error> {
    Ok(SourceTcp { source_ip }
        .upgrade(Version::V1Lazy)
        .authenticate(noise::Config::new(key)?)
        .multiplex(yamux::Config::default())
        .timeout(UPGRADE_TIMEOUT)
        .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)))
        .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_tcp_addresses_are_dialed() {
        let ok: Multiaddr =
            "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
                .parse()
                .expect("addr");
        assert_eq!(target_of(&ok), Some("127.0.0.1:4001".parse().expect("sa")));
        for bad in [
            "/ip4/127.0.0.1/udp/4001/quic-v1",
            "/dns4/router.example/tcp/4001",
            "/ip4/127.0.0.1/tcp/4001/p2p-circuit",
        ] {
            let a: Multiaddr = bad.parse().expect("addr");
            assert!(target_of(&a).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_dial_leaves_from_the_source_ip() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let to = l.local_addr().expect("addr");
        let from: IpAddr = "127.0.0.66".parse().expect("ip");
        let (dialed, accepted) = tokio::join!(connect(to, from), l.accept());
        let _dialed = dialed.expect("connect");
        let (_, peer) = accepted.expect("accept");
        assert_eq!(peer.ip(), from);
    }
}
