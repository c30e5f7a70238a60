//! Refusing connection floods before the handshake: a small behaviour whose
//! `handle_pending_inbound_connection` runs when a connection arrives, with
//! only its addresses known, before noise (or QUIC's TLS) spends any CPU.
//!
//! It counts handshakes in progress per source (an IPv4 address or an IPv6
//! prefix, `source.rs`) and refuses a connection when its source already
//! holds `--unauthenticated-connections-per-ip` connections whose peers
//! are not admitted (handshakes in progress included) or is blocked for
//! failed logins (`logins.rs`), counted as
//! `refused_total{resource="connection",scope="source",protocol="none"}`.
//! Then it takes a slot of the fair `handshake` budget
//! (`--pending-connections-max`, `slots.rs`): when all are taken, a source
//! holding fewer than the heaviest takes that one's oldest handshake, which
//! is denied when it ends; otherwise it is refused
//! (`slots_refused_total{budget="handshake",reason="source_share"}`).
//! Connections of admitted peers are never counted, so members behind one
//! NAT are not limited once admitted. A handshake stops counting when its
//! connection is established or fails (`ListenFailure`, which the swarm
//! also reports for a denial by any behaviour or by the transport's own
//! admission in `ResourceManager::open_connection`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::core::Endpoint;
use libp2p::core::transport::PortUse;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{
    ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm, dummy,
};
use libp2p::{Multiaddr, PeerId};

use super::budget::{self, HandshakeUsage, Refusal, Resource, Scope};
use super::metrics::NO_PROTOCOL;
use super::source::{self, SourceKey};
use super::transport::ConnectionRefused;
use super::{ResourceManager, State};
use crate::shrink::ShrinkSparse;

/// Takes one from `map[ip]` (dropping the entry at 0); false if there was none.
fn decrement(map: &mut HashMap<SourceKey, u32>, ip: SourceKey) -> bool {
    let Some(n) = map.get_mut(&ip) else {
        return false;
    };
    *n = n.saturating_sub(1);
    if *n == 0 {
        map.remove(&ip);
        map.shrink_sparse();
    }
    true
}

/// An inbound connection from `ip` finished its upgrade and now counts
/// among the source's established connections: one of the source's
/// handshakes stops counting as in progress, until the swarm ends its
/// pending entry.
pub(super) fn upgraded(st: &mut State, ip: SourceKey) {
    if decrement(&mut st.pending_by_ip, ip) {
        *st.upgraded_by_ip.entry(ip).or_default() += 1;
    }
}

impl ResourceManager {
    /// Admits (and counts) an inbound connection from `ip` before its
    /// handshake, or refuses it (counted, logged). `ip` counts under its
    /// source key (IPv6 per prefix).
    pub(crate) fn open_pending(&self, id: ConnectionId, addr: IpAddr) -> Result<(), Refusal> {
        let ip = self.source_key(addr);
        // The failed-login guard has its own lock: read it before ours.
        let source_blocked = self.source_blocked(addr);
        let mut st = self.state.lock();
        let from_source = st.sources.get(&ip);
        // As for established connections (`open_connection`): a source
        // with members admitted from it is never blocked for failed logins,
        // or a re-admission storm would lock its members out here, before
        // their handshake.
        let blocked = source_blocked && !from_source.has_members();
        let usage = HandshakeUsage {
            pending_from_source: st.pending_by_ip.get(&ip).copied().unwrap_or(0),
            unauthenticated_from_source: from_source.unauthenticated(),
            source_blocked: blocked,
        };
        if let Err(r) = budget::admit_handshake(&self.budgets, usage) {
            self.refuse(r, NO_PROTOCOL, &ip.to_string(), None);
            return Err(r);
        }
        match self.handshakes.try_acquire(Some(addr)) {
            Ok(slot) => {
                st.pending.insert(id, (ip, slot));
                *st.pending_by_ip.entry(ip).or_default() += 1;
                Ok(())
            }
            Err(refusal) => {
                let key = ip.to_string();
                if let Some(suppressed) = self.log_pass(&key, "handshake_refused") {
                    tracing::warn!(
                        source = key,
                        held = refusal.held,
                        fair_share = refusal.fair_share,
                        suppressed,
                        "handshake refused: every handshake slot is taken and this source \
                         holds its share (logged at most once a minute per source)"
                    );
                }
                Err(Refusal::new(Resource::Connection, Scope::Source))
            }
        }
    }

    /// The handshake of `id` ended (established or failed); idempotent.
    /// Returns whether its slot had been taken for another source (the
    /// connection is then denied).
    pub(crate) fn close_pending(&self, id: ConnectionId) -> bool {
        let mut st = self.state.lock();
        let mut revoked = false;
        if let Some((ip, slot)) = st.pending.remove(&id) {
            revoked = slot.is_revoked();
            // One handshake from `ip` ended: if an upgraded one is still
            // waiting for this, it is that one (its share moved to
            // `sources` already); otherwise one still in progress. Either
            // way, pending_by_ip + upgraded_by_ip = pending entries of `ip`.
            if !decrement(&mut st.upgraded_by_ip, ip) {
                decrement(&mut st.pending_by_ip, ip);
            }
        }
        st.pending.shrink_sparse();
        revoked
    }

    /// Entries in the manager's per-peer, per-source and per-connection
    /// tables, by `agentmesh_router_table_entries` label.
    pub(crate) fn table_entries(&self) -> [(&'static str, usize); 6] {
        let failed_login_sources = self.logins.lock().len();
        let st = self.state.lock();
        [
            ("resource_peers", st.peers.len()),
            ("resource_sources", st.sources.len()),
            ("stranger_sources", st.strangers.sources()),
            ("resource_pending", st.pending.len()),
            ("failed_login_ips", failed_login_sources),
            ("log_sources", self.log().tracked()),
        ]
    }

    /// Inbound handshakes in progress (for tests).
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.state.lock().pending.len()
    }
}

/// The source IP of an inbound connection that arrived directly (not
/// through a relay: the router is never a relay client).
fn direct_source(local: &Multiaddr, remote: &Multiaddr) -> Option<IpAddr> {
    if local.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
        return None;
    }
    source::ip_of(remote)
}

/// The behaviour that refuses floods before the handshake (see the module
/// docs). Put it first in the composed behaviour so it decides first.
#[derive(Debug)]
pub(crate) struct PendingLimits {
    mgr: Arc<ResourceManager>,
}

impl PendingLimits {
    /// Limits backed by `mgr`'s budgets and counts.
    pub(crate) fn new(mgr: Arc<ResourceManager>) -> Self {
        Self { mgr }
    }
}

impl NetworkBehaviour for PendingLimits {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        let Some(ip) = direct_source(local_addr, remote_addr) else {
            return Ok(());
        };
        self.mgr
            .open_pending(connection_id, ip)
            .map_err(|r| ConnectionDenied::new(ConnectionRefused(r)))
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        _peer: PeerId,
        _local_addr: &Multiaddr,
        _remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if self.mgr.close_pending(connection_id) {
            // Its handshake slot went to a source holding fewer.
            let r = Refusal::new(Resource::Connection, Scope::Source);
            return Err(ConnectionDenied::new(ConnectionRefused(r)));
        }
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: PeerId,
        _addr: &Multiaddr,
        _role_override: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        if let FromSwarm::ListenFailure(f) = event {
            self.mgr.close_pending(f.connection_id);
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _peer: PeerId,
        _connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(
        &mut self,
        _cx: &mut Context<'_>,
    ) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_connections_and_unknown_sources_are_not_counted_here() {
        let local: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
        let remote: Multiaddr = "/ip4/10.1.2.3/tcp/5000".parse().expect("addr");
        assert_eq!(
            direct_source(&local, &remote),
            Some("10.1.2.3".parse().expect("ip"))
        );
        let relayed: Multiaddr = "/ip4/127.0.0.1/tcp/4001/p2p-circuit".parse().expect("addr");
        assert_eq!(direct_source(&relayed, &remote), None);
        assert_eq!(direct_source(&local, &Multiaddr::empty()), None);
    }
}
