//! State shared by the node's tasks: identity, credential, trust, what the
//! core loop knows about routers, and the channel to ask it for connections.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentmesh_controlplane::client::Client;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::credential::{Credential, KeySet};
use agentmesh_streams::Control;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::status::NodeStatus;

/// Queue of commands to the core loop.
pub(crate) const COMMAND_QUEUE: usize = 256;
/// Keys are re-fetched for an unknown key id at most this often.
pub(crate) const KEY_REFETCH_INTERVAL: Duration = Duration::from_secs(30);

/// What other tasks ask of the core loop (which owns the swarm).
#[derive(Debug)]
pub(crate) enum Command {
    /// Be connected to `peer` (dial `addrs` unless already connected).
    /// With `keep_via`, relayed connections to `peer` through other routers
    /// are closed first, and the reply waits until they are gone. With
    /// `listed` (the routers the peer's record names), a peer we reach only
    /// through other routers (ones it left or is leaving) is dialed anew
    /// and the reply waits for the new connection, which the next stream
    /// uses (`agentmesh-streams` opens on the newest); the old ones are left
    /// to finish their calls.
    Connect {
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        keep_via: Option<Vec<PeerId>>,
        listed: Option<Vec<PeerId>>,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// Everything the node's tasks share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) key: Keypair,
    pub(crate) peer_id: PeerId,
    pub(crate) client: Client,
    pub(crate) control: Control,
    pub(crate) metrics: Metrics,
    pub(crate) credential: RwLock<Credential>,
    pub(crate) trust: RwLock<Arc<Trust>>,
    /// Router addresses from the directory.
    pub(crate) router_addrs: RwLock<HashMap<PeerId, Vec<Multiaddr>>>,
    /// Routers we hold a reservation on, with the address we reached them at.
    pub(crate) attached: RwLock<HashMap<PeerId, Multiaddr>>,
    /// Routers the core holds or is acquiring (never authed for transit:
    /// the router keeps the latest purpose, and transit would cost us the
    /// reservation).
    pub(crate) held: RwLock<HashSet<PeerId>>,
    /// Held routers that sent go-away (being replaced): calls route around
    /// them when they can.
    pub(crate) leaving: RwLock<HashSet<PeerId>>,
    /// Routers that admitted us for transit on the current connection.
    pub(crate) transit_admitted: Mutex<HashSet<PeerId>>,
    pub(crate) keys_fetched_at: Mutex<Option<Instant>>,
    pub(crate) cmd: mpsc::Sender<Command>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) status: watch::Sender<NodeStatus>,
    pub(crate) ready: watch::Sender<bool>,
    /// Calls in flight (inbound, forwarded, handed out); shutdown waits for 0.
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Calls in flight per peer: relayed connections to idle peers close.
    pub(crate) peer_calls: Arc<crate::peer_calls::PeerCalls>,
}

impl Shared {
    pub(crate) fn credential(&self) -> Credential {
        self.credential.read().clone()
    }

    pub(crate) fn trust(&self) -> Arc<Trust> {
        self.trust.read().clone()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Replaces the trusted keys, keeping the revocations.
    pub(crate) fn set_keys(&self, keys: &KeySet) {
        let mut t = (*self.trust()).clone();
        t.set_keys(keys);
        *self.trust.write() = Arc::new(t);
    }

    /// Re-fetches the key set (for a credential signed by a key we do not
    /// know yet), at most once per [`KEY_REFETCH_INTERVAL`]. Returns whether
    /// a fetch happened and succeeded.
    pub(crate) async fn refetch_keys(&self) -> bool {
        {
            let mut last = self.keys_fetched_at.lock();
            if last.is_some_and(|t| t.elapsed() < KEY_REFETCH_INTERVAL) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match tokio::time::timeout(self.config.call_timeout(), self.client.get_keys()).await {
            Ok(Ok(keys)) => {
                self.set_keys(&keys);
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "key re-fetch failed");
                false
            }
            Err(_) => false,
        }
    }

    /// Asks the core loop to connect to `peer` and waits, up to `limit`
    /// (the connect timeout, or less: what is left of a call's budget).
    /// With `keep_via`, relayed connections to `peer` through other
    /// routers are closed first; with `listed`, a peer reached only through
    /// routers it does not list is dialed anew (see [`Command::Connect`]).
    pub(crate) async fn connect(
        &self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        keep_via: Option<Vec<PeerId>>,
        listed: Option<Vec<PeerId>>,
        limit: Duration,
    ) -> Result<(), String> {
        let (reply, rx) = oneshot::channel();
        let deadline = limit;
        let fut = async {
            self.cmd
                .send(Command::Connect {
                    peer,
                    addrs,
                    keep_via,
                    listed,
                    reply,
                })
                .await
                .map_err(|_| "node is stopping".to_string())?;
            rx.await.map_err(|_| "node is stopping".to_string())?
        };
        tokio::time::timeout(deadline, fut)
            .await
            .map_err(|_| format!("no connection to {peer} within {deadline:?}"))?
    }

    pub(crate) fn in_flight_guard(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.in_flight.clone())
    }
}

/// Counts one call in flight while alive.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
