//! An enrolled member as a raw libp2p swarm (TCP + DNS + noise + yamux,
//! relay client, our streams behaviour, ping as every member answers it):
//! it dials a router, shows its
//! credential there and opens relayed circuits to other members, and then
//! does whatever an attack wants with raw streams. Unlike a real node it
//! obeys no limit of its own; unlike the testkit's peer it never panics, so
//! an attack counts what failed instead of stopping.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::Purpose;
use agentmesh_streams::Control;
use agentmesh_wire::auth::{self, AuthOutcome};
use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, SwarmBuilder, noise, ping, relay, tcp, yamux};
use tokio::sync::{mpsc, watch};

/// Commands the swarm task runs, bounded.
const COMMAND_QUEUE: usize = 64;

#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
struct Behaviour {
    relay: relay::client::Behaviour,
    stream: agentmesh_streams::Behaviour,
    /// Answers pings as a real member does, so a member that stops
    /// answering (a frozen process) is found dead by them.
    ping: ping::Behaviour,
}

type Cmd = Box<dyn FnOnce(&mut Swarm<Behaviour>) + Send>;

/// What the swarm reported about its connections.
#[derive(Debug, Default)]
struct Links {
    /// Established connections per remote peer now.
    open: HashMap<PeerId, u32>,
    /// Connections established per remote peer, since start.
    established: HashMap<PeerId, u64>,
    /// Dials to each remote peer that failed (for a circuit: denied by the
    /// relay, or the destination refused), since start.
    failed: HashMap<PeerId, u64>,
    /// Addresses the swarm listens on (see [`Member::listen`]).
    listening: Vec<Multiaddr>,
}

/// A raw member swarm; its task is aborted on drop.
pub struct Member {
    /// The member's peer id (the subject of its credential).
    pub peer_id: PeerId,
    control: Control,
    cmd: mpsc::Sender<Cmd>,
    links: watch::Receiver<Links>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Member {
    /// A member swarm with identity `key` (connections idle for 5 minutes
    /// stay open: the attack decides when to stop).
    pub fn new(key: Keypair) -> anyhow::Result<Self> {
        let peer_id = key.public().to_peer_id();
        let mut swarm = SwarmBuilder::with_existing_identity(key)
            .with_tokio()
            .with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                yamux::Config::default,
            )?
            .with_dns()?
            .with_relay_client(noise::Config::new, yamux::Config::default)?
            .with_behaviour(|_, relay| Behaviour {
                relay,
                stream: agentmesh_streams::Behaviour::new(),
                ping: ping::Behaviour::default(),
            })
            .map_err(|e| anyhow!("behaviour: {e}"))?
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        let control = swarm.behaviour().stream.new_control();
        let (cmd_tx, mut cmd_rx) = mpsc::channel::<Cmd>(COMMAND_QUEUE);
        let (links_tx, links) = watch::channel(Links::default());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = swarm.select_next_some() => match ev {
                        SwarmEvent::ConnectionEstablished { peer_id, num_established, .. } => {
                            links_tx.send_modify(|l| {
                                l.open.insert(peer_id, num_established.get());
                                *l.established.entry(peer_id).or_default() += 1;
                            });
                        }
                        SwarmEvent::ConnectionClosed { peer_id, num_established, .. } => {
                            links_tx.send_modify(|l| {
                                if num_established == 0 {
                                    l.open.remove(&peer_id);
                                } else {
                                    l.open.insert(peer_id, num_established);
                                }
                            });
                        }
                        SwarmEvent::NewListenAddr { address, .. } => {
                            links_tx.send_modify(|l| l.listening.push(address));
                        }
                        SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                            tracing::debug!(?peer_id, %error, "hostile member: dial failed");
                            if let Some(p) = peer_id {
                                links_tx.send_modify(|l| {
                                    *l.failed.entry(p).or_default() += 1;
                                });
                            }
                        }
                        _ => {}
                    },
                    cmd = cmd_rx.recv() => match cmd {
                        Some(c) => c(&mut swarm),
                        None => break,
                    },
                }
            }
        });
        Ok(Self {
            peer_id,
            control,
            cmd: cmd_tx,
            links,
            task,
        })
    }

    /// A handle to open streams with.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Whether the swarm holds a connection to `peer`.
    pub fn is_connected(&self, peer: &PeerId) -> bool {
        self.links.borrow().open.contains_key(peer)
    }

    /// Connections to `peer` now; connections to it established and dials
    /// to it failed since start.
    pub fn connections(&self, peer: &PeerId) -> (u32, u64, u64) {
        let l = self.links.borrow();
        let get = |m: &HashMap<PeerId, u64>| m.get(peer).copied().unwrap_or(0);
        (
            l.open.get(peer).copied().unwrap_or(0),
            get(&l.established),
            get(&l.failed),
        )
    }

    /// Listens on `addr` (TCP, port 0 for any) and returns the address it
    /// listens on, within `deadline`: for a member that others dial, such
    /// as one leased as a router.
    pub async fn listen(&self, addr: Multiaddr, deadline: Duration) -> anyhow::Result<Multiaddr> {
        let on = addr.clone();
        self.on_swarm(move |s| s.listen_on(on).map(|_| ()).map_err(|e| e.to_string()))
            .await?
            .map_err(|e| anyhow!("listen on {addr}: {e}"))?;
        let mut links = self.links.clone();
        let l = tokio::time::timeout(deadline, links.wait_for(|l| !l.listening.is_empty()))
            .await
            .with_context(|| format!("not listening on {addr} within {deadline:?}"))?
            .map_err(|_| anyhow!("member swarm task ended"))?;
        Ok(l.listening[0].clone())
    }

    /// Dials `peer` at `addr` (a new connection even if one exists); the
    /// outcome shows in [`Member::connections`].
    pub async fn dial(&self, peer: PeerId, addr: Multiaddr) -> anyhow::Result<()> {
        let opts = DialOpts::peer_id(peer)
            .addresses(vec![addr.clone()])
            .condition(PeerCondition::Always)
            .build();
        self.on_swarm(move |s| s.dial(opts).map_err(|e| e.to_string()))
            .await?
            .map_err(|e| anyhow!("dial {addr}: {e}"))
    }

    /// Runs `f` on the swarm in its task and returns what it returned.
    async fn on_swarm<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Swarm<Behaviour>) -> T + Send + 'static,
    ) -> anyhow::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.cmd
            .send(Box::new(move |s| {
                let _ = tx.send(f(s));
            }))
            .await
            .map_err(|_| anyhow!("member swarm task ended"))?;
        rx.await.map_err(|_| anyhow!("member swarm task ended"))
    }

    /// Dials `peer` at `addr` (a new connection even if one exists) and
    /// waits up to `deadline` until connected to it.
    pub async fn connect(
        &self,
        peer: PeerId,
        addr: Multiaddr,
        deadline: Duration,
    ) -> anyhow::Result<()> {
        self.dial(peer, addr.clone()).await?;
        let mut links = self.links.clone();
        tokio::time::timeout(deadline, links.wait_for(|l| l.open.contains_key(&peer)))
            .await
            .with_context(|| format!("not connected to {peer} at {addr} within {deadline:?}"))?
            .map_err(|_| anyhow!("member swarm task ended"))?;
        Ok(())
    }

    /// Shows `credential` to `router` with `purpose`; an error unless admitted.
    pub async fn authenticate(
        &self,
        router: PeerId,
        credential: Credential,
        purpose: Purpose,
        deadline: Duration,
    ) -> anyhow::Result<()> {
        let req = auth::request_for(credential, purpose, &[]);
        match auth::request(self.control(), router, req, deadline).await? {
            AuthOutcome::Admitted { .. } => Ok(()),
            other => bail!("router {router} did not admit the hostile member: {other:?}"),
        }
    }

    /// Dials `to` through `router`'s relay (a new circuit each time) and
    /// waits up to `deadline` until connected.
    pub async fn connect_through(
        &self,
        router: PeerId,
        router_addr: &Multiaddr,
        to: PeerId,
        deadline: Duration,
    ) -> anyhow::Result<()> {
        self.connect(to, circuit_addr(router, router_addr, to), deadline)
            .await
    }
}

/// Where and how the hostile member enrolls (the binary's flags).
#[derive(Debug, clap::Args)]
pub struct EnrollArgs {
    /// Control-plane gRPC URL to enroll at (must match its --public-url).
    #[arg(long)]
    pub control_plane: String,
    /// PEM CA certificate of a TLS control plane (default: none, plain on loopback).
    #[arg(long)]
    pub control_plane_ca: Option<PathBuf>,
    /// File holding a member enrollment token.
    #[arg(long)]
    pub token_file: PathBuf,
}

impl EnrollArgs {
    /// Enrolls a fresh key with the token: the key and its credential.
    pub async fn enroll(&self) -> anyhow::Result<(Keypair, Credential)> {
        let token = std::fs::read_to_string(&self.token_file)
            .with_context(|| format!("read {}", self.token_file.display()))?;
        let ca_pem = match &self.control_plane_ca {
            Some(p) => Some(std::fs::read(p).with_context(|| format!("read {}", p.display()))?),
            None => None,
        };
        let client = Client::new(ClientConfig {
            url: self.control_plane.clone(),
            ca_pem,
            ..Default::default()
        })?;
        let key = Keypair::generate_ed25519();
        let credential = client
            .enroll(token.trim(), &key)
            .await?
            .credential
            .context("enrollment returned no credential")?;
        Ok((key, credential))
    }
}

/// The router a `--router` multiaddr names in its last `/p2p/ID`.
pub fn router_of(addr: &Multiaddr) -> anyhow::Result<PeerId> {
    match addr.iter().last() {
        Some(Protocol::P2p(router)) => Ok(router),
        _ => bail!("router address {addr} does not end in /p2p/ROUTER_ID"),
    }
}

/// `ROUTER_ADDR/p2p/ROUTER/p2p-circuit/p2p/TO` (`router_addr` may already
/// end in `/p2p/ROUTER`).
pub fn circuit_addr(router: PeerId, router_addr: &Multiaddr, to: PeerId) -> Multiaddr {
    let mut addr = router_addr.clone();
    if !matches!(addr.iter().last(), Some(Protocol::P2p(p)) if p == router) {
        addr.push(Protocol::P2p(router));
    }
    addr.with(Protocol::P2pCircuit).with(Protocol::P2p(to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuit_addresses_name_the_router_once() {
        let (r, to) = (PeerId::random(), PeerId::random());
        let bare: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
        let want = format!("/ip4/127.0.0.1/tcp/4001/p2p/{r}/p2p-circuit/p2p/{to}");
        assert_eq!(circuit_addr(r, &bare, to).to_string(), want);
        let named = bare.with(Protocol::P2p(r));
        assert_eq!(circuit_addr(r, &named, to).to_string(), want);
    }
}
