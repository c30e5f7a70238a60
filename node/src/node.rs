//! [`Node`]: one node as each of its tasks holds it (`Arc<Node>`): its
//! identity, credential, trust, configuration, metrics and status, and its
//! bounded command queue to the engine, which owns everything about
//! routers, connections and admissions (transit included). Call tasks ask
//! the engine and wait for its answer with a deadline; nothing the engine
//! holds is copied here.

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

use crate::command::{Command, ConnectError, Routes, Unanswered};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::status::NodeStatus;

/// Keys are re-fetched for an unknown key id at most this often.
pub(crate) const KEY_REFETCH_INTERVAL: Duration = Duration::from_secs(30);

/// One node as its tasks hold it.
pub(crate) struct Node {
    pub(crate) config: Config,
    pub(crate) key: Keypair,
    pub(crate) peer_id: PeerId,
    pub(crate) client: Client,
    pub(crate) control: Control,
    pub(crate) metrics: Metrics,
    pub(crate) credential: RwLock<Credential>,
    pub(crate) trust: RwLock<Arc<Trust>>,
    pub(crate) keys_fetched_at: Mutex<Option<Instant>>,
    pub(crate) cmd: mpsc::Sender<Command>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The node's status, readiness included, published by the engine
    /// (and by the supervisor when the engine panics).
    pub(crate) status: watch::Sender<NodeStatus>,
    /// Calls in flight (inbound, forwarded, handed out); shutdown waits for 0.
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Calls in flight per peer: relayed connections to idle peers close.
    pub(crate) peer_calls: Arc<crate::peer_calls::PeerCalls>,
    /// The `--forward` listeners' bound addresses and services.
    pub(crate) forwards: Vec<(std::net::SocketAddr, String)>,
    /// Services this node's calls looked up recently.
    pub(crate) seen: crate::seen::Seen,
    /// The access policy held and the revocations enforced (the one owner
    /// of both; it writes the revocations into `trust`).
    pub(crate) policy: crate::policy::MemberPolicy,
}

impl Node {
    pub(crate) fn credential(&self) -> Credential {
        self.credential.read().clone()
    }

    pub(crate) fn trust(&self) -> Arc<Trust> {
        self.trust.read().clone()
    }

    /// Whether the signed revocation list this node holds names its own
    /// credential (its PeerId or its token) at `now` (Unix seconds): every
    /// router would refuse it, so it asks none until the credential
    /// changes. The list was verified against the control plane's keys
    /// when taken, so no router can make a member believe this.
    pub(crate) fn own_credential_revoked(&self, now: i64) -> bool {
        let trust = self.trust.read();
        trust.is_revoked(&self.peer_id, now)
            || agentmesh_proto::credential::peek_claims(&self.credential.read())
                .is_ok_and(|c| trust.is_token_revoked(&c.token_id, now))
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Replaces the trusted keys, keeping the revocations, unless `keys`
    /// is older than the set held (`Trust::takes_keys`: a control-plane
    /// replica that has not reloaded its keys yet). Returns whether it did.
    pub(crate) fn set_keys(&self, keys: &KeySet) -> bool {
        // Under the write lock: a revocation update racing with this is not lost.
        let mut w = self.trust.write();
        if !w.takes_keys(keys) {
            tracing::info!(
                held = ?w.key_order(),
                offered = ?(keys.epoch, keys.generation),
                "a key set older than the one held was not taken (a control-plane replica behind the others)"
            );
            self.metrics.key_sets_stale.inc();
            return false;
        }
        let mut t = (**w).clone();
        t.set_keys(keys);
        *w = Arc::new(t);
        true
    }

    /// Re-fetches the key set (for a credential signed by a key we do not
    /// know yet), at most once per [`KEY_REFETCH_INTERVAL`]. Returns whether
    /// a fetch happened, succeeded and its keys were taken.
    pub(crate) async fn refetch_keys(&self) -> bool {
        {
            let mut last = self.keys_fetched_at.lock();
            if last.is_some_and(|t| t.elapsed() < KEY_REFETCH_INTERVAL) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match tokio::time::timeout(self.config.call_timeout(), self.client.get_keys()).await {
            Ok(Ok(keys)) => self.set_keys(&keys),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "key re-fetch failed");
                false
            }
            Err(_) => false,
        }
    }

    /// Sends `cmd` (built around a fresh reply channel) to the engine
    /// and waits for the answer, both within `limit`. `None`: the node is
    /// stopping or the engine did not answer in time (`timed_out`).
    pub(crate) async fn ask<T>(
        &self,
        limit: Duration,
        cmd: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, Unanswered> {
        let (reply, rx) = oneshot::channel();
        let fut = async {
            self.cmd
                .send(cmd(reply))
                .await
                .map_err(|_| Unanswered::Stopping)?;
            rx.await.map_err(|_| Unanswered::Stopping)
        };
        tokio::time::timeout(limit, fut)
            .await
            .map_err(|_| Unanswered::TimedOut(limit))?
    }

    /// The routers a call may use now, asked of the engine within `limit`.
    pub(crate) async fn routes(&self, limit: Duration) -> Result<Routes, Unanswered> {
        self.ask(limit, |reply| Command::Routes { reply }).await
    }

    /// Asks the engine to connect to `peer` and waits, up to `limit`
    /// (the connect timeout, or less: what is left of a call's budget).
    /// With `keep_via`, relayed connections to `peer` through other
    /// routers are closed first; with `listed`, a peer reached only through
    /// routers it does not list is dialed anew; with `suspect`, a direct
    /// connection a call's stream just failed on is closed first (see
    /// [`Command::Connect`]).
    pub(crate) async fn connect(
        &self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        (keep_via, listed): (Option<Vec<PeerId>>, Option<Vec<PeerId>>),
        suspect: Option<libp2p::swarm::ConnectionId>,
        limit: Duration,
    ) -> Result<(), ConnectError> {
        self.ask(limit, |reply| Command::Connect {
            peer,
            addrs,
            keep_via,
            listed,
            suspect,
            reply,
        })
        .await
        .map_err(|e| ConnectError::unanswered(peer, e))?
    }

    /// The services this node exposes, for the status.
    pub(crate) fn exposed(&self) -> Vec<crate::status::report::Exposed> {
        self.config
            .services
            .expose
            .iter()
            .map(|(name, backend)| crate::status::report::Exposed {
                name: name.clone(),
                backend: backend.to_string(),
            })
            .collect()
    }

    /// The `--forward` listeners, for the status.
    pub(crate) fn forwarded(&self) -> Vec<crate::status::report::Forwarded> {
        self.forwards
            .iter()
            .map(|(listen, service)| crate::status::report::Forwarded {
                listen: listen.to_string(),
                service: service.clone(),
            })
            .collect()
    }

    /// What `agentmesh-node services` lists.
    pub(crate) fn services(&self) -> crate::status::report::Services {
        let now = Instant::now();
        crate::status::report::Services {
            exposed: self.exposed(),
            forwarded: self.forwarded(),
            seen: self
                .seen
                .list()
                .into_iter()
                .map(|(name, providers, at)| crate::status::report::SeenService {
                    name,
                    providers,
                    looked_up_secs_ago: now.saturating_duration_since(at).as_secs(),
                })
                .collect(),
        }
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
