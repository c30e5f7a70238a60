//! The node's libp2p swarm: a dial-only TCP transport (optionally bound to a
//! source IP) plus the relay-client transport, noise and yamux on both, and
//! QUIC as a fallback (dial only, from the source IP too: see [`quic`]);
//! the relay client, `agentmesh-streams` (our protocols) and ping as behaviours.
//!
//! A member never listens on TCP: everything reaches it through a relayed
//! circuit on one of its routers, so the TCP side only dials.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use libp2p::core::multiaddr::Protocol;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::timeout::TransportTimeout;
use libp2p::core::transport::{DialOpts, ListenerId, TransportError, TransportEvent};
use libp2p::core::upgrade::Version;
use libp2p::core::{Multiaddr, Transport};
use libp2p::identity::Keypair;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{Swarm, noise, ping, relay};
use prometheus_client::metrics::counter::Counter;

mod muxer;
mod quic;

pub(crate) use muxer::WindowLimits;

/// The node's behaviours.
#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub(crate) struct Behaviour {
    pub(crate) relay: relay::client::Behaviour,
    pub(crate) stream: agentmesh_streams::Behaviour,
    pub(crate) ping: ping::Behaviour,
}

/// Why the swarm could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// The noise configuration could not be made from the key.
    #[error("noise: {0}")]
    Noise(#[from] noise::Error),
    /// The yamux limits cannot be used.
    #[error("yamux: {0}")]
    Yamux(#[from] muxer::LimitsError),
    /// The task building the transport failed.
    #[error("transport set-up task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

type Direct = libp2p::core::transport::Boxed<(libp2p::PeerId, StreamMuxerBox)>;

/// TCP (with the relay client's transport) or QUIC, upgraded; and the
/// relay client behaviour paired with it.
/// `yamux` is the member's bounded yamux for TCP and relayed connections
/// alike (QUIC has its own flow control).
fn direct(
    key: &Keypair,
    source_ip: Option<IpAddr>,
    yamux: muxer::YamuxUpgrade,
) -> Result<(Direct, relay::client::Behaviour), noise::Error> {
    let peer_id = key.public().to_peer_id();
    let (relay_transport, relay_client) = relay::client::new(peer_id);
    let tcp = relay_transport
        .or_transport(DialTcp { source_ip })
        .upgrade(Version::V1Lazy)
        .authenticate(noise::Config::new(key)?)
        .multiplex(yamux)
        .map(|(p, m), _| (p, StreamMuxerBox::new(m)));
    // QUIC (dial only, from the source IP when given): routers may announce
    // it; `Candidate` puts TCP addresses first, so QUIC is the fallback.
    let quic = quic::DialQuic::new(libp2p::quic::Config::new(key), source_ip)
        .map(|(p, c), _| (p, StreamMuxerBox::new(c)));
    let direct = tcp
        .or_transport(quic)
        .map(|either, _| either.into_inner())
        .boxed();
    Ok((direct, relay_client))
}

/// Builds the swarm for `key`. `idle` closes connections without streams or
/// reservations after that long (transit connections, finished circuits).
///
/// `/dns4`, `/dns6` and `/dns` addresses (routers announcing names, e.g. a
/// Kubernetes Service) are resolved by libp2p's DNS transport, for TCP and
/// QUIC alike and inside the connect timeout; it reads the system's
/// resolver configuration, so this runs on a blocking thread. Without one,
/// the node goes on without it (TCP dials still resolve names themselves).
/// `streams` bounds the inbound queues of our own protocols, `pending` the
/// opens waiting for a dial; `yamux` the receive window of every TCP and
/// relayed connection, `yamux_dropped` counts inbound streams dropped
/// past the muxer's buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn build_swarm(
    key: &Keypair,
    source_ip: Option<IpAddr>,
    connect_timeout: Duration,
    idle: Duration,
    ping: ping::Config,
    streams: agentmesh_streams::Config,
    pending: agentmesh_streams::PendingOpenLimits,
    yamux: WindowLimits,
    yamux_dropped: Counter,
) -> Result<Swarm<Behaviour>, BuildError> {
    let peer_id = key.public().to_peer_id();
    let k = key.clone();
    let upgrade = muxer::yamux_upgrade(yamux, yamux_dropped)?;
    tracing::debug!(?yamux, "yamux limits");
    let (transport, relay_client) = tokio::task::spawn_blocking(move || {
        let (inner, relay_client) = direct(&k, source_ip, upgrade.clone())?;
        let transport = match libp2p::dns::tokio::Transport::system(inner) {
            Ok(dns) => TransportTimeout::new(dns, connect_timeout).boxed(),
            Err(e) => {
                tracing::warn!(error = %e, "no system DNS configuration: /dns addresses are dialed over TCP only");
                // `system` consumed the first transport: make another.
                let (inner, relay_client) = direct(&k, source_ip, upgrade)?;
                return Ok::<_, BuildError>((
                    TransportTimeout::new(inner, connect_timeout).boxed(),
                    relay_client,
                ));
            }
        };
        Ok((transport, relay_client))
    })
    .await??;
    let behaviour = Behaviour {
        relay: relay_client,
        stream: agentmesh_streams::Behaviour::with_limits(streams, pending),
        ping: ping::Behaviour::new(ping),
    };
    Ok(Swarm::new(
        transport,
        behaviour,
        peer_id,
        swarm_config(idle),
    ))
}

/// The swarm's settings. Streams the member opens negotiate their protocol
/// optimistically (multistream-select `V1Lazy`): the protocol's name goes
/// out with the first bytes written, not a round trip earlier. A member
/// opens streams only to routers and members, which speak all of its
/// protocols (auth, catalog, calls, relay HOP, ping), so waiting for the
/// confirmation only costs time, and under load it cost more than a
/// router's `--auth-first-byte-timeout-ms`: a slow member looked like a
/// silent stranger and its source's failed logins grew. Sent this way,
/// the request reaches the router with the stream. A peer lacking a
/// protocol fails the first read rather than the open; nothing on the
/// member tells those apart.
fn swarm_config(idle: Duration) -> libp2p::swarm::Config {
    libp2p::swarm::Config::with_tokio_executor()
        .with_idle_connection_timeout(idle)
        .with_substream_upgrade_protocol_override(Version::V1Lazy)
}

/// Dial-only TCP over tokio. With `source_ip`, every outgoing socket is bound
/// to `source_ip:0` first, so one process can hold more connections to one
/// router than a single source address has ephemeral ports. `/dns*`
/// addresses are resolved with the system resolver (when the DNS transport
/// in front has not already).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DialTcp {
    pub(crate) source_ip: Option<IpAddr>,
}

/// Where a dial goes: an IP or a name to resolve, and a port.
enum Target {
    Ip(SocketAddr),
    Dns(String, u16),
}

fn target_of(addr: &Multiaddr) -> Option<Target> {
    let mut iter = addr.iter();
    let host = iter.next()?;
    let port = match iter.next()? {
        Protocol::Tcp(p) => p,
        _ => return None,
    };
    // Only `/p2p/ID` may follow; anything else (p2p-circuit, ws...) is not ours.
    for rest in iter {
        if !matches!(rest, Protocol::P2p(_)) {
            return None;
        }
    }
    if port == 0 {
        return None;
    }
    match host {
        Protocol::Ip4(ip) if !ip.is_unspecified() => {
            Some(Target::Ip(SocketAddr::new(ip.into(), port)))
        }
        Protocol::Ip6(ip) if !ip.is_unspecified() => {
            Some(Target::Ip(SocketAddr::new(ip.into(), port)))
        }
        Protocol::Dns(h) | Protocol::Dns4(h) | Protocol::Dns6(h) => {
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
        assert!(target_of(&ok).is_some());
        let dns: Multiaddr = "/dns4/router.example/tcp/4001".parse().expect("addr");
        assert!(matches!(target_of(&dns), Some(Target::Dns(_, 4001))));
        for bad in [
            "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA/p2p-circuit",
            "/ip4/0.0.0.0/tcp/4001",
            "/ip4/127.0.0.1/tcp/0",
            "/ip4/127.0.0.1/udp/4001/quic-v1",
        ] {
            let a: Multiaddr = bad.parse().expect("addr");
            assert!(target_of(&a).is_none(), "{bad}");
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
}

#[cfg(test)]
mod tests_optimistic;
