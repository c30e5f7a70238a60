//! QUIC for a member: dial only (optionally from a source IP), or, with
//! `--direct-transport=quic`, one listening UDP socket that every QUIC dial
//! leaves from.
//!
//! **Dial only.** libp2p-quic 0.14 dials from a listener's UDP socket when
//! one of the same address family (and, for a loopback target, a loopback
//! address) exists and the dial asks for port reuse; otherwise from a
//! fresh socket bound to `0.0.0.0:0`. So with `--dial-source-ip IP` this
//! wrapper listens on `/ip4/IP/udp/0/quic-v1` by itself (hidden from the
//! swarm) and forces port reuse, and every QUIC dial leaves from `IP` on
//! that one socket. Connections arriving on that socket are dropped
//! unanswered. The socket is opened on the first QUIC dial, not at start:
//! a fleet process hosts thousands of members, most of which only ever
//! dial TCP routers, and each socket costs about two file descriptors and
//! 30–50 KiB. Once open it is kept (and opened again if it ever closes).
//!
//! **Listening** ([`DialQuic::listening`]): the swarm's listener is the
//! member's one UDP socket. Dials in the dialer's role leave from it
//! (port reuse), so the mapping a router observes is the one a punch
//! uses. A punch's dial in the listener's role (dcutr asks for port
//! reuse) is made with a fresh-port request instead: that is what makes
//! libp2p-quic run its hole puncher (random datagrams from the listening
//! socket towards the peer, opening our NAT, while the peer's handshake
//! comes in on the listener and is handed to this dial). With port reuse
//! both ends would send a client's handshake and a punch could make two
//! connections or none.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::{DialOpts, ListenerId, PortUse, TransportError, TransportEvent};
use libp2p::core::{Multiaddr, Transport};

type Inner = libp2p::quic::tokio::Transport;

/// Dial-only QUIC, bound to a source IP when one is given; or listening.
pub(crate) struct DialQuic {
    inner: Inner,
    /// Where dials leave from (`--dial-source-ip`), if anywhere in particular.
    source_ip: Option<IpAddr>,
    /// Our own listener giving dials their source address, once the first
    /// QUIC dial opened it.
    source: Option<ListenerId>,
    /// The swarm's listener is ours (`--direct-transport=quic`).
    listening: bool,
}

impl DialQuic {
    /// QUIC with `config`; with `source_ip`, dials leave from it. Opens no
    /// socket until the first QUIC dial, which must run inside a tokio
    /// runtime (the socket's driver is spawned on it).
    pub(crate) fn new(config: libp2p::quic::Config, source_ip: Option<IpAddr>) -> Self {
        Self {
            inner: Inner::new(config),
            source_ip,
            source: None,
            listening: false,
        }
    }

    /// QUIC that listens where the swarm asks (the member's direct port)
    /// and dials from there (see the module doc).
    pub(crate) fn listening(config: libp2p::quic::Config) -> Self {
        Self {
            inner: Inner::new(config),
            source_ip: None,
            source: None,
            listening: true,
        }
    }

    /// Opens the socket bound to `ip` unless it is open already. A failure
    /// fails this dial (as a TCP dial fails when it cannot bind the source
    /// IP); the next QUIC dial tries again.
    fn open_source(&mut self, ip: IpAddr) -> Result<(), TransportError<libp2p::quic::Error>> {
        if self.source.is_some() {
            return Ok(());
        }
        let id = ListenerId::next();
        let addr = Multiaddr::from(ip)
            .with(Protocol::Udp(0))
            .with(Protocol::QuicV1);
        match self.inner.listen_on(id, addr) {
            Ok(()) => {
                tracing::debug!(%ip, "QUIC source socket opened for the first QUIC dial");
                self.source = Some(id);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(%ip, error = %e, "cannot bind QUIC to the source IP: this dial fails");
                Err(match e {
                    TransportError::Other(e) => TransportError::Other(e),
                    TransportError::MultiaddrNotSupported(a) => TransportError::Other(
                        io::Error::other(format!("cannot listen on {a} for QUIC dials")).into(),
                    ),
                })
            }
        }
    }
}

/// The IP a QUIC address (`/ip4|ip6/…/udp/PORT/quic-v1[/p2p/…]`) points at;
/// `None` for anything the QUIC transport would not dial.
fn quic_target(addr: &Multiaddr) -> Option<IpAddr> {
    match agentmesh_streams::dial::ip_target(addr)? {
        agentmesh_streams::dial::IpTarget::Quic(sa) => Some(sa.ip()),
        agentmesh_streams::dial::IpTarget::Tcp(_) => None,
    }
}

impl Transport for DialQuic {
    type Output = <Inner as Transport>::Output;
    type Error = <Inner as Transport>::Error;
    type ListenerUpgrade = <Inner as Transport>::ListenerUpgrade;
    type Dial = <Inner as Transport>::Dial;

    fn listen_on(
        &mut self,
        id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        if !self.listening {
            return Err(TransportError::MultiaddrNotSupported(addr));
        }
        self.inner.listen_on(id, addr)
    }

    fn remove_listener(&mut self, id: ListenerId) -> bool {
        self.listening && self.inner.remove_listener(id)
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        mut opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        if self.listening {
            opts.port_use = match opts.role {
                // From the listening socket: the mapping routers observe.
                libp2p::core::Endpoint::Dialer => PortUse::Reuse,
                // A punch in the listener's role: the hole puncher.
                libp2p::core::Endpoint::Listener => PortUse::New,
            };
            return self.inner.dial(addr, opts);
        }
        if let (Some(ip), Some(target)) = (self.source_ip, quic_target(&addr)) {
            if ip.is_ipv4() == target.is_ipv4() {
                self.open_source(ip)?;
            }
            // Reuse: dial from our bound socket.
            opts.port_use = PortUse::Reuse;
        }
        self.inner.dial(addr, opts)
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
        if self.listening {
            return Pin::new(&mut self.inner).poll(cx);
        }
        // Every event is our own listener's: none goes to the swarm.
        while let Poll::Ready(event) = Pin::new(&mut self.inner).poll(cx) {
            match event {
                TransportEvent::Incoming { send_back_addr, .. } => {
                    tracing::debug!(%send_back_addr, "inbound QUIC connection dropped: members do not listen");
                }
                TransportEvent::NewAddress { listen_addr, .. } => {
                    tracing::debug!(%listen_addr, "QUIC dials leave from here");
                }
                TransportEvent::ListenerClosed { reason, .. } => {
                    tracing::warn!(
                        ?reason,
                        "QUIC source socket closed: the next QUIC dial opens another"
                    );
                    self.source = None;
                }
                TransportEvent::ListenerError { error, .. } => {
                    tracing::warn!(%error, "QUIC source socket error");
                }
                TransportEvent::AddressExpired { .. } => {}
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentmesh_testkit::udp_sockets_on;
    use futures::future::poll_fn;
    use libp2p::core::Endpoint;
    use libp2p::identity::Keypair;

    use super::*;

    /// A real libp2p QUIC listener (as a router runs) on 127.0.0.1, and
    /// the address it listens on.
    async fn quic_router(key: &Keypair) -> (Inner, Multiaddr) {
        let mut router = Inner::new(libp2p::quic::Config::new(key));
        router
            .listen_on(
                ListenerId::next(),
                "/ip4/127.0.0.1/udp/0/quic-v1".parse().expect("addr"),
            )
            .expect("listen");
        let listen_addr = poll_fn(|cx| match Pin::new(&mut router).poll(cx) {
            Poll::Ready(TransportEvent::NewAddress { listen_addr, .. }) => Poll::Ready(listen_addr),
            Poll::Ready(_) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        });
        let listen_addr = tokio::time::timeout(Duration::from_secs(10), listen_addr)
            .await
            .expect("router listens");
        (router, listen_addr)
    }

    fn dialer() -> DialOpts {
        DialOpts {
            role: Endpoint::Dialer,
            port_use: PortUse::New,
        }
    }

    /// The source socket is opened by the first QUIC dial, not before and
    /// not by a dial the QUIC transport does not take (a TCP address), and
    /// later dials reuse it: exactly one socket on the source IP.
    #[tokio::test]
    async fn source_socket_is_opened_by_the_first_quic_dial_only() {
        let (_router, listen_addr) = quic_router(&Keypair::generate_ed25519()).await;
        // An address no other test uses: the count is of the whole namespace.
        let source = std::net::Ipv4Addr::new(127, 0, 61, 2);
        let key = Keypair::generate_ed25519();
        let mut member = DialQuic::new(libp2p::quic::Config::new(&key), Some(source.into()));
        assert_eq!(udp_sockets_on(source), 0, "opened at start");
        let tcp: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
        assert!(matches!(
            member.dial(tcp, dialer()),
            Err(TransportError::MultiaddrNotSupported(_))
        ));
        assert_eq!(udp_sockets_on(source), 0, "opened by a TCP address");
        let _first = member.dial(listen_addr.clone(), dialer()).expect("ours");
        assert_eq!(udp_sockets_on(source), 1, "after the first QUIC dial");
        let _second = member.dial(listen_addr, dialer()).expect("ours");
        assert_eq!(udp_sockets_on(source), 1, "after the second QUIC dial");
        drop(member);
    }

    /// A real libp2p QUIC listener (as a router runs) on 127.0.0.1 sees a
    /// member's QUIC connection come from the source IP, handshake done.
    #[tokio::test]
    async fn quic_dials_leave_from_the_source_ip() {
        let router_key = Keypair::generate_ed25519();
        let (mut router, listen_addr) = quic_router(&router_key).await;

        let source: IpAddr = "127.0.0.2".parse().expect("ip");
        let member_key = Keypair::generate_ed25519();
        let mut member = DialQuic::new(libp2p::quic::Config::new(&member_key), Some(source));
        let dial = member.dial(listen_addr, dialer()).expect("ours");
        // Drive the member's transport (its socket's events) alongside.
        let member_poll = poll_fn(|cx| {
            let _ = Pin::new(&mut member).poll(cx);
            Poll::<()>::Pending
        });
        let incoming = poll_fn(|cx| match Pin::new(&mut router).poll(cx) {
            Poll::Ready(TransportEvent::Incoming {
                upgrade,
                send_back_addr,
                ..
            }) => Poll::Ready((upgrade, send_back_addr)),
            Poll::Ready(_) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        });
        let handshakes = async {
            let (dialed, (upgrade, from)) = tokio::join!(dial, incoming);
            let accepted = upgrade.await;
            (dialed, accepted, from)
        };
        let (dialed, accepted, from) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::select! {
                r = handshakes => r,
                () = member_poll => unreachable!("polls forever"),
            }
        })
        .await
        .expect("handshake in time");
        let (router_seen, _) = dialed.expect("member's handshake");
        let (member_seen, _) = accepted.expect("router's handshake");
        assert_eq!(router_seen, router_key.public().to_peer_id());
        assert_eq!(member_seen, member_key.public().to_peer_id());
        assert_eq!(
            from.iter().next(),
            Some(Protocol::Ip4("127.0.0.2".parse().expect("ip"))),
            "router saw the connection from {from}"
        );
    }
}
