//! A stranger's connection to a router: a fresh PeerId each time, TCP from
//! one source address (`agentmesh_streams::dial::DialTcp`), our streams behaviour and nothing
//! else (no credential is ever shown). The router attacks dial with it and
//! then do with the connection what their attack is about.

use std::net::IpAddr;
use std::time::Duration;

use agentmesh_streams::{Behaviour, Control};
use anyhow::Context as _;
use futures::StreamExt as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, Swarm};
use tokio::time::Instant;

/// A stranger connected to the router; the caller drives `swarm`.
pub(crate) struct Stranger {
    /// The swarm holding the one connection.
    pub(crate) swarm: Swarm<Behaviour>,
    /// Opens streams on it.
    pub(crate) control: Control,
}

/// How a stranger's dial ended.
pub(crate) enum Dialed {
    /// Connected.
    Connected(Box<Stranger>),
    /// The dial did not end in a connection (refused, or timed out).
    Failed,
    /// The deadline passed first.
    Deadline,
}

/// Dials `router` at `router_addr` from `source_ip` as a fresh PeerId and
/// waits until connected, the dial fails, or `deadline`. Connections idle
/// for `idle` close (the attack decides when to stop before that).
pub(crate) async fn dial(
    router_addr: &Multiaddr,
    router: PeerId,
    source_ip: IpAddr,
    idle: Duration,
    deadline: Instant,
) -> anyhow::Result<Dialed> {
    let key = Keypair::generate_ed25519();
    let transport = source_transport(&key, source_ip).context("noise")?;
    let behaviour = Behaviour::new();
    let control = behaviour.new_control();
    let config = libp2p::swarm::Config::with_tokio_executor().with_idle_connection_timeout(idle);
    let mut swarm = Swarm::new(transport, behaviour, key.public().to_peer_id(), config);
    let opts = DialOpts::peer_id(router)
        .addresses(vec![router_addr.clone()])
        .condition(PeerCondition::Always)
        .build();
    if swarm.dial(opts).is_err() {
        return Ok(Dialed::Failed);
    }
    loop {
        let Ok(ev) = tokio::time::timeout_at(deadline, swarm.select_next_some()).await else {
            return Ok(Dialed::Deadline);
        };
        match ev {
            SwarmEvent::ConnectionEstablished { .. } => {
                return Ok(Dialed::Connected(Box::new(Stranger { swarm, control })));
            }
            SwarmEvent::OutgoingConnectionError { .. } => return Ok(Dialed::Failed),
            _ => {}
        }
    }
}

/// The PeerId at the end of `addr`.
pub(crate) fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// Deadline of one dial's TCP connect, noise and yamux handshakes.
const UPGRADE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// TCP from `source_ip` (an address of the attack's own), noise with
/// `key`, yamux.
fn source_transport(
    key: &libp2p::identity::Keypair,
    source_ip: std::net::IpAddr,
) -> Result<
    libp2p::core::transport::Boxed<(libp2p::PeerId, libp2p::core::muxing::StreamMuxerBox)>,
    libp2p::noise::Error,
> {
    use libp2p::Transport as _;
    Ok(agentmesh_streams::dial::DialTcp {
        source_ip: Some(source_ip),
    }
    .upgrade(libp2p::core::upgrade::Version::V1Lazy)
    .authenticate(libp2p::noise::Config::new(key)?)
    .multiplex(libp2p::yamux::Config::default())
    .timeout(UPGRADE_TIMEOUT)
    .map(|(peer, muxer), _| (peer, libp2p::core::muxing::StreamMuxerBox::new(muxer)))
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_address_must_name_its_peer() {
        let a: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().expect("addr");
        assert_eq!(peer_of(&a), None);
        let id = PeerId::random();
        let a = a.with(Protocol::P2p(id));
        assert_eq!(peer_of(&a), Some(id));
    }
}
