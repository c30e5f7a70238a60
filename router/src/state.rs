//! State shared by the router's tasks: trust, admissions, the catalog, its
//! own credential, the directory and readiness. Locks are held only for
//! short, non-async sections.

use std::sync::Arc;

use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::credential::Credential;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, watch};

use crate::admission::AdmissionTable;
use crate::catalog::store::CatalogStore;
use crate::config::Config;
use crate::cp::ControlPlane;
use crate::mesh::router_only::RouterSet;
use crate::metrics::Metrics;

/// A router as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirectoryRouter {
    pub(crate) peer: PeerId,
    pub(crate) addrs: Vec<Multiaddr>,
    pub(crate) draining: bool,
    /// The load it reported in its last lease, if any.
    pub(crate) load: Option<agentmesh_proto::pb::controlplane::RouterLoad>,
}

/// The parts of readiness (DESIGN.md "Readiness").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Readiness {
    pub(crate) listening: bool,
    pub(crate) external_addr: bool,
    pub(crate) keys: bool,
    pub(crate) lease_accepted: bool,
    pub(crate) draining: bool,
    /// Set once every condition held; afterwards only draining matters, so a
    /// control-plane outage does not make a ready router unready.
    pub(crate) latched: bool,
}

impl Readiness {
    /// Whether the router is ready now.
    pub(crate) fn is_ready(&self) -> bool {
        self.latched && !self.draining
    }

    /// Why the router is not ready (for `/readyz`), or `None` if it is.
    pub(crate) fn reason(&self) -> Option<&'static str> {
        if self.draining {
            return Some("draining");
        }
        if self.latched {
            return None;
        }
        if !self.listening {
            Some("not listening")
        } else if !self.external_addr {
            Some("no external address (set --external-addr)")
        } else if !self.keys {
            Some("no control-plane keys yet")
        } else if !self.lease_accepted {
            Some("no lease accepted yet")
        } else {
            None
        }
    }
}

/// Everything the router's tasks share.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// Watermarks and reservation cap in effect (flags, else sized from the
    /// memory budget at start).
    pub(crate) sizing: crate::config::Sizing,
    pub(crate) keypair: Keypair,
    pub(crate) peer_id: PeerId,
    pub(crate) metrics: Metrics,
    pub(crate) cp: ControlPlane,
    pub(crate) trust: RwLock<Trust>,
    pub(crate) admission: RwLock<AdmissionTable>,
    pub(crate) credential: RwLock<Option<Credential>>,
    pub(crate) catalog: Mutex<CatalogStore>,
    /// Woken when the set of services held changes.
    pub(crate) catalog_changed: Notify,
    /// Routers from the last directory fetch (self excluded).
    pub(crate) directory: RwLock<Vec<DirectoryRouter>>,
    /// Peers that get Kademlia: the directory's routers.
    pub(crate) router_set: RouterSet,
    pub(crate) external_addrs: RwLock<Vec<Multiaddr>>,
    pub(crate) listen_addrs: RwLock<Vec<Multiaddr>>,
    /// Budgets and live charges (the muxer accounts every stream here).
    pub(crate) resources: Arc<crate::resources::ResourceManager>,
    /// Drain progress (go-away and drain, `crate::drain`).
    pub(crate) drain: crate::drain::DrainState,
    readiness: Mutex<Readiness>,
    ready_tx: watch::Sender<bool>,
}

impl Shared {
    /// Builds the shared state.
    pub(crate) fn new(
        config: Config,
        sizing: crate::config::Sizing,
        keypair: Keypair,
        metrics: Metrics,
        cp: ControlPlane,
        resources: Arc<crate::resources::ResourceManager>,
    ) -> (Arc<Self>, watch::Receiver<bool>) {
        let (ready_tx, ready_rx) = watch::channel(false);
        let peer_id = keypair.public().to_peer_id();
        let catalog = CatalogStore::new(config.catalog_max_records);
        let s = Arc::new(Self {
            config,
            sizing,
            keypair,
            peer_id,
            metrics,
            cp,
            trust: RwLock::new(Trust::default()),
            admission: RwLock::new(AdmissionTable::default()),
            credential: RwLock::new(None),
            catalog: Mutex::new(catalog),
            catalog_changed: Notify::new(),
            directory: RwLock::new(Vec::new()),
            router_set: Arc::new(RwLock::new(Default::default())),
            external_addrs: RwLock::new(Vec::new()),
            listen_addrs: RwLock::new(Vec::new()),
            resources,
            drain: crate::drain::DrainState::default(),
            readiness: Mutex::new(Readiness::default()),
            ready_tx,
        });
        let weak = Arc::downgrade(&s);
        s.resources.set_admitted(Box::new(move |peer| {
            weak.upgrade()
                .is_some_and(|s| s.admission.read().get(peer).is_some())
        }));
        (s, ready_rx)
    }

    /// Updates readiness with `f` and publishes the result.
    pub(crate) fn update_readiness(&self, f: impl FnOnce(&mut Readiness)) {
        let ready = {
            let mut r = self.readiness.lock();
            f(&mut r);
            if r.listening && r.external_addr && r.keys && r.lease_accepted && !r.draining {
                r.latched = true;
            }
            r.is_ready()
        };
        self.metrics.ready.set(i64::from(ready));
        self.ready_tx.send_if_modified(|v| {
            let changed = *v != ready;
            *v = ready;
            changed
        });
    }

    /// A copy of the readiness parts.
    pub(crate) fn readiness(&self) -> Readiness {
        *self.readiness.lock()
    }
}
