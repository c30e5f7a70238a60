//! QUIC for a member: dial only, optionally from a source IP.
//!
//! libp2p-quic 0.14 dials from a listener's UDP socket when one of the same
//! address family (and, for a loopback target, a loopback address) exists
//! and the dial asks for port reuse; otherwise from a fresh socket bound to
//! `0.0.0.0:0`. So with `--dial-source-ip IP` this wrapper listens on
//! `/ip4/IP/udp/0/quic-v1` by itself (hidden from the swarm: a member never
//! listens) and forces port reuse, and every QUIC dial leaves from `IP` on
//! that one socket. Connections arriving on that socket are dropped
//! unanswered.

use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::{DialOpts, ListenerId, PortUse, TransportError, TransportEvent};
use libp2p::core::{Multiaddr, Transport};

type Inner = libp2p::quic::tokio::Transport;

/// Dial-only QUIC, bound to a source IP when one is given.
pub(crate) struct DialQuic {
    inner: Inner,
    /// Our own listener giving dials their source address.
    source: Option<ListenerId>,
}

impl DialQuic {
    /// QUIC with `config`; with `source_ip`, dials leave from it. Must run
    /// inside a tokio runtime (the socket's driver is spawned on it).
    pub(crate) fn new(config: libp2p::quic::Config, source_ip: Option<IpAddr>) -> Self {
        let mut inner = Inner::new(config);
        let source = source_ip.and_then(|ip| {
            let id = ListenerId::next();
            let addr = Multiaddr::from(ip)
                .with(Protocol::Udp(0))
                .with(Protocol::QuicV1);
            match inner.listen_on(id, addr) {
                Ok(()) => Some(id),
                Err(e) => {
                    tracing::warn!(%ip, error = %e, "cannot bind QUIC to the source IP: QUIC dials leave from any address");
                    None
                }
            }
        });
        Self { inner, source }
    }
}

impl Transport for DialQuic {
    type Output = <Inner as Transport>::Output;
    type Error = <Inner as Transport>::Error;
    type ListenerUpgrade = <Inner as Transport>::ListenerUpgrade;
    type Dial = <Inner as Transport>::Dial;

    fn listen_on(
        &mut self,
        _id: ListenerId,
        addr: Multiaddr,
    ) -> Result<(), TransportError<Self::Error>> {
        Err(TransportError::MultiaddrNotSupported(addr))
    }

    fn remove_listener(&mut self, _id: ListenerId) -> bool {
        false
    }

    fn dial(
        &mut self,
        addr: Multiaddr,
        mut opts: DialOpts,
    ) -> Result<Self::Dial, TransportError<Self::Error>> {
        if self.source.is_some() {
            // Reuse: dial from our bound socket.
            opts.port_use = PortUse::Reuse;
        }
        self.inner.dial(addr, opts)
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<TransportEvent<Self::ListenerUpgrade, Self::Error>> {
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
                        "QUIC source socket closed: QUIC dials leave from any address now"
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

    use futures::future::poll_fn;
    use libp2p::core::Endpoint;
    use libp2p::identity::Keypair;

    use super::*;

    /// A real libp2p QUIC listener (as a router runs) on 127.0.0.1 sees a
    /// member's QUIC connection come from the source IP, handshake done.
    #[tokio::test]
    async fn quic_dials_leave_from_the_source_ip() {
        let router_key = Keypair::generate_ed25519();
        let mut router = Inner::new(libp2p::quic::Config::new(&router_key));
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

        let source: IpAddr = "127.0.0.2".parse().expect("ip");
        let member_key = Keypair::generate_ed25519();
        let mut member = DialQuic::new(libp2p::quic::Config::new(&member_key), Some(source));
        let dial = member
            .dial(
                listen_addr,
                DialOpts {
                    role: Endpoint::Dialer,
                    port_use: PortUse::New,
                },
            )
            .expect("ours");
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
