//! The router's resource manager: budgets by scope (system, per
//! protocol, per peer, per source IP for unauthenticated connections), a
//! memory budget that connections and streams are charged against, and the
//! muxer-level accounting that sees every stream open and close, built-in
//! protocols' included.
//!
//! - `budget/`: the pure policy (counts in, decision out), with the
//!   strangers' pool and its fair shares by source (`budget/stranger_pool.rs`).
//! - `muxer.rs`: our yamux `StreamMuxer` with bounded windows, and the
//!   accounting wrapper around any muxer (yamux and QUIC) whose substreams
//!   learn their protocol from multistream-select and release on drop.
//! - `transport.rs`: TCP + noise + our yamux, and QUIC, both accounted.
//! - `memory.rs`: where the memory limit comes from (flag, cgroup, default).
//! - `source.rs`: where a connection comes from (the key is
//!   `agentmesh_fair::SourceKey`: IPv6 per prefix).
//! - `slots.rs`: the slot budgets strangers reach (auth and catalog streams
//!   served), shared fairly by source.
//! - `pending.rs`: inbound connections in their handshake, shared fairly by
//!   source and shed by progress (`agentmesh_fair::handshakes`, run by the
//!   transport): what a source may hold, and the counters.
//! - `strangers.rs`: the strangers' pool at the connection level: each
//!   peer's charges booked in it, and moved out when it is admitted.
//! - `logins.rs`: the failed-login guard (short blocks per source).
//! - `by_source.rs`: inbound connections per source, admitted or not.
//!
//! Invariant: every charge taken is released exactly once, by the `Drop` of
//! the guard that holds it (connection or stream).

pub(crate) mod budget;
mod by_source;
pub(crate) mod circuits;
pub mod config;
mod logins;
pub(crate) mod memory;
mod metrics;
pub(crate) mod muxer;
pub(crate) mod pending;
pub(crate) mod relay;
pub(crate) mod sizing;
pub(crate) mod slots;
mod sniff;
pub(crate) mod source;
mod strangers;
pub(crate) mod transport;

use crate::shrink::ShrinkSparse;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use agentmesh_runtime::log_gate::LogGate;
use libp2p::PeerId;
use libp2p::core::ConnectedPoint;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use agentmesh_fair::handshakes::Handshakes;
pub(crate) use budget::Watermarks;
use budget::stranger_pool::StrangerPool;
use budget::{
    Budgets, CircuitSourceUsage, ConnectionUsage, OutboundUsage, Proto, Refusal, StreamUsage,
};
use logins::FailedLogins;
pub(crate) use metrics::RefusedLabels;
use metrics::{NO_PROTOCOL, ResourceMetrics};
use slots::{FairBudget, SlotBudget};
use source::SourceKey;

/// Kinds of log line a peer or source can cause, each logged at most once
/// a minute per source (or peer) and kind (`agentmesh_runtime::log_gate`),
/// the rest counted in `agentmesh_router_log_suppressed_total{kind}`.
pub(crate) const LOG_KINDS: &[&str] = &[
    // Per source: refusals of the resource manager and its guards.
    "resource_refused",
    "handshake_refused",
    "login_blocked",
    "stranger_streams_closed",
    "stream_slot_refused",
    "evicted_by_newcomer",
    "auth_unreadable",
    "auth_refused",
    "auth_deadline",
    "drain_refused",
    // Per peer.
    "auth_goaway",
    "ping_failed",
    "admission_dropped",
    "record_refused",
    // Once a minute in all.
    "provider_query_late",
];

/// Whether a peer is admitted now: the admission table's view (its owner,
/// the swarm loop, writes it; the manager only reads).
pub(crate) trait AdmittedPeers: Send + Sync {
    /// Whether `peer` is in the admission table.
    fn is_admitted(&self, peer: &PeerId) -> bool;
}

/// Whether the policy lets a circuit run from `source` to `destination`
/// (the access policy's check; it counts its refusals).
pub(crate) trait CircuitPolicy: Send + Sync {
    /// Whether the circuit may run.
    fn allows(&self, source: &PeerId, destination: &PeerId) -> bool;
}

/// What the manager reads from the rest of the router, handed over when
/// it is built (never set afterwards): the admission table's view and the
/// policy's circuit check, both read-only to it, and the router's log gate
/// (created first, so every part shares it; the manager registers it).
#[derive(Clone)]
pub(crate) struct Deps {
    pub(crate) admitted: Arc<dyn AdmittedPeers>,
    pub(crate) circuit_policy: Arc<dyn CircuitPolicy>,
    pub(crate) log: LogGate<String>,
}

/// Every circuit allowed (tests of the manager without a policy).
#[cfg(test)]
pub(crate) struct AllCircuits;

#[cfg(test)]
impl CircuitPolicy for AllCircuits {
    fn allows(&self, _: &PeerId, _: &PeerId) -> bool {
        true
    }
}

/// No peer admitted (tests of the manager without an admission table).
#[cfg(test)]
pub(crate) struct Nobody;

#[cfg(test)]
impl AdmittedPeers for Nobody {
    fn is_admitted(&self, _: &PeerId) -> bool {
        false
    }
}

#[cfg(test)]
impl Deps {
    /// `admitted`, and every circuit allowed.
    pub(crate) fn for_tests(admitted: Arc<dyn AdmittedPeers>) -> Self {
        Self {
            admitted,
            circuit_policy: Arc::new(AllCircuits),
            log: LogGate::new(LOG_KINDS),
        }
    }

    /// Nobody admitted, every circuit allowed.
    pub(crate) fn nobody() -> Self {
        Self::for_tests(Arc::new(Nobody))
    }
}

#[derive(Debug, Default)]
struct PeerUsage {
    /// Connections still charged (a stream may outlive its connection).
    connections: u32,
    /// Connections whose muxer is still alive: what "connected" means to
    /// admission (see [`ResourceManager::is_connected`]).
    live: u32,
    inbound: u32,
    inbound_by_proto: [u32; Proto::COUNT],
    outbound_by_proto: [u32; Proto::COUNT],
    /// Memory charged to this peer's inbound streams (its share, see
    /// `budget::admit_inbound_stream`); 0 whenever `inbound` is.
    inbound_memory: u64,
    /// Of this peer's charges, what the strangers' pool holds (0 once it is
    /// admitted: its charges move out of the pool).
    stranger_bytes: u64,
    /// The source its stranger charges count under (the first one's).
    stranger_source: Option<SourceKey>,
    /// Whether its connections count as admitted in `State::sources`: set
    /// when a connection opens while it is admitted or when it is
    /// admitted, cleared when the swarm drops its admission.
    admitted: bool,
    /// The source of each of its charged inbound connections (one entry
    /// per connection), to move them in `State::sources` when `admitted`
    /// flips.
    inbound_sources: Vec<SourceKey>,
}

#[derive(Default)]
struct State {
    memory: u64,
    inbound: u32,
    inbound_by_proto: [u32; Proto::COUNT],
    peers: HashMap<PeerId, PeerUsage>,
    /// Inbound connections by source (IPv6 per prefix, see `source.rs`),
    /// and how many of them are admitted peers'.
    sources: by_source::BySource,
    /// What the connections and inbound streams of peers not admitted hold.
    strangers: StrangerPool,
    /// Circuits (STOP streams) per destination, by the peer that asked for
    /// them (see [`ResourceManager::charge_circuit_source`]).
    circuit_sources: HashMap<PeerId, HashMap<PeerId, u32>>,
}

/// Budgets, live counts and charges of one router.
pub(crate) struct ResourceManager {
    budgets: Budgets,
    metrics: ResourceMetrics,
    admitted: Arc<dyn AdmittedPeers>,
    circuit_policy: Arc<dyn CircuitPolicy>,
    /// Live circuits, to close those a policy change no longer allows.
    circuits: circuits::LiveCircuits,
    state: Mutex<State>,
    /// The failed-login guard (its own lock: auth records failures while
    /// connections are admitted).
    logins: Mutex<FailedLogins>,
    /// Inbound connections in their handshake, shared fairly by source
    /// (run by the transport, `pending.rs`).
    handshakes: Handshakes,
    /// Their counters (the table counts through its own clone).
    #[cfg(test)]
    handshake_metrics: pending::HandshakeMetrics,
    /// See [`ResourceManager::log`].
    log: LogGate<String>,
}

impl std::fmt::Debug for ResourceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceManager")
            .field("budgets", &self.budgets)
            .finish_non_exhaustive()
    }
}

/// The effective budgets for the resource flags `r` with
/// `memory_budget_bytes`; budgets left unset derive from `w` (the
/// watermarks in effect, themselves sized from the same memory budget when
/// no watermark flag is given).
pub(crate) fn budgets(
    r: &config::ResourceConfig,
    w: Watermarks,
    memory_budget_bytes: u64,
) -> Budgets {
    let protocol_streams =
        budget::per_protocol(|p| budget::default_protocol_budget(p, w), &r.stream_budgets);
    let system_streams = r.stream_budget_system.unwrap_or_else(|| {
        protocol_streams
            .iter()
            .fold(0u32, |a, b| a.saturating_add(*b))
    });
    Budgets {
        memory_bytes: memory_budget_bytes,
        connection_charge_bytes: r.connection_charge_bytes,
        peer_memory_bytes: budget::peer_memory_bytes(
            memory_budget_bytes,
            r.memory_per_peer_max_percent,
        ),
        unauthenticated_memory_bytes: budget::stranger_pool::pool_bytes(
            memory_budget_bytes,
            r.unauthenticated_memory_max_percent,
            r.connection_charge_bytes,
            r.unauthenticated_connections_per_ip,
        ),
        system_streams,
        protocol_streams,
        peer_streams: r.peer_stream_budget_total,
        peer_protocol_streams: budget::per_protocol(
            budget::default_peer_budget,
            &r.peer_stream_budgets,
        ),
        circuits_per_destination: r.circuits_per_destination,
        stop_handshakes_per_connection: r.relay_stop_handshakes_per_connection,
        unauthenticated_connections_per_ip: r.unauthenticated_connections_per_ip,
        failed_logins_per_ip_per_minute: r.failed_logins_per_ip_per_minute,
        failed_login_block: Duration::from_secs(r.failed_login_block_secs),
        ipv6_source_prefix_len: r.ipv6_source_prefix_len,
        pending_connections_max: r.pending_connections_max,
    }
}

#[cfg(test)]
/// The budgets a router with default flags derives for the resource flags
/// `r` and `memory` (the defaults of `--high-watermark-memory-percent` and
/// `--relay-max-circuits`: 50% and 16,384).
pub(crate) fn budgets_of(r: &config::ResourceConfig, memory: u64) -> Budgets {
    let flags = sizing::SizingFlags {
        high_watermark: None,
        low_watermark: None,
        relay_max_reservations: None,
        high_watermark_memory_percent: 50,
    };
    let s = sizing::Sizing::new(flags, r, memory);
    let w = Watermarks {
        high_watermark: s.high_watermark,
        relay_max_circuits: 16 * 1024,
        relay_max_reservations: u32::try_from(s.relay_max_reservations).unwrap_or(u32::MAX),
    };
    budgets(r, w, memory)
}

/// Finds the memory limit (off the async runtime), sizes the watermarks
/// from it with `size` (flags win there), derives the budgets from those and
/// creates the manager. Order matters: budget, then watermarks, then the
/// stream budgets and reservation cap that default from the watermarks.
pub(crate) async fn start(
    r: &config::ResourceConfig,
    size: impl FnOnce(u64) -> (sizing::Sizing, Watermarks),
    registry: &mut Registry,
    refused: Family<RefusedLabels, Counter>,
    deps: Deps,
) -> Result<(Arc<ResourceManager>, sizing::Sizing), tokio::task::JoinError> {
    let (flag, default) = (r.memory_limit_bytes, r.memory_default_limit_bytes);
    let (limit, source) = tokio::task::spawn_blocking(move || memory::limit(flag, default)).await?;
    let memory_budget = memory::budget(limit, r.memory_budget_percent);
    let (sizing, watermarks) = size(memory_budget);
    let b = budgets(r, watermarks, memory_budget);
    tracing::info!(
        limit_bytes = limit,
        source = source.as_str(),
        budget_bytes = memory_budget,
        connection_charge_bytes = b.connection_charge_bytes,
        peer_memory_max_bytes = b.peer_memory_bytes,
        unauthenticated_memory_max_bytes = b.unauthenticated_memory_bytes,
        idle_member_charge_bytes = sizing.idle_member_charge_bytes,
        "memory budget"
    );
    Ok((ResourceManager::new(b, registry, refused, deps), sizing))
}

/// The IP a connection comes from (inbound TCP or QUIC), if known.
fn source_ip(endpoint: &ConnectedPoint) -> Option<IpAddr> {
    match endpoint {
        ConnectedPoint::Listener { send_back_addr, .. } => source::ip_of(send_back_addr),
        ConnectedPoint::Dialer { .. } => None,
    }
}

impl ResourceManager {
    /// A manager with `budgets` reading `deps`; registers its gauges in
    /// `registry` and pre-creates every label of `refused`.
    pub(crate) fn new(
        budgets: Budgets,
        registry: &mut Registry,
        refused: Family<RefusedLabels, Counter>,
        deps: Deps,
    ) -> Arc<Self> {
        let metrics = ResourceMetrics::new(registry, refused);
        metrics
            .memory_budget
            .set(i64::try_from(budgets.memory_bytes).unwrap_or(i64::MAX));
        metrics
            .memory_per_peer_max
            .set(i64::try_from(budgets.peer_memory_bytes).unwrap_or(i64::MAX));
        metrics
            .ipv6_source_prefix_len
            .set(i64::from(budgets.ipv6_source_prefix_len));
        metrics
            .unauthenticated_memory_budget
            .set(i64::try_from(budgets.unauthenticated_memory_bytes).unwrap_or(i64::MAX));
        let handshake_metrics = pending::HandshakeMetrics::new(registry, metrics.refused.clone());
        let log = deps.log;
        log.register(registry.sub_registry_with_prefix("agentmesh_router"));
        let logins = FailedLogins::new(
            budgets.failed_logins_per_ip_per_minute,
            budgets.failed_login_block,
            budgets.ipv6_source_prefix_len,
        );
        let limits = pending::limits(
            budgets.pending_connections_max,
            budgets.ipv6_source_prefix_len,
        );
        Arc::new_cyclic(|mgr| {
            let events = pending::RouterEvents(handshake_metrics.clone());
            events.capacity(limits.max_pending.max(1));
            let gate = pending::RouterGate {
                mgr: mgr.clone(),
                metrics: handshake_metrics.clone(),
            };
            Self {
                budgets,
                metrics,
                admitted: deps.admitted,
                circuit_policy: deps.circuit_policy,
                circuits: circuits::LiveCircuits::default(),
                state: Mutex::new(State::default()),
                logins: Mutex::new(logins),
                handshakes: Handshakes::new(limits, gate, events),
                log,
                #[cfg(test)]
                handshake_metrics,
            }
        })
    }

    /// The table of inbound connections in their handshake (the transport
    /// runs it, `transport.rs`).
    pub(crate) fn handshakes(&self) -> &Handshakes {
        &self.handshakes
    }

    /// A slot budget of `capacity` shared fairly by source, counted with
    /// the router's other slot budgets (`agentmesh_router_slots_*`).
    pub(crate) fn fair_budget(&self, budget: SlotBudget, capacity: usize) -> FairBudget {
        FairBudget::new(
            budget,
            capacity,
            self.budgets.ipv6_source_prefix_len,
            self.metrics.slots.clone(),
        )
    }

    /// The counter of inbound streams the muxer dropped because its buffer
    /// was full (pre-created at 0 with every other refusal label).
    pub(crate) fn buffered_inbound_dropped(&self) -> Counter {
        self.metrics
            .refused
            .get_or_create(&metrics::BUFFER_FULL_REFUSAL)
            .clone()
    }

    /// Whether the policy lets a circuit run from `source` to
    /// `destination`.
    pub(crate) fn circuit_allowed(&self, source: &PeerId, destination: &PeerId) -> bool {
        self.circuit_policy.allows(source, destination)
    }

    /// Sweeps of live circuits started so far (see `circuits`).
    pub(crate) fn circuit_sweeps(&self) -> u64 {
        self.circuits.sweeps()
    }

    /// Cuts every live circuit `allowed(source, destination)` refuses
    /// (see `circuits`); returns how many.
    pub(crate) fn cut_circuits(&self, allowed: impl Fn(&PeerId, &PeerId) -> bool) -> usize {
        self.circuits.cut_unless(allowed)
    }

    /// Marks a live circuit between `member` and `peer` upgraded away
    /// (see `circuits`).
    pub(crate) fn mark_upgraded(
        &self,
        member: &PeerId,
        peer: &PeerId,
    ) -> Result<(), circuits::MarkRefusal> {
        self.circuits.mark_upgraded(member, peer)
    }

    /// The effective budgets.
    pub(crate) fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// The key `ip` counts under for per-source limits: every map keyed by
    /// source is keyed by this (IPv6 aggregated to `--ipv6-source-prefix-len`).
    fn source_key(&self, ip: IpAddr) -> SourceKey {
        SourceKey::new(ip, self.budgets.ipv6_source_prefix_len)
    }

    /// The source `ip` counts under (IPv6 per prefix), as the swarm loop
    /// keys connections for the newcomer's eviction.
    pub(crate) fn source_of(&self, ip: IpAddr) -> SourceKey {
        self.source_key(ip)
    }

    fn is_admitted(&self, peer: &PeerId) -> bool {
        self.admitted.is_admitted(peer)
    }

    /// Admits (and charges) a new connection, or refuses it (counted, logged).
    pub(crate) fn open_connection(
        self: &Arc<Self>,
        peer: PeerId,
        endpoint: &ConnectedPoint,
    ) -> Result<Arc<ConnectionGuard>, Refusal> {
        let ip = source_ip(endpoint).map(|ip| self.source_key(ip));
        let peer_admitted = self.is_admitted(&peer);
        // The failed-login guard has its own lock: read it before ours.
        let source_blocked =
            !peer_admitted && source_ip(endpoint).is_some_and(|ip| self.source_blocked(ip));
        let mut st = self.state.lock();
        // An admitted peer is never limited by its source (see `budget`).
        let from_source = match ip {
            Some(ip) if !peer_admitted => st.sources.get(&ip),
            _ => by_source::SourceCount::default(),
        };
        // A source with members admitted from it is never blocked for
        // failed logins: in a re-admission storm a CPU-starved member can
        // miss the first-byte deadline (slow under load, not hostile), and
        // blocking its address would lock out every member behind it. Its
        // strangers stay bounded by the per-source connection cap and the
        // fair shares; a source with no member is blocked as before.
        let blocked = source_blocked && !from_source.has_members();
        let unauthenticated = from_source.unauthenticated();
        let usage = ConnectionUsage {
            memory_bytes: st.memory,
            peer_admitted,
            unauthenticated_from_source: unauthenticated,
            source_blocked: blocked,
            stranger: st.strangers.usage(ip),
        };
        if endpoint.is_dialer() {
            // Our own dials are charged but never refused.
            let charge = self.budgets.connection_charge_bytes;
            self.charge(&mut st, charge);
            self.attach_connection(&mut st, peer, None, peer_admitted);
            return Ok(self.connection_guard(peer, None, charge, Stranger::Dialed));
        }
        match budget::admit_inbound_connection(&self.budgets, usage) {
            Ok(charge) => {
                self.charge(&mut st, charge);
                self.attach_connection(&mut st, peer, ip, peer_admitted);
                if !peer_admitted {
                    self.charge_stranger(&mut st, peer, ip, charge);
                }
                let stranger = if peer_admitted {
                    Stranger::Inbound
                } else {
                    Stranger::Charged
                };
                Ok(self.connection_guard(peer, ip, charge, stranger))
            }
            Err(r) => {
                let key = ip.map_or_else(|| peer.to_string(), |ip| ip.to_string());
                self.refuse(r, NO_PROTOCOL, &key, Some(&peer));
                Err(r)
            }
        }
    }

    fn connection_guard(
        self: &Arc<Self>,
        peer: PeerId,
        ip: Option<SourceKey>,
        charge: u64,
        stranger: Stranger,
    ) -> Arc<ConnectionGuard> {
        self.metrics.connections_charged.inc();
        Arc::new(ConnectionGuard {
            mgr: self.clone(),
            peer,
            ip,
            charge,
            stranger,
            stop_handshakes: AtomicU32::new(0),
            live: AtomicBool::new(true),
        })
    }

    /// Books a connection of `peer` (inbound from `ip`); `admitted`: the
    /// admission table lists the peer now.
    fn attach_connection(
        &self,
        st: &mut State,
        peer: PeerId,
        ip: Option<SourceKey>,
        admitted: bool,
    ) {
        let u = st.peers.entry(peer).or_default();
        u.connections += 1;
        u.live += 1;
        // Either the table said so before our lock, or `peer_admitted` ran
        // while we waited for it: whichever came second sees the other.
        u.admitted |= admitted;
        if let Some(ip) = ip {
            u.inbound_sources.push(ip);
            let counted = u.admitted;
            st.sources.opened(ip, counted);
        }
    }

    /// Whether `peer`'s open inbound connections count as a member's
    /// (`admitted`) or a stranger's in their sources, from now on.
    fn count_admitted(&self, st: &mut State, peer: &PeerId, admitted: bool) {
        let Some(u) = st.peers.get_mut(peer) else {
            return;
        };
        if u.admitted == admitted {
            return;
        }
        u.admitted = admitted;
        for ip in &u.inbound_sources {
            st.sources.admission(ip, admitted);
        }
    }

    /// The swarm dropped `peer`'s admission (expired, revoked, refused, or
    /// gone): its connections still open count as a stranger's again.
    pub(crate) fn peer_removed(&self, peer: &PeerId) {
        let mut st = self.state.lock();
        self.count_admitted(&mut st, peer, false);
    }

    /// Inbound connections open from `source` whose peer is not admitted.
    pub(crate) fn unauthenticated_from(&self, source: &SourceKey) -> u32 {
        self.state.lock().sources.get(source).unauthenticated()
    }

    /// Whether `peer` has a connection whose muxer is still alive. Set when
    /// the transport hands the connection over (before the swarm or any
    /// stream sees it), cleared when the swarm drops the muxer (the
    /// connection closed), even while streams of it are still held. Auth
    /// uses it not to admit a peer that left while its credential was
    /// being verified.
    pub(crate) fn is_connected(&self, peer: &PeerId) -> bool {
        self.state
            .lock()
            .peers
            .get(peer)
            .is_some_and(|u| u.live > 0)
    }

    /// The connection `g` is down (its muxer dropped); once per connection.
    fn connection_down(&self, st: &mut State, g: &ConnectionGuard) {
        if g.live.swap(false, Ordering::AcqRel)
            && let Some(u) = st.peers.get_mut(&g.peer)
        {
            u.live = u.live.saturating_sub(1);
        }
    }

    fn release_connection(&self, g: &ConnectionGuard) {
        let mut st = self.state.lock();
        self.connection_down(&mut st, g);
        self.uncharge(&mut st, g.charge);
        if g.stranger == Stranger::Charged {
            self.uncharge_stranger(&mut st, &g.peer, g.charge);
        }
        self.metrics.connections_charged.dec();
        if let Some(u) = st.peers.get_mut(&g.peer) {
            u.connections = u.connections.saturating_sub(1);
            if let Some(ip) = g.ip {
                if let Some(i) = u.inbound_sources.iter().position(|s| *s == ip) {
                    u.inbound_sources.swap_remove(i);
                }
                let counted = u.admitted;
                st.sources.closed(&ip, counted);
            }
        }
        self.forget_peer_if_idle(&mut st, g.peer);
    }

    /// Forgets `peer` once nothing of it is charged; what the strangers'
    /// pool still books to it (none unless a charge outlived its
    /// admission's end) is released with it.
    fn forget_peer_if_idle(&self, st: &mut State, peer: PeerId) {
        let idle = st.peers.get(&peer).is_some_and(|u| {
            u.connections == 0 && u.inbound == 0 && u.outbound_by_proto.iter().all(|n| *n == 0)
        });
        if idle {
            let left = st.peers.get(&peer).map_or(0, |u| u.stranger_bytes);
            self.uncharge_stranger(st, &peer, left);
            st.peers.remove(&peer);
            st.peers.shrink_sparse();
        }
    }

    /// Admits (and charges) a stream whose protocol just became known, or
    /// refuses it (counted, logged).
    pub(crate) fn open_stream(
        self: &Arc<Self>,
        conn: &Arc<ConnectionGuard>,
        proto: Proto,
        inbound: bool,
    ) -> Result<StreamGuard, Refusal> {
        // Read admission before taking our lock (see `open_connection`).
        // Streams on connections we dialed (peers we chose) never count.
        let stranger =
            inbound && conn.stranger != Stranger::Dialed && !self.is_admitted(&conn.peer);
        let mut st = self.state.lock();
        let memory = st.memory;
        let (peer_total, peer_proto, peer_out, peer_memory) = st
            .peers
            .get(&conn.peer)
            .map(|u| {
                (
                    u.inbound,
                    u.inbound_by_proto[proto.index()],
                    u.outbound_by_proto[proto.index()],
                    u.inbound_memory,
                )
            })
            .unwrap_or_default();
        let decision = if inbound {
            budget::admit_inbound_stream(
                &self.budgets,
                proto,
                StreamUsage {
                    system: st.inbound,
                    protocol: st.inbound_by_proto[proto.index()],
                    peer: peer_total,
                    peer_protocol: peer_proto,
                    memory_bytes: memory,
                    peer_memory_bytes: peer_memory,
                    stranger: stranger.then(|| st.strangers.usage(conn.ip)),
                },
            )
        } else {
            budget::admit_outbound_stream(
                &self.budgets,
                proto,
                OutboundUsage {
                    to_peer: peer_out,
                    handshakes_on_connection: conn.stop_handshakes.load(Ordering::Relaxed),
                    memory_bytes: memory,
                },
            )
        };
        match decision {
            Ok(charge) => {
                self.charge(&mut st, charge);
                let u = st.peers.entry(conn.peer).or_default();
                if inbound {
                    u.inbound += 1;
                    u.inbound_by_proto[proto.index()] += 1;
                    u.inbound_memory = u.inbound_memory.saturating_add(charge);
                    st.inbound += 1;
                    st.inbound_by_proto[proto.index()] += 1;
                } else {
                    u.outbound_by_proto[proto.index()] += 1;
                }
                if stranger {
                    self.charge_stranger(&mut st, conn.peer, conn.ip, charge);
                }
                let gauge = self.metrics.stream_gauge(proto, inbound);
                gauge.inc();
                // Counted under the lock, so two STOP streams cannot both
                // take the last place; released without it (only lowers).
                let in_handshake = proto == Proto::RelayStop && !inbound;
                if in_handshake {
                    conn.stop_handshakes.fetch_add(1, Ordering::Relaxed);
                    self.metrics.stop_handshakes.inc();
                }
                Ok(StreamGuard {
                    conn: conn.clone(),
                    proto,
                    inbound,
                    charge,
                    stranger,
                    in_handshake,
                    circuit_source: None,
                    circuit: None,
                })
            }
            Err(r) => {
                let key = conn
                    .ip
                    .map_or_else(|| conn.peer.to_string(), |ip| ip.to_string());
                self.refuse(r, proto.as_str(), &key, Some(&conn.peer));
                Err(r)
            }
        }
    }

    /// Charges the circuit of the outbound STOP stream `g` to `source`, the
    /// peer that asked for it (named in the STOP request the relay writes),
    /// or refuses it for that source's share of the destination's circuits
    /// (see `budget::admit_circuit_source`; counted, logged). The source is
    /// keyed by PeerId: only admitted members open circuits, so each
    /// PeerId cost an enrollment, while members behind one address must
    /// not share one share.
    pub(crate) fn charge_circuit_source(
        &self,
        g: &mut StreamGuard,
        source: PeerId,
    ) -> Result<(), Refusal> {
        let dst = g.conn.peer;
        let mut st = self.state.lock();
        let stop = Proto::RelayStop.index();
        let to_destination = st
            .peers
            .get(&dst)
            .map_or(0, |u| u.outbound_by_proto[stop])
            .saturating_sub(1);
        let from_source = st
            .circuit_sources
            .get(&dst)
            .and_then(|m| m.get(&source))
            .copied()
            .unwrap_or(0);
        let usage = CircuitSourceUsage {
            to_destination,
            from_source,
        };
        match budget::admit_circuit_source(&self.budgets, usage) {
            Ok(()) => {
                *st.circuit_sources
                    .entry(dst)
                    .or_default()
                    .entry(source)
                    .or_insert(0) += 1;
                g.circuit_source = Some(source);
                drop(st);
                g.circuit = Some(self.circuits.register(source, dst));
                Ok(())
            }
            Err(r) => {
                self.refuse(
                    r,
                    Proto::RelayStop.as_str(),
                    &source.to_string(),
                    Some(&source),
                );
                Err(r)
            }
        }
    }

    fn release_stream(&self, g: &StreamGuard) {
        let mut st = self.state.lock();
        self.uncharge(&mut st, g.charge);
        if g.stranger {
            self.uncharge_stranger(&mut st, &g.conn.peer, g.charge);
        }
        if let Some(source) = g.circuit_source {
            release_circuit_source(&mut st, g.conn.peer, source);
        }
        if let Some(c) = &g.circuit {
            self.circuits.release(c.id);
        }
        let i = g.proto.index();
        if g.inbound {
            st.inbound = st.inbound.saturating_sub(1);
            st.inbound_by_proto[i] = st.inbound_by_proto[i].saturating_sub(1);
        }
        let peer = g.conn.peer;
        if let Some(u) = st.peers.get_mut(&peer) {
            if g.inbound {
                u.inbound = u.inbound.saturating_sub(1);
                u.inbound_by_proto[i] = u.inbound_by_proto[i].saturating_sub(1);
                u.inbound_memory = u.inbound_memory.saturating_sub(g.charge);
            } else {
                u.outbound_by_proto[i] = u.outbound_by_proto[i].saturating_sub(1);
            }
        }
        self.forget_peer_if_idle(&mut st, peer);
        self.metrics.stream_gauge(g.proto, g.inbound).dec();
    }

    /// Whether a line of `kind` (one of [`LOG_KINDS`])
    /// about `key` (a source, or a PeerId) may be logged now: `Some(lines
    /// held back since the last one)`, at most once a minute per key and
    /// kind (see [`ResourceManager::log`]).
    pub(crate) fn log_pass(&self, key: &str, kind: &'static str) -> Option<u64> {
        self.log.pass(&key.to_owned(), kind)
    }

    /// The key a line about a connection from `ip` (if known, else
    /// `peer`) is logged under: its source (IPv6 per prefix), so a
    /// stranger's fresh PeerIds share one key.
    pub(crate) fn log_key(&self, ip: Option<IpAddr>, peer: &PeerId) -> String {
        ip.map_or_else(
            || peer.to_string(),
            |ip| SourceKey::new(ip, self.budgets.ipv6_source_prefix_len).to_string(),
        )
    }

    /// The router's log gate: every line a peer or source can cause goes
    /// through it (`agentmesh_router_log_suppressed_total{kind}`). Created
    /// with the router's shared state and handed over in [`Deps`]; the
    /// manager registers it, and `Metrics::log` is a clone for the sites
    /// without a manager.
    pub(crate) fn log(&self) -> &LogGate<String> {
        &self.log
    }

    fn charge(&self, st: &mut State, bytes: u64) {
        st.memory = st.memory.saturating_add(bytes);
        self.metrics
            .memory_in_use
            .set(i64::try_from(st.memory).unwrap_or(i64::MAX));
    }

    fn uncharge(&self, st: &mut State, bytes: u64) {
        st.memory = st.memory.saturating_sub(bytes);
        self.metrics
            .memory_in_use
            .set(i64::try_from(st.memory).unwrap_or(i64::MAX));
    }

    /// Counts a refusal and logs it at most once a minute per source.
    fn refuse(&self, r: Refusal, protocol: &'static str, key: &str, peer: Option<&PeerId>) {
        self.metrics.refused(r, protocol);
        if let Some(suppressed) = self.log_pass(key, "resource_refused") {
            tracing::warn!(
                source = key,
                peer = peer.map(|p| p.to_string()),
                resource = r.resource.as_str(),
                scope = r.scope.as_str(),
                protocol,
                suppressed,
                "refused for lack of a resource (logged at most once a minute per source)"
            );
        }
    }
}

/// One circuit to `dst` asked for by `source` ended.
fn release_circuit_source(st: &mut State, dst: PeerId, source: PeerId) {
    let Some(by_source) = st.circuit_sources.get_mut(&dst) else {
        return;
    };
    if let Some(n) = by_source.get_mut(&source) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            by_source.remove(&source);
        }
    }
    if by_source.is_empty() {
        st.circuit_sources.remove(&dst);
        st.circuit_sources.shrink_sparse();
    }
}

/// How the strangers' pool sees a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stranger {
    /// We dialed it (a peer we chose): neither it nor its streams count.
    Dialed,
    /// Inbound, its peer admitted when it opened: its streams count while
    /// the peer is not admitted.
    Inbound,
    /// Inbound, its peer not admitted: its charge was booked in the pool.
    Charged,
}

/// One live connection's charge; released when the last holder drops it.
#[derive(Debug)]
pub(crate) struct ConnectionGuard {
    mgr: Arc<ResourceManager>,
    peer: PeerId,
    /// The source it counts under (inbound direct connections only).
    ip: Option<SourceKey>,
    charge: u64,
    /// How the strangers' pool sees it.
    stranger: Stranger,
    /// Outbound relay STOP streams on this connection whose handshake is in
    /// flight (libp2p-relay's own limit is per connection too).
    stop_handshakes: AtomicU32,
    /// Until the muxer drops (or this guard, whichever is first).
    live: AtomicBool,
}

impl ConnectionGuard {
    /// The manager.
    pub(crate) fn manager(&self) -> &Arc<ResourceManager> {
        &self.mgr
    }

    /// The connection's muxer was dropped: the connection is closed, though
    /// streams of it (holding this guard) may still be dropping.
    pub(crate) fn muxer_dropped(&self) {
        let mut st = self.mgr.state.lock();
        self.mgr.connection_down(&mut st, self);
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.mgr.clone().release_connection(self);
    }
}

/// One live stream's charge; released on drop.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    conn: Arc<ConnectionGuard>,
    proto: Proto,
    inbound: bool,
    charge: u64,
    /// Whether its charge was booked in the strangers' pool.
    stranger: bool,
    /// An outbound STOP stream whose handshake has not been answered yet.
    in_handshake: bool,
    /// An outbound STOP stream: the peer that asked for its circuit, once
    /// charged to it.
    circuit_source: Option<PeerId>,
    /// An outbound STOP stream charged to its source: its place among the
    /// live circuits (see `circuits`).
    circuit: Option<circuits::Registered>,
}

impl StreamGuard {
    /// Whether this stream is a circuit a policy change cut (registers
    /// `cx` to be woken when it is cut).
    pub(crate) fn poll_is_cut(&self, cx: &std::task::Context<'_>) -> bool {
        self.circuit.as_ref().is_some_and(|c| c.cut.poll_is_cut(cx))
    }

    /// The peer at the other end of this stream's connection.
    pub(crate) fn peer(&self) -> PeerId {
        self.conn.peer
    }

    /// Whether this is an outbound STOP stream still in its handshake.
    pub(crate) fn in_handshake(&self) -> bool {
        self.in_handshake
    }

    /// The STOP handshake was answered (or the stream is going away): its
    /// place among the connection's handshakes in flight is free. Once.
    pub(crate) fn end_handshake(&mut self) {
        if std::mem::take(&mut self.in_handshake) {
            self.conn.stop_handshakes.fetch_sub(1, Ordering::Relaxed);
            self.conn.mgr.metrics.stop_handshakes.dec();
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.end_handshake();
        self.conn.mgr.clone().release_stream(self);
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_by_source;
