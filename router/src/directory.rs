//! The other routers as this router knows them: the control plane's
//! directory (refreshed by the control-plane loop), the set of peers whose
//! connections carry the router DHT, and the wake-ups that let the mesh act
//! at once instead of on its next round: a router that authenticated to us
//! before our directory named it asks for a directory refresh, and every
//! change the mesh must answer (a new directory, a router admitted either
//! way) wakes it.

use std::collections::HashSet;

use libp2p::{Multiaddr, PeerId};
use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::owned::View;

/// A router as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirectoryRouter {
    pub(crate) peer: PeerId,
    pub(crate) addrs: Vec<Multiaddr>,
    pub(crate) draining: bool,
    /// The load it reported in its last lease, if any.
    pub(crate) load: Option<agentmesh_proto::pb::controlplane::RouterLoad>,
}

/// The peers whose connections get the router DHT (Kademlia, identify):
/// the directory's routers plus the routers admitted. The swarm loop owns
/// it (`crate::tables`); this is its read-only view.
pub(crate) type RouterSet = View<HashSet<PeerId>>;

/// The routers this router knows of.
#[derive(Debug)]
pub(crate) struct Directory {
    /// Routers from the last directory fetch (self excluded; written only
    /// by the control-plane loop).
    pub(crate) routers: RwLock<Vec<DirectoryRouter>>,
    /// The directory's routers plus routers admitted with purpose router.
    pub(crate) router_set: RouterSet,
    /// Asks the control-plane loop for a directory fetch now.
    refresh: Notify,
    /// Tells the mesh (in the swarm loop) to look again now.
    mesh: Notify,
}

impl Directory {
    /// No routers yet; `router_set` is the view of the swarm loop's set.
    pub(crate) fn new(router_set: RouterSet) -> Self {
        Self {
            routers: RwLock::default(),
            router_set,
            refresh: Notify::new(),
            mesh: Notify::new(),
        }
    }

    /// Whether the last directory names `peer`.
    pub(crate) fn lists(&self, peer: &PeerId) -> bool {
        self.routers.read().iter().any(|r| r.peer == *peer)
    }

    /// Asks for a directory fetch before the next lease round.
    pub(crate) fn want_refresh(&self) {
        self.refresh.notify_one();
    }

    /// Waits until a directory fetch is wanted (cancel-safe).
    pub(crate) async fn refresh_wanted(&self) {
        self.refresh.notified().await;
    }

    /// Wakes the mesh.
    pub(crate) fn wake_mesh(&self) {
        self.mesh.notify_one();
    }

    /// Waits until the mesh is woken (cancel-safe).
    pub(crate) async fn mesh_woken(&self) {
        self.mesh.notified().await;
    }

    /// A router authenticated to us with purpose router (the swarm loop
    /// added it to the router set when it admitted it, so its next
    /// connections get the router DHT even before the directory names it):
    /// if the directory does not name it yet, it is fetched now (so the
    /// mesh dials the router back instead of waiting for the next lease
    /// round).
    pub(crate) fn router_admitted(&self, peer: PeerId) {
        if !self.lists(&peer) {
            self.want_refresh();
        }
        self.wake_mesh();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;

    use super::*;

    #[test]
    fn only_a_router_the_directory_does_not_name_asks_for_the_directory() {
        let d = Directory::new(RouterSet::default());
        let listed = PeerId::random();
        d.routers.write().push(DirectoryRouter {
            peer: listed,
            addrs: vec![],
            draining: false,
            load: None,
        });
        d.router_admitted(listed);
        assert!(d.mesh_woken().now_or_never().is_some(), "the mesh is woken");
        assert!(
            d.refresh_wanted().now_or_never().is_none(),
            "a listed router needs no directory fetch"
        );
        let unlisted = PeerId::random();
        d.router_admitted(unlisted);
        assert!(d.refresh_wanted().now_or_never().is_some());
        assert!(d.mesh_woken().now_or_never().is_some());
    }
}
