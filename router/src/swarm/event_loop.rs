//! The swarm loop: owns the swarm, never waits on anything but its inputs.
//! It also owns the router's tables (`crate::tables`: admissions, trust,
//! the live-circuit count) and is their one writer: it applies the other
//! tasks' commands first in its loop, so a storm of swarm events never
//! starves an admission. Every second it enforces admission's sweeps (the
//! auth deadline, expiry and revocations), drops admissions whose peer has
//! no connection left, drives the mesh and refreshes gauges; it runs the
//! catalog's provider searches and announcements in the router DHT.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::unix_now;

use crate::shrink::ShrinkSparse;
use futures::StreamExt;
use libp2p::core::ConnectedPoint;
use libp2p::kad::{self, GetProvidersOk, QueryId, QueryResult};
use libp2p::metrics::Recorder;
use libp2p::swarm::{ConnectionId, SwarmEvent};
use libp2p::{Multiaddr, PeerId, Swarm, relay};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::mesh::Mesh;
use super::{Behaviour, BehaviourEvent, Command};
use crate::addrs::{Addrs, derive_external};
use crate::admission::Admissions;
use crate::admission::conns::{ConnInfo, Connections};
use crate::catalog::{ProviderQuery, provided, providers};
use crate::config::{Config, Sizing};
use crate::cp::Link;
use crate::directory::Directory;
use crate::metrics::Metrics;
use crate::relay::{Circuits, Reservations};
use crate::resources::ResourceManager;
use crate::tables::Owner;

/// How often deadlines, expiry, revocations and the mesh are checked.
const TICK: Duration = Duration::from_secs(1);

/// Provider routers collected per lookup before the query is cut short.
const ENOUGH_PROVIDERS: usize = 16;

/// Service keys the DHT store refused are tried again this often even
/// without a catalog change (other routers' provider records expire and
/// free room).
const PROVIDE_RETRY_EVERY: Duration = Duration::from_secs(30);

/// The components the loop reads and writes.
#[derive(Clone)]
pub(crate) struct Parts {
    pub(crate) config: Arc<Config>,
    pub(crate) sizing: Sizing,
    pub(crate) metrics: Metrics,
    /// The admission table as others see it (the loop writes it through
    /// its [`Owner`]).
    pub(crate) admissions: Admissions,
    /// Trust (revocations) and this router's credential (the mesh's auth).
    pub(crate) link: Arc<Link>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) resources: Arc<ResourceManager>,
    pub(crate) addrs: Arc<Addrs>,
}

/// The loop's state.
pub(crate) struct EventLoop {
    swarm: Swarm<Behaviour>,
    parts: Parts,
    /// The tables this loop alone writes, and the commands to them.
    owner: Owner,
    commands: mpsc::Receiver<Command>,
    provider_queries: mpsc::Receiver<ProviderQuery>,
    p2p_metrics: libp2p::metrics::Metrics,
    conns: Connections,
    /// Remote addresses of our outbound connections (for the routing table).
    dialed_addrs: HashMap<PeerId, Multiaddr>,
    /// Provider searches in the router DHT, one per service at a time.
    searches: providers::Searches<QueryId>,
    /// Service keys announced in the router DHT.
    provided: provided::Provided,
    /// When refused service keys were last retried.
    last_provide_retry: Instant,
    mesh: Mesh,
    /// A router connection with Kademlia appeared: re-announce on the next tick.
    reannounce: bool,
    /// Configured listen address per listener (to derive external addresses).
    listeners: HashMap<libp2p::core::transport::ListenerId, Multiaddr>,
    /// Active relay reservations (behind `agentmesh_router_reservations`).
    reservations: Reservations,
    /// Live circuits (behind `agentmesh_router_circuits`).
    circuits: Circuits,
}

/// What other tasks send the loop: changes to the tables it owns, swarm
/// commands and provider searches.
pub(crate) struct Inputs {
    pub(crate) owner: Owner,
    pub(crate) commands: mpsc::Receiver<Command>,
    pub(crate) provider_queries: mpsc::Receiver<ProviderQuery>,
}

impl EventLoop {
    /// Wraps a listening swarm.
    pub(crate) fn new(
        swarm: Swarm<Behaviour>,
        parts: Parts,
        inputs: Inputs,
        p2p_metrics: libp2p::metrics::Metrics,
        control: agentmesh_streams::Control,
        listeners: HashMap<libp2p::core::transport::ListenerId, Multiaddr>,
    ) -> Self {
        Self {
            swarm,
            searches: providers::Searches::new(parts.config.catalog.provider_cache),
            mesh: Mesh::new(
                parts.config.clone(),
                parts.link.clone(),
                parts.admissions.clone(),
                parts.directory.clone(),
                control,
            ),
            parts,
            owner: inputs.owner,
            commands: inputs.commands,
            provider_queries: inputs.provider_queries,
            p2p_metrics,
            conns: Connections::default(),
            dialed_addrs: HashMap::new(),
            provided: Default::default(),
            last_provide_retry: Instant::now(),
            reannounce: false,
            listeners,
            reservations: Reservations::default(),
            circuits: Circuits::default(),
        }
    }

    /// Runs until `cancel` fires.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let directory = self.parts.directory.clone();
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                // Bounded (`tables::COMMAND_QUEUE`) and each cheap: first,
                // so an asker's deadline is never spent behind events.
                Some(req) = self.owner.next() => {
                    self.owner.tables.apply(req);
                    if self.owner.tables.take_catalog_changed() {
                        self.reconcile_providers(false);
                    }
                }
                ev = self.swarm.select_next_some() => {
                    self.on_event(ev);
                    // In a storm (thousands of members re-attaching at
                    // once) the swarm always has an event ready, and
                    // nothing else here spends tokio's cooperative budget,
                    // so without this the loop never gave its worker back:
                    // the watchdog saw 1.0–2.2 s stalls in the 10,000-member
                    // ladder. Yields once the task's budget is spent.
                    tokio::task::coop::consume_budget().await;
                }
                Some(cmd) = self.commands.recv() => self.on_command(cmd),
                Some(q) = self.provider_queries.recv() => self.on_provider_query(q),
                _ = directory.mesh_woken() => self.mesh_round(),
                _ = tick.tick() => self.on_tick(),
            }
        }
    }

    fn on_provider_query(&mut self, q: ProviderQuery) {
        let kad = self.swarm.behaviour_mut().kad.inner_mut();
        let outcome = self
            .searches
            .request(q.key, q.reply, Instant::now(), |k| kad.get_providers(k));
        self.parts.metrics.provider_search(outcome.as_str());
    }

    /// One mesh round now (dial, authenticate, routing table); a router
    /// added to the table makes every service key be announced again.
    fn mesh_round(&mut self) {
        let added = self.mesh.tick(&mut self.swarm, &self.dialed_addrs);
        if added || std::mem::take(&mut self.reannounce) {
            self.reconcile_providers(true);
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::CloseUnauthenticated { reply } => {
                let _ = reply.send(self.close_unauthenticated());
            }
            Command::Disconnect { peers, reply } => {
                let still: HashSet<PeerId> = {
                    let mut adm = self.owner.tables.admissions.write();
                    peers
                        .into_iter()
                        .filter(|p| adm.remove(p).is_some())
                        .collect()
                };
                let n = still.len();
                for p in &still {
                    self.parts.resources.peer_removed(p);
                }
                self.close_peers(&still);
                let _ = reply.send(n);
            }
        }
    }

    /// Closes every connection of `peers` and marks them closing, so the
    /// auth-deadline sweep does not count them (they were admitted, and
    /// are closed for another reason) while their close completes.
    fn close_peers(&mut self, peers: &HashSet<PeerId>) {
        if peers.is_empty() {
            return;
        }
        self.conns.mark_peers_closing(peers);
        for p in peers {
            let _ = self.swarm.disconnect_peer_id(*p);
        }
    }

    /// Drops admissions whose peer has no connection (it left while its
    /// credential was being verified, after `on_peer_gone` ran): such a
    /// ghost would count against the watermark, the lease load and the
    /// drain until its credential expired. The swarm knows a connection
    /// from before any of its streams can carry an auth request until it
    /// reports the close, so a connected peer is never dropped here.
    /// Returns how many were dropped.
    fn drop_ghost_admissions(&mut self) -> usize {
        let ghosts: Vec<PeerId> = self
            .parts
            .admissions
            .read()
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !self.swarm.is_connected(p))
            .collect();
        for p in &ghosts {
            if let Some(suppressed) = self
                .parts
                .resources
                .log_pass(&p.to_string(), "admission_dropped")
            {
                tracing::info!(peer = %p, suppressed, "dropping an admission without a connection (logged at most once a minute per peer)");
            }
            self.parts
                .metrics
                .connections_closed
                .get_or_create(&[("reason", "disconnected")])
                .inc();
            self.on_peer_gone(p);
        }
        ghosts.len()
    }

    /// Closes inbound connections whose peer is not admitted; returns how many.
    fn close_unauthenticated(&mut self) -> usize {
        let now = unix_now();
        let ids = self
            .conns
            .unauthenticated(&self.parts.admissions.read(), now);
        for id in &ids {
            self.conns.mark_closing(id);
            self.swarm.close_connection(*id);
        }
        ids.len()
    }

    fn on_event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        self.p2p_metrics.record(&ev);
        match ev {
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                ..
            } => {
                let inbound = endpoint.is_listener();
                if self
                    .swarm
                    .behaviour()
                    .kad
                    .is_inner(&peer_id, &connection_id)
                {
                    self.reannounce = true;
                }
                if self.parts.directory.router_set.read().contains(&peer_id) {
                    // A router: authenticate to it, or add it to the table, now.
                    self.parts.directory.wake_mesh();
                }
                if let ConnectedPoint::Dialer { address, .. } = &endpoint {
                    self.dialed_addrs.insert(peer_id, address.clone());
                }
                let source = match &endpoint {
                    ConnectedPoint::Listener { send_back_addr, .. }
                        if !send_back_addr
                            .iter()
                            .any(|p| matches!(p, libp2p::multiaddr::Protocol::P2pCircuit)) =>
                    {
                        crate::resources::source::ip_of(send_back_addr)
                            .map(|ip| self.parts.resources.source_of(ip))
                    }
                    _ => None,
                };
                self.conns.insert(
                    connection_id,
                    ConnInfo {
                        peer: peer_id,
                        inbound,
                        since: Instant::now(),
                        closing: false,
                        source,
                    },
                );
                self.evict_for_newcomer(connection_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.conns.remove(&connection_id);
                if num_established == 0 {
                    self.on_peer_gone(&peer_id);
                }
            }
            SwarmEvent::NewListenAddr {
                listener_id,
                address,
            } => {
                self.parts.addrs.listen.write().push(address.clone());
                if self.parts.config.external_addr.is_empty()
                    && let Some(ext) = self
                        .listeners
                        .get(&listener_id)
                        .and_then(|c| derive_external(c, &address))
                {
                    self.swarm.add_external_address(ext.clone());
                    self.parts.addrs.external.write().push(ext);
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                self.parts.addrs.listen.write().retain(|a| *a != address);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Relay(e)) => {
                self.p2p_metrics.record(&e);
                self.on_relay(e);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(e)) => {
                self.p2p_metrics.record(&e);
                self.on_kad(e);
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(e)) => self.p2p_metrics.record(&e),
            SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) => {
                self.p2p_metrics.record(&e);
                self.on_ping(e);
            }
            _ => {}
        }
    }

    /// libp2p-ping reports a failed ping but does not close the connection.
    /// A member whose link went down (or whose NAT lost its mapping) sends
    /// no FIN, and TCP would take many minutes to notice: until then it
    /// keeps its admission slot, its relay reservation and its catalog
    /// records, so callers are routed to a provider that cannot answer.
    /// Closing the connection runs the usual peer-gone path.
    fn on_ping(&mut self, event: libp2p::ping::Event) {
        let Err(error) = event.result else { return };
        if matches!(error, libp2p::ping::Failure::Unsupported) {
            return;
        }
        if let Some(suppressed) = self
            .parts
            .resources
            .log_pass(&event.peer.to_string(), "ping_failed")
        {
            tracing::info!(peer = %event.peer, %error, suppressed, "ping failed: closing the connection as dead (logged at most once a minute per peer)");
        }
        if self.swarm.close_connection(event.connection) {
            self.parts
                .metrics
                .connections_closed
                .get_or_create(&[("reason", "ping_failed")])
                .inc();
        }
    }

    /// A peer's last connection closed: it is no longer admitted or listed.
    fn on_peer_gone(&mut self, peer: &PeerId) {
        self.owner.tables.admissions.write().remove(peer);
        self.parts.resources.peer_removed(peer);
        if self.owner.tables.catalog.write().remove(peer) {
            self.reconcile_providers(false);
        }
        self.dialed_addrs.remove(peer);
        self.dialed_addrs.shrink_sparse();
        self.mesh.on_disconnected(&mut self.swarm, peer);
    }

    #[allow(deprecated)] // the deprecated relay events still report real outcomes
    fn on_relay(&mut self, e: relay::Event) {
        let m = &self.parts.metrics;
        match e {
            relay::Event::ReservationReqAccepted {
                src_peer_id,
                renewed,
            } => {
                m.relay
                    .reservation_requests
                    .get_or_create(&[("result", "accepted")])
                    .inc();
                self.reservations.accepted(src_peer_id, renewed);
                m.relay.reservations.set(self.reservations.total() as i64);
            }
            relay::Event::ReservationReqDenied {
                src_peer_id,
                status,
            } => {
                let admitted = self
                    .parts
                    .admissions
                    .read()
                    .may_reserve(&src_peer_id, unix_now());
                let full = self.reservations.total() >= self.parts.sizing.relay_max_reservations;
                crate::resources::relay::reservation_denied(
                    &self.parts.resources,
                    &status,
                    admitted,
                    full,
                );
                tracing::debug!(peer = %src_peer_id, "reservation denied");
                m.relay
                    .reservation_requests
                    .get_or_create(&[("result", "denied")])
                    .inc();
            }
            relay::Event::ReservationClosed { src_peer_id }
            | relay::Event::ReservationTimedOut { src_peer_id } => {
                self.reservations.ended(&src_peer_id);
                m.relay.reservations.set(self.reservations.total() as i64);
            }
            relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            } => {
                m.relay
                    .circuit_requests
                    .get_or_create(&[("result", "accepted")])
                    .inc();
                self.circuits.accepted(src_peer_id, dst_peer_id);
                m.relay.circuits.set(self.circuits.total() as i64);
                self.owner.tables.set_circuits(self.circuits.total());
            }
            relay::Event::CircuitReqDenied {
                src_peer_id,
                dst_peer_id,
                status,
            } => {
                let admitted = self
                    .parts
                    .admissions
                    .read()
                    .may_open_circuit(&src_peer_id, unix_now());
                let full = self.circuits.total() >= self.parts.config.relay.max_circuits;
                crate::resources::relay::circuit_denied(
                    &self.parts.resources,
                    &status,
                    admitted,
                    full,
                );
                tracing::debug!(src = %src_peer_id, dst = %dst_peer_id, "circuit denied");
                m.relay
                    .circuit_requests
                    .get_or_create(&[("result", "denied")])
                    .inc();
            }
            relay::Event::CircuitClosed {
                src_peer_id,
                dst_peer_id,
                ..
            } => {
                self.circuits.closed(src_peer_id, dst_peer_id);
                m.relay.circuits.set(self.circuits.total() as i64);
                self.owner.tables.set_circuits(self.circuits.total());
            }
            _ => {}
        }
    }

    fn on_kad(&mut self, e: kad::Event) {
        let kad::Event::OutboundQueryProgressed {
            id, result, step, ..
        } = e
        else {
            return;
        };
        let QueryResult::GetProviders(r) = result else {
            return;
        };
        let providers = match r {
            Ok(GetProvidersOk::FoundProviders { providers, .. }) => providers,
            _ => HashSet::new(),
        };
        let Some(found) = self.searches.progress(&id, providers) else {
            return;
        };
        if step.last || found >= ENOUGH_PROVIDERS {
            if !step.last
                && let Some(mut q) = self.swarm.behaviour_mut().kad.inner_mut().query_mut(&id)
            {
                q.finish();
            }
            self.searches.finish(&id, Instant::now());
        }
    }

    /// Provides exactly the service keys the catalog holds; with `all`,
    /// re-announces every key (a router joined). Keys the DHT store refuses
    /// are counted and retried (see `provided.rs`).
    fn reconcile_providers(&mut self, all: bool) {
        let kad = self.swarm.behaviour_mut().kad.inner_mut();
        let out = self
            .provided
            .reconcile(&self.owner.tables.catalog.read(), all, kad);
        self.parts
            .metrics
            .catalog
            .provide_failures
            .inc_by(out.failed as u64);
    }

    /// A stranger's connection `id` just came up: if its source now holds
    /// more unauthenticated connections than its cap (the resource manager
    /// lets one past it for this), closes the source's oldest (see
    /// `admission::conns`).
    fn evict_for_newcomer(&mut self, id: ConnectionId) {
        let cap = self
            .parts
            .resources
            .budgets()
            .unauthenticated_connections_per_ip;
        // The resource manager counts the source's strangers in O(1): only
        // a source past its cap is worth the scan for the oldest (members
        // behind one address are thousands of connections).
        let Some(source) = self.conns.source_of(&id) else {
            return;
        };
        if self.parts.resources.unauthenticated_from(&source) <= cap {
            return;
        }
        let victim =
            self.conns
                .evict_for_newcomer(&id, &self.parts.admissions.read(), unix_now(), cap);
        let Some(victim) = victim else {
            return;
        };
        if let Some(peer) = self.conns.mark_closing(&victim) {
            let source = source.to_string();
            if let Some(suppressed) = self
                .parts
                .resources
                .log_pass(&source, "evicted_by_newcomer")
            {
                tracing::warn!(
                    source,
                    %peer,
                    suppressed,
                    "source at its unauthenticated-connection cap: its oldest \
                     unauthenticated connection closed for a newcomer (logged at most \
                     once a minute per source)"
                );
            }
        }
        self.swarm.close_connection(victim);
        self.parts
            .metrics
            .connections_closed
            .get_or_create(&[("reason", "evicted_by_newcomer")])
            .inc();
    }

    fn on_tick(&mut self) {
        self.searches.expire(Instant::now());
        let now = unix_now();
        let parts = self.parts.clone();
        let skew = parts.config.control_plane.skew_secs();

        // Auth deadline: inbound connections whose peer is not admitted.
        let deadline = parts.config.auth.deadline;
        let late = self
            .conns
            .past_auth_deadline(&parts.admissions.read(), now, deadline);
        for id in late {
            if let Some(peer) = self.conns.mark_closing(&id) {
                let key = self
                    .conns
                    .source_of(&id)
                    .map_or_else(|| peer.to_string(), |s| s.to_string());
                if let Some(suppressed) = parts.resources.log_pass(&key, "auth_deadline") {
                    tracing::info!(%peer, source = key, suppressed, "closing connection: not admitted within the auth deadline (logged at most once a minute per source)");
                }
            }
            self.swarm.close_connection(id);
            parts
                .metrics
                .connections_closed
                .get_or_create(&[("reason", "auth_deadline")])
                .inc();
        }

        // Expired admissions and revocations.
        let expired = self.owner.tables.admissions.write().expire(now, skew);
        let revoked = {
            let tables = &mut self.owner.tables;
            let trust = tables.trust.read();
            tables.admissions.write().revoke(&trust, now)
        };
        let mut catalog_changed = false;
        for (peers, reason) in [(expired, "expired"), (revoked, "revoked")] {
            let mut closing = HashSet::new();
            for p in peers {
                if let Some(suppressed) = parts
                    .resources
                    .log_pass(&p.to_string(), "admission_dropped")
                {
                    tracing::info!(peer = %p, reason, suppressed, "dropping admitted peer (logged at most once a minute per peer)");
                }
                if reason == "revoked" {
                    parts.metrics.revocations_enforced.inc();
                }
                parts
                    .metrics
                    .connections_closed
                    .get_or_create(&[("reason", reason)])
                    .inc();
                catalog_changed |= self.owner.tables.catalog.write().remove(&p);
                parts.resources.peer_removed(&p);
                closing.insert(p);
            }
            self.close_peers(&closing);
        }
        self.drop_ghost_admissions();
        let dropped = self.owner.tables.catalog.write().expire(now);
        if dropped > 0 {
            tracing::debug!(dropped, "catalog records expired");
        }
        let added = self.mesh.tick(&mut self.swarm, &self.dialed_addrs);
        let reannounce = added || std::mem::take(&mut self.reannounce);
        let retry = self.provided.has_unannounced()
            && self.last_provide_retry.elapsed() >= PROVIDE_RETRY_EVERY;
        if retry {
            self.last_provide_retry = Instant::now();
        }
        if reannounce || catalog_changed || dropped > 0 || retry {
            self.reconcile_providers(reannounce);
        }
        self.close_duplicate_router_connections();

        self.update_gauges(now);
    }

    /// A router connection that came in before we knew the peer was a
    /// router has no Kademlia; once another connection to it does, close it
    /// so neither side sends DHT requests where they cannot be answered.
    fn close_duplicate_router_connections(&mut self) {
        let kad = &self.swarm.behaviour().kad;
        let stale: Vec<ConnectionId> = self
            .conns
            .iter()
            .filter(|(id, c)| {
                !c.closing && kad.has_connection(&c.peer) && !kad.is_inner(&c.peer, id)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            if let Some(peer) = self.conns.mark_closing(&id) {
                tracing::debug!(%peer, "closing a router connection without Kademlia");
            }
            self.swarm.close_connection(id);
        }
    }

    fn update_gauges(&self, now: i64) {
        let m = &self.parts.metrics;
        let counts = self.parts.admissions.read().counts();
        m.attached_members.set(i64::from(counts.attached));
        m.transit_connections.set(i64::from(counts.transit));
        m.admitted_routers.set(i64::from(counts.routers));
        let catalog = self.owner.tables.catalog.read().len();
        m.catalog.records.set(catalog as i64);
        let tables = [
            ("admission", self.parts.admissions.read().len()),
            ("connections", self.conns.len()),
            ("dialed_addrs", self.dialed_addrs.len()),
            ("reservations", self.reservations.peers()),
            ("catalog_providers", catalog),
            ("provider_searches", self.searches.running()),
        ];
        for (table, n) in tables
            .into_iter()
            .chain(self.parts.resources.table_entries())
        {
            m.table_entries
                .get_or_create(&[("table", table)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let by = self.conns.by_state(&self.parts.admissions.read(), now);
        for ((s, d), v) in by {
            m.connections
                .get_or_create(&[("state", s), ("direction", d)])
                .set(v);
        }
    }
}

#[cfg(test)]
mod tests;
