//! The router mesh: connect to every router in the directory, authenticate
//! to it as a router, and keep in Kademlia's routing table exactly the
//! routers that authenticated to us. The swarm loop runs a round every
//! second and whenever the directory wakes the mesh (a new directory, a
//! router admitted here, our own auth to a router done, a connection to a
//! router established), so two fresh routers mesh within round trips.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::unix_now;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, Swarm};
use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Behaviour;
use crate::admission::Admissions;
use crate::auth::outbound::authenticate;
use crate::config::Config;
use crate::cp::Link;
use crate::directory::Directory;

/// Where our own auth to another router stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutAuth {
    InFlight,
    /// Admitted while presenting the credential that expires at this instant.
    Admitted {
        cred_expiry: i64,
    },
    Failed {
        at: Instant,
    },
}

/// Mesh state kept by the swarm loop.
pub(crate) struct Mesh {
    config: Arc<Config>,
    link: Arc<Link>,
    admissions: Admissions,
    directory: Arc<Directory>,
    control: agentmesh_streams::Control,
    last_dial: HashMap<PeerId, Instant>,
    out_auth: Arc<Mutex<HashMap<PeerId, OutAuth>>>,
    auth_tasks: JoinSet<()>,
    /// Routers inserted into Kademlia's routing table.
    in_table: HashSet<PeerId>,
}

impl Mesh {
    /// Empty mesh state.
    pub(crate) fn new(
        config: Arc<Config>,
        link: Arc<Link>,
        admissions: Admissions,
        directory: Arc<Directory>,
        control: agentmesh_streams::Control,
    ) -> Self {
        Self {
            config,
            link,
            admissions,
            directory,
            control,
            last_dial: HashMap::new(),
            out_auth: Arc::new(Mutex::new(HashMap::new())),
            auth_tasks: JoinSet::new(),
            in_table: HashSet::new(),
        }
    }

    /// A peer's last connection closed: forget its auth and table entry.
    pub(crate) fn on_disconnected(&mut self, swarm: &mut Swarm<Behaviour>, peer: &PeerId) {
        self.out_auth.lock().remove(peer);
        if self.in_table.remove(peer) {
            swarm.behaviour_mut().kad.inner_mut().remove_peer(peer);
        }
    }

    /// One round: dial, authenticate, update the routing table. Returns
    /// whether routers were added to the table (the caller re-announces).
    pub(crate) fn tick(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        addrs_of: &HashMap<PeerId, Multiaddr>,
    ) -> bool {
        while self.auth_tasks.try_join_next().is_some() {}
        let interval = self.config.control_plane.lease_interval;
        let directory = self.directory.routers.read().clone();
        let cred_expiry = self
            .link
            .credential
            .read()
            .as_ref()
            .and_then(|c| peek_claims(c).ok())
            .map(|c| c.expires_at_unix_secs);
        for r in &directory {
            let connected = swarm.is_connected(&r.peer);
            let has_kad = swarm.behaviour().kad.has_connection(&r.peer);
            let may_dial = self
                .last_dial
                .get(&r.peer)
                .is_none_or(|t| t.elapsed() >= interval);
            if (!connected || !has_kad) && may_dial && !r.addrs.is_empty() {
                // A fresh local port: with port reuse (bound to our
                // listen port) two routers dialling each other at once
                // collide on one 4-tuple (EADDRINUSE, seen once dials went
                // through the DNS transport); routers need no hole punching.
                let opts = DialOpts::peer_id(r.peer)
                    .addresses(r.addrs.clone())
                    .allocate_new_port()
                    .condition(if connected {
                        PeerCondition::Always
                    } else {
                        PeerCondition::DisconnectedAndNotDialing
                    })
                    .build();
                if let Err(e) = swarm.dial(opts) {
                    tracing::debug!(peer = %r.peer, error = %e, "dialing router failed");
                }
                self.last_dial.insert(r.peer, Instant::now());
            }
            if connected {
                self.maybe_authenticate(r.peer, cred_expiry);
            }
        }
        let known: HashSet<PeerId> = directory.iter().map(|r| r.peer).collect();
        self.last_dial.retain(|p, _| known.contains(p));
        self.update_table(swarm, addrs_of)
    }

    fn maybe_authenticate(&mut self, peer: PeerId, cred_expiry: Option<i64>) {
        let Some(cred_expiry) = cred_expiry else {
            return;
        };
        let interval = self.config.control_plane.lease_interval;
        let due = match self.out_auth.lock().get(&peer) {
            None => true,
            Some(OutAuth::InFlight) => false,
            Some(OutAuth::Admitted { cred_expiry: e }) => *e != cred_expiry,
            Some(OutAuth::Failed { at }) => at.elapsed() >= interval,
        };
        if !due {
            return;
        }
        self.out_auth.lock().insert(peer, OutAuth::InFlight);
        let link = self.link.clone();
        let directory = self.directory.clone();
        let t = self.config.connections.stream_timeout;
        let mut control = self.control.clone();
        let out_auth = self.out_auth.clone();
        self.auth_tasks.spawn(async move {
            let state = match authenticate(&link, &mut control, peer, t).await {
                Ok(_) => {
                    tracing::info!(%peer, "admitted by router");
                    OutAuth::Admitted { cred_expiry }
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "router auth failed");
                    OutAuth::Failed { at: Instant::now() }
                }
            };
            {
                let mut m = out_auth.lock();
                // A disconnect in the meantime removed the entry: keep it removed.
                if let Some(s) = m.get_mut(&peer) {
                    *s = state;
                }
            }
            // The other router admitted us (or not): its table entry may change now.
            directory.wake_mesh();
        });
    }

    /// Inserts admitted routers into the routing table and removes the rest.
    fn update_table(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        addrs_of: &HashMap<PeerId, Multiaddr>,
    ) -> bool {
        let now = unix_now();
        let admitted: HashSet<PeerId> = {
            let adm = self.admissions.read();
            adm.routers()
                .filter(|p| adm.is_router(p, now))
                .copied()
                .collect()
        };
        let directory = self.directory.routers.read().clone();
        let mut added = false;
        for peer in &admitted {
            if self.in_table.contains(peer) || !swarm.behaviour().kad.has_connection(peer) {
                continue;
            }
            let mut addrs: Vec<Multiaddr> = directory
                .iter()
                .find(|r| r.peer == *peer)
                .map(|r| r.addrs.clone())
                .unwrap_or_default();
            if addrs.is_empty() {
                addrs.extend(addrs_of.get(peer).cloned());
            }
            for a in addrs {
                swarm.behaviour_mut().kad.inner_mut().add_address(peer, a);
            }
            self.in_table.insert(*peer);
            added = true;
            tracing::info!(%peer, "router added to the routing table");
        }
        let gone: Vec<PeerId> = self
            .in_table
            .iter()
            .filter(|p| !admitted.contains(p))
            .copied()
            .collect();
        for p in gone {
            self.in_table.remove(&p);
            swarm.behaviour_mut().kad.inner_mut().remove_peer(&p);
        }
        added
    }
}
