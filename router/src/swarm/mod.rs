//! The libp2p swarm: transport (TCP + noise + yamux), the composed behaviour
//! (relay server, our stream protocols, Kademlia among routers, identify,
//! ping), the event loop that owns it and the commands other tasks send it.
//!
//! - `event_loop`: the loop (connections, relay events, the DHT, sweeps);
//! - `mesh`: dialing and authenticating to the other routers, the routing table;
//! - `router_only`: Kademlia and identify on router connections only.

pub(crate) mod event_loop;
pub(crate) mod mesh;
pub(crate) mod router_only;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use libp2p::identity::Keypair;
use libp2p::kad::store::{MemoryStore, MemoryStoreConfig};
use libp2p::swarm::NetworkBehaviour;
use libp2p::{PeerId, StreamProtocol, Swarm, SwarmBuilder, identify, kad, ping, relay};
use tokio::sync::{mpsc, oneshot};

use crate::admission::Admissions;
use crate::config::{Config, Sizing};
use crate::directory::RouterSet;
use crate::protocols::{IDENTIFY_PROTOCOL, KAD_PROTOCOL};
use crate::resources::ResourceManager;
use router_only::RouterOnly;
/// Routers re-announce what they provide this often (plus at once when a
/// router joins).
const PROVIDER_PUBLICATION_INTERVAL: Duration = Duration::from_secs(120);
/// Provider records of other routers live this long without renewal.
const PROVIDER_RECORD_TTL: Duration = Duration::from_secs(360);
/// Distinct service keys the router DHT stores at most per router.
const MAX_PROVIDED_KEYS: usize = 65_536;
/// Providers stored per service key at most (routers, not members).
const MAX_PROVIDERS_PER_KEY: usize = 64;

/// A request to the swarm loop from another task.
#[derive(Debug)]
pub(crate) enum Command {
    /// Close every inbound connection whose peer is not admitted (trimming);
    /// replies how many.
    CloseUnauthenticated { reply: oneshot::Sender<usize> },
    /// Drop the admissions of these peers and close their connections
    /// (trimmed or drained); replies how many were still admitted. Done in
    /// the swarm loop, so its auth-deadline sweep never sees such a
    /// connection unadmitted but not yet closing.
    Disconnect {
        peers: Vec<PeerId>,
        reply: oneshot::Sender<usize>,
    },
}

/// Sends commands to the swarm loop, each queued and answered within one
/// deadline (`--state-command-deadline-ms`, as the tables' commands).
#[derive(Debug, Clone)]
pub(crate) struct Commands {
    tx: mpsc::Sender<Command>,
    deadline: Duration,
}

impl Commands {
    /// Commands over `tx`, each within `deadline`.
    pub(crate) fn new(tx: mpsc::Sender<Command>, deadline: Duration) -> Self {
        Self { tx, deadline }
    }

    /// Asks the swarm loop to drop the admissions of `peers` and close their
    /// connections, within a deadline; returns how many were still admitted
    /// (0 if the loop did not answer in time).
    pub(crate) async fn disconnect(&self, peers: Vec<PeerId>) -> usize {
        if peers.is_empty() {
            return 0;
        }
        let (reply, rx) = oneshot::channel();
        match self.ask(Command::Disconnect { peers, reply }, rx).await {
            Some(n) => n,
            None => {
                tracing::warn!("swarm loop busy: peers not disconnected this round");
                0
            }
        }
    }

    /// Closes unauthenticated inbound connections; returns how many.
    pub(crate) async fn close_unauthenticated(&self) -> usize {
        let (reply, rx) = oneshot::channel();
        self.ask(Command::CloseUnauthenticated { reply }, rx)
            .await
            .unwrap_or(0)
    }

    async fn ask<T>(&self, cmd: Command, rx: oneshot::Receiver<T>) -> Option<T> {
        let asked = tokio::time::timeout(self.deadline, self.tx.send(cmd)).await;
        if !matches!(asked, Ok(Ok(()))) {
            return None;
        }
        tokio::time::timeout(self.deadline, rx)
            .await
            .ok()
            .and_then(Result::ok)
    }
}

/// The router's composed behaviour.
#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub(crate) struct Behaviour {
    pub(crate) relay: relay::Behaviour,
    pub(crate) stream: agentmesh_streams::Behaviour,
    pub(crate) kad: RouterOnly<kad::Behaviour<MemoryStore>>,
    /// Among routers only: members do not speak identify, so on a member's
    /// connection it only cost an outbound stream that fails to negotiate,
    /// a per-connection handler and timer, and an entry in identify's
    /// connected-peers table, which keeps the capacity of the peak for good
    /// (1.25 MiB after 5,000 members left, heap profile in
    /// ladder/results/20261129T1440Z-release-5000-memory).
    pub(crate) identify: RouterOnly<identify::Behaviour>,
    pub(crate) ping: ping::Behaviour,
}

/// Why the swarm could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the libp2p swarm: {0}")]
pub struct BuildError(String);

/// What the swarm is built from.
pub(crate) struct BuildParts<'a> {
    pub(crate) config: &'a Config,
    pub(crate) sizing: &'a Sizing,
    pub(crate) keypair: &'a Keypair,
    pub(crate) admissions: &'a Admissions,
    pub(crate) router_set: &'a RouterSet,
    pub(crate) resources: &'a Arc<ResourceManager>,
}

/// Builds the swarm with the router's identity and limits.
pub(crate) fn build(parts: BuildParts<'_>) -> Result<Swarm<Behaviour>, BuildError> {
    let config = parts.config;
    let keypair = parts.keypair.clone();
    let peer_id = keypair.public().to_peer_id();
    let relay_config = crate::relay::config(&config.relay, parts.sizing, parts.admissions);
    let router_set = parts.router_set.clone();
    let stream_timeout = config.connections.stream_timeout;
    let idle = config.connections.idle_timeout;
    let ping_config = ping::Config::new()
        .with_interval(config.connections.ping_interval)
        .with_timeout(config.connections.ping_timeout);
    let streams_config = agentmesh_streams::Config {
        inbound_queue_per_protocol: config.connections.stream_inbound_queue_per_protocol,
    };
    let pending_opens = agentmesh_streams::PendingOpenLimits {
        max_pending_opens_per_peer: config.connections.stream_max_pending_opens_per_peer,
        max_pending_opens_total: config.connections.stream_max_pending_opens_total,
    };
    let resources = parts.resources.clone();
    let resources_config = config.resources.clone();
    let swarm = SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_other_transport(|key| {
            crate::resources::transport::build(key, &resources_config, resources)
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })
        .map_err(|e| BuildError(e.to_string()))?
        .with_behaviour(|key| {
            let mut kc = kad::Config::new(StreamProtocol::new(KAD_PROTOCOL));
            kc.set_kbucket_inserts(kad::BucketInserts::Manual)
                .set_query_timeout(stream_timeout)
                .set_provider_publication_interval(Some(PROVIDER_PUBLICATION_INTERVAL))
                .set_provider_record_ttl(Some(PROVIDER_RECORD_TTL))
                .set_parallelism(NonZeroUsize::new(3).expect("3 > 0"));
            let store = MemoryStore::with_config(
                peer_id,
                MemoryStoreConfig {
                    max_provided_keys: MAX_PROVIDED_KEYS,
                    max_providers_per_key: MAX_PROVIDERS_PER_KEY,
                    ..Default::default()
                },
            );
            let mut kad = kad::Behaviour::with_config(peer_id, store, kc);
            kad.set_mode(Some(kad::Mode::Server));
            Behaviour {
                relay: relay::Behaviour::new(peer_id, relay_config),
                stream: agentmesh_streams::Behaviour::with_limits(streams_config, pending_opens),
                kad: RouterOnly::new(kad, router_set.clone()),
                identify: RouterOnly::new(
                    identify::Behaviour::new(identify::Config::new(
                        IDENTIFY_PROTOCOL.to_string(),
                        key.public(),
                    )),
                    router_set.clone(),
                ),
                ping: ping::Behaviour::new(ping_config),
            }
        })
        .map_err(|e| BuildError(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
        .build();
    Ok(swarm)
}
