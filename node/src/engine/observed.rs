//! What routers observed of us (the admission answer's observed address)
//! and what follows from it: the NAT kind, the address dcutr offers peers
//! (both kept by `crate::direct::Behaviour`), and the `status` lines. The
//! engine is the one writer of the observations (through its swarm).

use agentmesh_streams::dial::{IpTarget, ip_target};
use libp2p::{Multiaddr, PeerId};

use super::Engine;
use crate::status::report::{DirectReport, Observation};

impl Engine {
    /// `router` admitted us (purpose attach) and said it observed us at
    /// `observed`. Taken as our listening port's mapping only when our
    /// connection to it left from the listening port: over the direct
    /// transport (`--direct-transport`), and for TCP not from a fresh port
    /// (every QUIC dial leaves from the listening socket).
    pub(super) fn on_observed(&mut self, router: PeerId, observed: Option<Multiaddr>) {
        let direct = &self.swarm.behaviour().direct;
        if !direct.enabled() {
            return;
        }
        let quic = direct.quic();
        let seen = match observed.as_ref().and_then(ip_target) {
            Some(IpTarget::Tcp(seen)) if !quic => seen,
            Some(IpTarget::Quic(seen)) if quic => seen,
            _ => return,
        };
        let fresh = self
            .slots
            .get(&router)
            .and_then(|s| s.addr.as_ref())
            .and_then(ip_target)
            .is_some_and(|t| match t {
                IpTarget::Tcp(to) => quic || direct.left_from_fresh_port(&to),
                IpTarget::Quic(_) => !quic,
            });
        if fresh {
            tracing::debug!(%router, %seen, "observed on a connection that did not leave from the listening port: not our mapping");
        }
        self.observe(router, (!fresh).then_some(seen));
    }

    /// `router` is gone: its observation no longer counts.
    pub(super) fn forget_observed(&mut self, router: &PeerId) {
        self.observe(*router, None);
    }

    fn observe(&mut self, router: PeerId, seen: Option<std::net::SocketAddr>) {
        let direct = &mut self.swarm.behaviour_mut().direct;
        if direct.observe(router, seen) {
            let o = direct.observations();
            tracing::info!(nat = o.kind().as_str(), candidate = ?o.candidate(), observed = ?o.all().collect::<Vec<_>>(), "what routers observe of us changed");
        }
    }

    /// Whether `peer` is a router (held, transit, or in the directory):
    /// its direct connection is no member's.
    fn is_router(&self, peer: &PeerId) -> bool {
        self.slots.contains_key(peer)
            || self.transit.routers().any(|r| r == peer)
            || self.directory.candidates().iter().any(|c| c.peer == *peer)
    }

    /// The `status` section on direct connections (`None` when off).
    pub(super) fn direct_report(&self) -> Option<DirectReport> {
        if !self.swarm.behaviour().direct.enabled() {
            return None;
        }
        let mut direct_peers: Vec<String> = self
            .conns
            .direct_peers()
            .filter(|p| !self.is_router(p))
            .map(ToString::to_string)
            .collect();
        direct_peers.sort();
        let o = self.swarm.behaviour().direct.observations();
        Some(DirectReport {
            listening: self.swarm.listeners().next().map(ToString::to_string),
            nat: o.kind().as_str().to_string(),
            observed: o
                .all()
                .map(|(r, a)| Observation {
                    router: r.to_string(),
                    addr: a.to_string(),
                })
                .collect(),
            direct_peers,
        })
    }
}
