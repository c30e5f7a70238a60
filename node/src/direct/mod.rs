//! Direct connections between members: the swarm behaviour that gates
//! inbound direct connections and runs the upgrade (DCUtR hole punch) of
//! relayed ones, and what routers observed of us ([`nat`]).
//!
//! [`Behaviour`] wraps libp2p-dcutr 0.15 rather than forking it. dcutr
//! punches on every relayed connection and retries three times at once;
//! the wrapper decides per relayed connection whether dcutr sees it at
//! all, so a punch is skipped where it cannot work (our NAT is
//! endpoint-dependent, no router told us our address yet, or the address
//! they observed is one no peer may dial: loopback, outside tests) or where it
//! just failed (a jittered backoff per peer), each skip counted in
//! `agentmesh_node_upgrade_attempts_total{result}`. The address dcutr
//! offers the peer is the one our routers observed, fed to it as an
//! external address candidate (dcutr reads candidates only).
//!
//! **Connection reversal** ([`reversal`], [`reversing`]): behind an
//! endpoint-dependent NAT we never punch; instead every relayed connection
//! asks the peer, on our own small protocol, to take a direct dial from us,
//! and the peer answers with the address its routers agree on (or refuses
//! when it has none); we then dial it. A peer reachable unsolicited
//! (public, full-cone) is so reached directly.
//!
//! **Our address changing** ([`repunch`]): when the routers agree on a new
//! address of ours, dcutr is replaced by a fresh one fed only that one
//! (dcutr never drops a candidate), and peers punched before the change
//! are punched again on their next relayed connection, past their backoff
//! (bounded, counted `repunched`).
//!
//! **Who may connect directly.** An inbound direct connection (one that
//! arrived on the listening port) is accepted only from a peer that holds
//! a relayed connection to us at that moment: routers admit both ends of
//! every circuit, so that peer is an admitted member that was let through
//! by a router's policy, and that is in a punch with us right now: dcutr's
//! exchange with it started on a relayed connection (the connection came
//! up and was handed to dcutr), dcutr dialed it for a punch, or we agreed
//! to its reversal on its relayed connection, within
//! [`gate::PUNCH_WINDOW`]. A peer that merely holds a circuit cannot
//! connect directly whenever it likes: not on a relayed connection whose
//! punch we skip, nor later than that after the exchange. (The dial alone
//! would be too late a mark on the side that sent CONNECT: dcutr reports
//! its exchange there only after waiting half a round trip past SYNC, by
//! when the peer's dial may have landed.)
//! Anything else is closed at once, before any other behaviour keeps
//! state for it, and counted in
//! `agentmesh_node_inbound_refused_total{reason}`. This behaviour must be
//! the swarm's first field for that (the derive asks behaviours in field
//! order and stops at the first refusal). Calls on a direct connection
//! pass the same per-stream checks as relayed ones (credential, policy,
//! `--allow`: `crate::call::inbound`).
//!
//! **Authentication right after the punch.** Every direct connection to a
//! member (a punch's, or accepted as above; never a router's) runs the
//! hello ([`hello`]): each side sends its credential, the engine verifies
//! the peer's as a call's is verified and hands the claims back
//! ([`Behaviour::authenticated`]); [`gate`] keeps them per connection. A
//! connection whose peer has not authenticated within
//! `--direct-auth-timeout-ms` is closed, `direct_closed_total{reason=
//! "unauthenticated"}`. The engine judges every authenticated connection
//! again on each new policy or revocation list and closes those no longer
//! allowed ([`Behaviour::close_direct`], `reason="policy"|"revoked"`).
//! Until its peer authenticated, a direct connection is held back from new
//! streams (`agentmesh_streams::Control::hold`): calls keep to the relayed
//! connection meanwhile.
//!
//! **Dial failures of punches** must not fail callers waiting for a
//! connection to that peer: [`Behaviour::is_punch`] names the connection
//! ids of the dials dcutr made, and the engine leaves those alone.
//!
//! **Punch targets** come from the peer: a punch dials only plain TCP or
//! QUIC to unicast addresses that are not loopback, unspecified or link-local, at
//! most [`MAX_PUNCH_ADDRS`] of them; anything else refuses that dial whole
//! (`result="bad_target"`). Loopback only with the test flag
//! `--direct-allow-loopback-targets` ([`targets`]).

mod gate;
pub(crate) mod hello;
pub(crate) mod nat;
mod open;
mod repunch;
mod reuse_log;
pub(crate) mod reversal;
mod reversing;
mod targets;

pub(crate) use reuse_log::ReuseLog;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use either::Either;
use libp2p::PeerId;
use libp2p::core::transport::PortUse;
use libp2p::core::{Endpoint, Multiaddr, multiaddr::Protocol};
use libp2p::dcutr;
use libp2p::swarm::behaviour::{ConnectionClosed, ConnectionEstablished, FromSwarm};
use libp2p::swarm::{
    CloseConnection, ConnectionDenied, ConnectionHandler as _, ConnectionHandlerSelect,
    ConnectionId, NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm, dummy,
};
use rand::Rng as _;
use tokio::time::Instant;

use crate::metrics::DirectMetrics;
use nat::NatKind;

/// Punch dial ids remembered for [`Behaviour::is_punch`].
const MAX_PUNCH_IDS: usize = 1024;
/// Peers whose punch backoff is remembered, at most.
const MAX_BACKOFF_PEERS: usize = 4096;
/// Addresses a peer may ask one punch to dial, at most.
const MAX_PUNCH_ADDRS: usize = 8;
/// Pauses between punches to one peer after failures
/// (`--punch-backoff-min-secs`, `--punch-backoff-max-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoffs {
    /// After the first failure; doubles per failure in a row.
    pub(crate) min: Duration,
    /// At most.
    pub(crate) max: Duration,
}

impl Default for Backoffs {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(30),
            max: Duration::from_secs(15 * 60),
        }
    }
}

/// Why an inbound direct connection was closed at once.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// The peer holds no relayed connection to us.
    #[error("inbound direct connection from {0}, which holds no relayed connection to us")]
    NoRelayedConnection(PeerId),
    /// Direct connections are off.
    #[error("inbound direct connection from {0}: direct connections are off")]
    DirectOff(PeerId),
    /// The peer holds a relayed connection to us but is in no punch with us.
    #[error("inbound direct connection from {0}, which is in no punch with us")]
    NotPunching(PeerId),
    /// `--direct-max-connections` direct connections are open.
    #[error("direct connection to {0:?}: --direct-max-connections are open")]
    Full(Option<PeerId>),
    /// A punch to addresses we do not dial (loopback, link-local, names,
    /// too many).
    #[error("punch to {0:?}: addresses we do not dial")]
    BadTarget(Option<PeerId>),
    /// A punch's dial (dcutr's retry) while a young direct connection to
    /// the peer is open ([`open::Open::young_direct_to`]): it would make a
    /// second.
    #[error("punch to {0:?}: a direct connection to it came up just now")]
    AlreadyDirect(Option<PeerId>),
}

/// One peer's punch backoff.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    until: Instant,
}

/// See the module doc.
pub(crate) struct Behaviour {
    enabled: bool,
    inner: dcutr::Behaviour,
    metrics: DirectMetrics,
    /// Open relayed connections by peer.
    relayed: HashMap<PeerId, HashSet<ConnectionId>>,
    /// Dials dcutr made, newest last (at most [`MAX_PUNCH_IDS`]).
    punches: VecDeque<ConnectionId>,
    backoff: HashMap<PeerId, Backoff>,
    /// Each router's observation of our address (the engine writes them,
    /// through the swarm it owns).
    observed: nat::Observed,
    /// The candidate last handed to dcutr.
    candidate: Option<SocketAddr>,
    queued: VecDeque<Multiaddr>,
    /// Destinations the transport dialled from a fresh port (read only),
    /// and those of our punches' dials (marked here).
    log: ReuseLog,
    backoffs: Backoffs,
    /// Open direct connections to members (a punch's dial, or accepted
    /// from a peer holding a relayed connection to us; never a router's):
    /// what `direct_connections{nat}` and `direct_closed_total` count; and
    /// the punches under way ([`open`]).
    open: open::Open,
    /// Their authentication, and the punches under way.
    gate: gate::Gate,
    /// Punches may dial loopback (`--direct-allow-loopback-targets`,
    /// tests and benches only: [`targets`]).
    loopback_targets: bool,
    /// Connection reversals (`reversing.rs`).
    reversals: reversing::Reversals,
    /// Our address changing: dcutr replaced, peers punched again.
    repunch: repunch::Repunch,
    /// Our peer id (a replacement dcutr behaviour's).
    me: PeerId,
    /// Direct connections are QUIC (`--direct-transport=quic`): our
    /// observed address is a UDP mapping and peers dial it over QUIC.
    quic: bool,
    /// The streams behaviour's control: direct connections to members are
    /// held back from new streams until their peer authenticated.
    streams: Option<agentmesh_streams::Control>,
}

/// What a new relayed connection to a peer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upgrade {
    /// dcutr's punch.
    Punch,
    /// Our NAT is endpoint-dependent: ask the peer to take our dial
    /// (connection reversal, `reversal.rs`).
    Reverse,
    /// Neither (counted).
    Skip,
}

/// What the behaviour reports to the engine.
#[derive(Debug)]
pub(crate) enum Event {
    /// A punch ended (dcutr's own event).
    Punched(dcutr::Event),
    /// The peer's hello on a direct connection, for the engine to verify
    /// (then [`Behaviour::authenticated`] or [`Behaviour::close_direct`]).
    Hello {
        peer: PeerId,
        connection: ConnectionId,
        heard: hello::Heard,
    },
}

/// `/ip4|ip6/IP/udp/PORT/quic-v1` for `at` (the QUIC listening socket's
/// address, and ours as peers dial it over QUIC).
pub(crate) fn quic_multiaddr(at: SocketAddr) -> Multiaddr {
    Multiaddr::from(at.ip())
        .with(Protocol::Udp(at.port()))
        .with(Protocol::QuicV1)
}

/// Our address `a` as peers dial it: TCP, or with `quic` QUIC on UDP
/// (`--direct-transport`); dcutr's candidate and a reversal's answer.
fn path_addr(a: SocketAddr, quic: bool) -> Multiaddr {
    if quic {
        return quic_multiaddr(a);
    }
    Multiaddr::from(a.ip()).with(Protocol::Tcp(a.port()))
}

fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| p == Protocol::P2pCircuit)
}

/// The address a connection is known by on our side: the one it arrived
/// on for an accepted one (an inbound circuit arrives on
/// `/…/p2p/R/p2p-circuit`), else the one dialed.
fn local_or_remote(endpoint: &libp2p::core::ConnectedPoint) -> &Multiaddr {
    match endpoint {
        libp2p::core::ConnectedPoint::Listener { local_addr, .. } => local_addr,
        libp2p::core::ConnectedPoint::Dialer { address, .. } => address,
    }
}

/// Why a direct connection closed, as `direct_closed_total` counts it:
/// `timed_out` when anything in its error chain is a timed-out I/O error
/// (the socket's `TCP_USER_TIMEOUT` or the kernel's retransmissions gave
/// up: the path stopped carrying bytes) or QUIC's idle timeout
/// ([`quic_timed_out`]), `error` for any other error, `closed` without
/// one (idle, a close by either side).
pub(crate) fn close_reason(cause: Option<&libp2p::swarm::ConnectionError>) -> &'static str {
    let Some(cause) = cause else {
        return "closed";
    };
    if matches!(cause, libp2p::swarm::ConnectionError::KeepAliveTimeout) {
        return "idle";
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(cause);
    // Bounded: error chains are short.
    for _ in 0..16 {
        let Some(e) = next else { break };
        if quic_timed_out(e) {
            return "timed_out";
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return "timed_out";
            }
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
                continue;
            }
        }
        next = e.source();
    }
    "error"
}

/// How quinn words an idle timeout (`quinn::ConnectionError::TimedOut`).
const QUINN_TIMED_OUT: &str = "timed out";

/// Whether `e` is libp2p-quic's error for a connection that heard nothing
/// within its idle timeout. libp2p-quic wraps quinn's error transparently
/// (its source is skipped and the wrapper's field is private), so only its
/// words tell a timeout from a close; a test pins them on a real path that
/// stops carrying datagrams (`transport::tests_quic_idle`).
fn quic_timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<libp2p::quic::Error>(),
        Some(libp2p::quic::Error::Connection(c)) if c.to_string() == QUINN_TIMED_OUT
    )
}

fn jittered_backoff(failures: u32, b: Backoffs) -> Duration {
    let d = b
        .min
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(b.max.max(b.min));
    d.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..0.5))
}

impl Behaviour {
    /// The behaviour for `me`; `enabled` false refuses every inbound
    /// direct connection and never punches.
    pub(crate) fn new(me: PeerId, enabled: bool, metrics: DirectMetrics, log: ReuseLog) -> Self {
        Self {
            enabled,
            inner: dcutr::Behaviour::new(me),
            metrics,
            relayed: HashMap::new(),
            punches: VecDeque::new(),
            backoff: HashMap::new(),
            observed: nat::Observed::default(),
            candidate: None,
            queued: VecDeque::new(),
            log,
            backoffs: Backoffs::default(),
            open: open::Open::default(),
            loopback_targets: false,
            gate: gate::Gate::new(Duration::from_millis(
                crate::config::DEFAULT_DIRECT_AUTH_TIMEOUT_MS,
            )),
            reversals: reversing::Reversals::default(),
            repunch: repunch::Repunch::default(),
            me,
            quic: false,
            streams: None,
        }
    }

    /// The same with direct connections over QUIC
    /// (`--direct-transport=quic`): what the routers observe of us is our
    /// UDP socket's mapping, offered to peers as a QUIC address.
    pub(crate) fn with_quic(mut self, quic: bool) -> Self {
        self.quic = quic;
        self
    }

    /// Whether direct connections are QUIC.
    pub(crate) fn quic(&self) -> bool {
        self.quic
    }

    /// The same with new streams kept off a direct connection to a member
    /// while its peer has not authenticated, when the peer has another
    /// connection (the relayed one): calls then go relayed until the hello
    /// verified (`agentmesh_streams::Control::hold`).
    pub(crate) fn with_streams(mut self, streams: agentmesh_streams::Control) -> Self {
        self.streams = Some(streams);
        self
    }

    /// A direct connection to a member comes up: its hello runs, and new
    /// streams keep off it until the peer authenticated.
    fn hello_handler(&mut self, id: ConnectionId) -> Handler {
        if let Some(s) = &self.streams
            && !s.hold(id)
        {
            tracing::debug!(connection = %id, "too many connections held back: calls may use this one before its hello");
        }
        Either::Right(Either::Left(hello::Handler::new(self.gate.credential())))
    }

    /// The same with peers of direct connections given `timeout` to
    /// authenticate (`--direct-auth-timeout-ms`).
    pub(crate) fn with_auth_timeout(mut self, timeout: Duration) -> Self {
        self.gate = gate::Gate::new(timeout);
        self
    }

    /// The credential our hellos send from now on (the node's, set at
    /// start and on each refresh).
    pub(crate) fn set_credential(&mut self, ours: agentmesh_proto::pb::credential::Credential) {
        self.gate.set_credential(ours);
    }

    /// The peer of direct connection `id` authenticated with `claims`
    /// (verified by the engine). False when `id` no longer waits for it.
    pub(crate) fn authenticated(
        &mut self,
        id: ConnectionId,
        claims: agentmesh_proto::credential::VerifiedClaims,
    ) -> bool {
        let ok = self.gate.authenticated(id, claims);
        if ok && let Some(s) = &self.streams {
            s.release(id);
        }
        ok
    }

    /// The authenticated direct connections with their peer's claims.
    pub(crate) fn verified(
        &self,
    ) -> impl Iterator<Item = (ConnectionId, &agentmesh_proto::credential::VerifiedClaims)> {
        self.gate.verified()
    }

    /// Closes direct connection `id`, counted under `reason` once closed
    /// (one of `DIRECT_CLOSE_REASONS`). False when it is no direct
    /// connection to a member, or already closing.
    pub(crate) fn close_direct(&mut self, id: ConnectionId, reason: &'static str) -> bool {
        self.gate.close(id, reason)
    }

    /// Closes the direct connections whose peer has not authenticated by
    /// `now`; returns how many.
    pub(crate) fn expire_unauthenticated(&mut self, now: Instant) -> usize {
        self.gate.expire(now)
    }

    /// The same with `backoffs` between punches to one peer.
    pub(crate) fn with_backoff(mut self, backoffs: Backoffs) -> Self {
        self.backoffs = backoffs;
        self
    }

    /// The same with at most `max` direct connections to members open at
    /// once (`--direct-max-connections`): each holds a socket (over TCP)
    /// and muxer windows, and a popular provider would otherwise take one
    /// from every caller.
    pub(crate) fn with_max_connections(mut self, max: usize) -> Self {
        self.open = open::Open::with_max(max);
        self
    }

    /// The same with punches allowed to dial loopback (tests and benches
    /// on one host only: [`targets`]).
    pub(crate) fn with_loopback_targets(mut self, allow: bool) -> Self {
        self.loopback_targets = allow;
        self
    }

    /// Whether our last connection to `to` left from a fresh port rather
    /// than the listening one (what a router observed on it is not our
    /// listening port's mapping).
    pub(crate) fn left_from_fresh_port(&self, to: &SocketAddr) -> bool {
        self.log.dialled_from_fresh_port(to)
    }

    /// Whether direct connections are on.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// `router` observed us at `seen` (`None`: its observation no longer
    /// holds). Returns whether the observations changed; the address
    /// peers should punch to goes to dcutr when it is new.
    pub(crate) fn observe(&mut self, router: PeerId, seen: Option<SocketAddr>) -> bool {
        let changed = match seen {
            Some(a) => self.observed.set(router, a),
            None => self.observed.remove(&router),
        };
        self.count_direct();
        // An address no peer may dial (loopback without the test flag: every
        // member on one host) is not offered: a punch to it could only be
        // refused three times while it held the relayed connection open.
        let loopback = self.loopback_targets;
        let candidate = self
            .observed
            .candidate()
            .filter(|a| targets::punch_target_allowed(&path_addr(*a, self.quic), loopback));
        if candidate != self.candidate {
            self.candidate = candidate;
            if let Some(a) = candidate {
                if self.repunch.offer(a, Instant::now()) {
                    // dcutr never drops a candidate: a fresh one knows
                    // only the new address (`repunch.rs`).
                    tracing::info!(new = %a, "our observed address changed: punches offer only the new one, and peers are punched again");
                    self.inner = dcutr::Behaviour::new(self.me);
                    self.queued.clear();
                }
                self.queued.push_back(path_addr(a, self.quic));
            }
        }
        changed
    }

    /// The routers' observations of our address.
    pub(crate) fn observations(&self) -> &nat::Observed {
        &self.observed
    }

    /// Whether `id` is a dial dcutr made (a punch): its failure is no
    /// caller's.
    pub(crate) fn is_punch(&self, id: &ConnectionId) -> bool {
        self.punches.contains(id)
    }

    /// Whether a punch runs on relayed connection `id` now (the engine
    /// does not close it for idleness then: that would cut the punch).
    pub(crate) fn punch_runs_on(&self, id: ConnectionId) -> bool {
        self.open.punch_runs_on(id, Instant::now())
    }

    /// Whether `peer` holds a relayed connection to us now.
    pub(crate) fn has_relayed(&self, peer: &PeerId) -> bool {
        self.relayed.contains_key(peer)
    }

    /// Whether a relayed connection to `peer` should be punched; counts
    /// the skip when not.
    #[cfg(test)]
    fn should_punch(&mut self, peer: &PeerId, now: Instant) -> bool {
        self.upgrade_for(peer, now) == Upgrade::Punch
    }

    /// What a new relayed connection to `peer` gets: a punch, a reversal
    /// (our NAT is endpoint-dependent), or nothing (the skip counted).
    fn upgrade_for(&mut self, peer: &PeerId, now: Instant) -> Upgrade {
        if !self.enabled {
            return Upgrade::Skip;
        }
        let dependent = self.observed.kind() == NatKind::EndpointDependent;
        let backed_off = self.backoff.get(peer).is_some_and(|b| now < b.until);
        let skip = if backed_off && !self.repunch.may_skip_backoff(peer) {
            Some("skipped_backoff")
        } else if self.open.full() {
            Some("skipped_full")
        } else if self.open.punch_under_way(peer, now) {
            // Another relayed connection to it while a punch is under way
            // would punch twice.
            Some("skipped_in_progress")
        } else if dependent && self.reversing(peer) {
            Some("skipped_endpoint_dependent")
        } else if dependent {
            self.starting(*peer, now, backed_off);
            return Upgrade::Reverse;
        } else if self.candidate.is_none() {
            Some("skipped_no_address")
        } else {
            None
        };
        if let Some(why) = skip {
            self.metrics.upgrade(why);
            tracing::debug!(%peer, why, "no punch on this relayed connection");
            return Upgrade::Skip;
        }
        self.starting(*peer, now, backed_off);
        Upgrade::Punch
    }

    /// A punch or reversal to `peer` starts; counted as a re-punch when we
    /// punched it before our address changed (`early`: past its backoff).
    fn starting(&mut self, peer: PeerId, now: Instant, early: bool) {
        if self.repunch.due(&peer) {
            self.metrics.upgrade("repunched");
            tracing::debug!(%peer, early, "punching again after our address changed");
        }
        self.repunch.started(peer, now, early);
    }

    /// The handler of a new relayed connection `id` to `peer`: dcutr's when
    /// it punches (its exchange starts now: a punch is under way), else
    /// none of dcutr's; ours for reversal either way (asking when our NAT
    /// is endpoint-dependent, answering always).
    fn relayed_handler(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        dcutr: impl FnOnce(&mut dcutr::Behaviour) -> Result<InnerHandler, ConnectionDenied>,
    ) -> Result<Handler, ConnectionDenied> {
        self.relayed_up(peer, id);
        let upgrade = self.upgrade_for(&peer, Instant::now());
        let inner = if upgrade == Upgrade::Punch {
            let now = Instant::now();
            self.gate.punch_started(peer, now);
            self.open.punch_began(peer, id, now);
            dcutr(&mut self.inner)?
        } else {
            Either::Right(dummy::ConnectionHandler)
        };
        let ask = upgrade == Upgrade::Reverse;
        Ok(Either::Left(inner.select(reversal::Handler::new(ask))))
    }

    fn relayed_up(&mut self, peer: PeerId, id: ConnectionId) {
        self.relayed.entry(peer).or_default().insert(id);
    }

    /// As if `peer` held a relayed connection to us and a punch with it
    /// were under way (what needs a router and dcutr's exchange), so a
    /// test's peer can open a direct connection with real handshakes.
    #[cfg(test)]
    pub(crate) fn as_if_punching(&mut self, peer: PeerId) {
        self.relayed_up(peer, ConnectionId::new_unchecked(usize::MAX));
        self.gate.punch_started(peer, Instant::now());
    }

    fn punched(&mut self, peer: PeerId, ok: bool, now: Instant) {
        if ok {
            self.metrics.upgrade("direct");
            self.punch_succeeded(&peer, now);
        } else if self.open.direct_since_punch_began(&peer) {
            // Our dial lost to the peer's, which brought the direct
            // connection up (it arrived before our dial was made, or
            // first): not a failure, and no backoff.
            tracing::debug!(%peer, "punch ended without our dial: a direct connection is up");
            self.punch_succeeded(&peer, now);
        } else if self.open.unlanded(&peer) == open::Unlanded::NoExchange {
            // The peer declined the exchange (it backs off from us, say
            // after a path that died, and its own re-punch is due only on
            // its side) or the relayed connection failed: backing off
            // here would refuse the peer's re-punch after its address
            // changes (`repunch.rs`), for nothing about the path.
            self.metrics.upgrade("no_exchange");
            tracing::debug!(%peer, "punch ended before any dial: no backoff");
            self.open.punch_ended(&peer);
        } else {
            self.metrics.upgrade("failed");
            self.back_off(peer, now);
        }
    }

    /// The punch with `peer` ended with a direct connection up, by our
    /// dial or the peer's.
    fn punch_succeeded(&mut self, peer: &PeerId, now: Instant) {
        if let Some(began) = self.open.punch_ended(peer) {
            self.metrics
                .punch_duration
                .observe(now.saturating_duration_since(began).as_secs_f64());
        }
        self.backoff.remove(peer);
        self.repunch.succeeded(peer);
    }

    /// A call's stream failed on the direct connection to `peer` (it is
    /// being closed): counted, and the next punch to `peer` waits out a
    /// backoff as after a failed punch, so a path that punches but carries
    /// nothing is not taken again at once.
    pub(crate) fn path_failed(&mut self, peer: PeerId) {
        self.metrics.direct_fallbacks.inc();
        self.back_off(peer, Instant::now());
    }

    fn back_off(&mut self, peer: PeerId, now: Instant) {
        self.open.punch_ended(&peer);
        if self.backoff.len() >= MAX_BACKOFF_PEERS && !self.backoff.contains_key(&peer) {
            self.backoff.retain(|_, b| b.until > now);
            if self.backoff.len() >= MAX_BACKOFF_PEERS {
                // Full of live backoffs: this peer may be punched again
                // sooner than its backoff; nothing else is lost.
                return;
            }
        }
        let backoffs = self.backoffs;
        let b = self.backoff.entry(peer).or_insert(Backoff {
            failures: 0,
            until: now,
        });
        b.failures = b.failures.saturating_add(1);
        b.until = now + jittered_backoff(b.failures, backoffs);
    }

    /// Sets `direct_connections{nat}`: the open direct connections under
    /// our NAT kind as now classified, zero under the others.
    fn count_direct(&self) {
        self.metrics
            .set_direct_connections(self.observed.kind().as_str(), self.open.len());
    }

    fn note_punch(&mut self, id: ConnectionId) {
        if self.punches.len() >= MAX_PUNCH_IDS {
            self.punches.pop_front();
        }
        self.punches.push_back(id);
    }
}

type InnerHandler = THandler<dcutr::Behaviour>;

impl Behaviour {
    /// Whether the current dcutr behaviour may see `event`: not a
    /// candidate other than the one we offer now (one queued before a
    /// change), not the close of a direct connection it never saw
    /// established (one from before it replaced the last: dcutr panics on
    /// those).
    fn for_inner(&mut self, event: &FromSwarm) -> bool {
        match event {
            FromSwarm::NewExternalAddrCandidate(c) => {
                self.candidate.map(|a| path_addr(a, self.quic)).as_ref() == Some(c.addr)
            }
            FromSwarm::ConnectionClosed(c) if !c.endpoint.is_relayed() => {
                self.repunch.inner_knows(&c.connection_id)
            }
            _ => true,
        }
    }
}

/// A relayed connection's (dcutr's or none, beside reversal's), or a
/// direct connection to a member's (the hello).
type Handler = Either<
    ConnectionHandlerSelect<InnerHandler, reversal::Handler>,
    Either<hello::Handler, dummy::ConnectionHandler>,
>;

fn no_handler() -> Handler {
    Either::Right(Either::Right(dummy::ConnectionHandler))
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = Handler;
    type ToSwarm = Event;

    /// A punch's dial is refused whole when the peer gave more than
    /// [`MAX_PUNCH_ADDRS`] addresses or any we must not dial (see
    /// [`targets::punch_target_allowed`]); counted as `bad_target`. Other dials
    /// (routers, circuits) are not ours to judge.
    fn handle_pending_outbound_connection(
        &mut self,
        id: ConnectionId,
        peer: Option<PeerId>,
        addresses: &[Multiaddr],
        role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if !self.is_punch(&id) {
            return Ok(Vec::new());
        }
        let loopback = self.loopback_targets;
        if let Some(p) = peer
            && self.open.young_direct_to(&p, Instant::now())
        {
            // The peer tried again before it saw the connection our dial
            // (or its own) brought up (over QUIC nothing else stops a
            // second: no tuple is shared). Counted here on the side
            // dialing as the dialer; the other side's skip is counted
            // where its next attempt is held back (`poll`).
            if role == Endpoint::Dialer {
                self.metrics.upgrade("skipped_direct");
            }
            tracing::debug!(%p, "punch dial not made: a direct connection to the peer came up just now");
            return Err(ConnectionDenied::new(Refused::AlreadyDirect(peer)));
        }
        if self.open.full() {
            // Filled up since the punch began.
            self.metrics.upgrade("skipped_full");
            return Err(ConnectionDenied::new(Refused::Full(peer)));
        }
        if addresses.len() > MAX_PUNCH_ADDRS
            || !addresses
                .iter()
                .all(|a| targets::punch_target_allowed(a, loopback))
        {
            self.metrics.upgrade("bad_target");
            tracing::debug!(
                ?peer,
                ?addresses,
                "punch to addresses we do not dial: refused"
            );
            return Err(ConnectionDenied::new(Refused::BadTarget(peer)));
        }
        for a in addresses {
            if let Some(agentmesh_streams::dial::IpTarget::Tcp(to)) =
                agentmesh_streams::dial::ip_target(a)
            {
                self.log.mark_punch(to);
            }
        }
        Ok(Vec::new())
    }

    // No `handle_pending_inbound_connection`: inbound handshakes on the
    // listening port are bounded by the transport, which admits each
    // connection as it is accepted, before the swarm sees it, and sheds
    // the least progressed for a newcomer (`transport/handshakes.rs`);
    // one owner of that count, so nothing here counts them again.

    fn handle_established_inbound_connection(
        &mut self,
        id: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if is_relayed(local_addr) {
            return self.relayed_handler(peer, id, |d| {
                d.handle_established_inbound_connection(id, peer, local_addr, remote_addr)
            });
        } else if !self.enabled {
            self.metrics.refused("direct_off");
            return Err(ConnectionDenied::new(Refused::DirectOff(peer)));
        } else if !self.has_relayed(&peer) {
            self.metrics.refused("no_relayed_connection");
            tracing::debug!(%peer, %remote_addr, "inbound direct connection from a peer without a relayed connection: closed");
            return Err(ConnectionDenied::new(Refused::NoRelayedConnection(peer)));
        } else if !self.gate.is_punching(&peer, Instant::now()) {
            self.metrics.refused("not_punching");
            tracing::debug!(%peer, %remote_addr, "inbound direct connection from a peer in no punch with us: closed");
            return Err(ConnectionDenied::new(Refused::NotPunching(peer)));
        } else if self.open.full() {
            self.metrics.refused("direct_full");
            tracing::debug!(%peer, %remote_addr, "inbound direct connection past --direct-max-connections: closed");
            return Err(ConnectionDenied::new(Refused::Full(Some(peer))));
        }
        // dcutr keeps its own account of direct connections; its handler
        // for them does nothing, the hello's takes its place.
        self.inner
            .handle_established_inbound_connection(id, peer, local_addr, remote_addr)?;
        self.repunch.inner_saw(id);
        Ok(self.hello_handler(id))
    }

    fn handle_established_outbound_connection(
        &mut self,
        id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role_override: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if is_relayed(addr) {
            return self.relayed_handler(peer, id, |d| {
                d.handle_established_outbound_connection(id, peer, addr, role_override, port_use)
            });
        }
        self.inner.handle_established_outbound_connection(
            id,
            peer,
            addr,
            role_override,
            port_use,
        )?;
        self.repunch.inner_saw(id);
        if self.is_punch(&id) || self.has_relayed(&peer) {
            // A direct connection to a member: the hello.
            return Ok(self.hello_handler(id));
        }
        Ok(no_handler())
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        if let FromSwarm::ListenFailure(f) = &event {
            self.repunch.inner_knows(&f.connection_id);
        }
        if let FromSwarm::DialFailure(f) = &event {
            self.reversal_dialed(&f.connection_id, Err(f.error), Instant::now());
            self.repunch.inner_knows(&f.connection_id);
        }
        if let FromSwarm::ConnectionEstablished(e) = &event {
            self.reversal_dialed(&e.connection_id, Ok(()), Instant::now());
        }
        if let FromSwarm::ConnectionEstablished(ConnectionEstablished {
            peer_id,
            connection_id,
            endpoint,
            ..
        }) = &event
            && !is_relayed(endpoint.get_remote_address())
            && !is_relayed(local_or_remote(endpoint))
            && (self.is_punch(connection_id) || self.has_relayed(peer_id))
        {
            self.open.opened(*connection_id, *peer_id, Instant::now());
            self.gate.opened(*connection_id, *peer_id, Instant::now());
            self.count_direct();
        }
        if let FromSwarm::ConnectionClosed(ConnectionClosed {
            peer_id,
            connection_id,
            cause,
            endpoint,
            ..
        }) = &event
        {
            let ours = self.gate.closed(connection_id);
            if self.open.closed(connection_id).is_some() {
                self.metrics
                    .direct_closed(ours.unwrap_or_else(|| close_reason(*cause)));
                self.count_direct();
            }
            if self.open.relayed_closed(peer_id, *connection_id) {
                self.metrics.upgrade("abandoned");
                tracing::debug!(
                    peer = %peer_id,
                    relayed_dialer = endpoint.is_dialer(),
                    cause = ?cause,
                    "a punch's relayed connection closed before its result"
                );
            }
            if let Some(set) = self.relayed.get_mut(peer_id) {
                set.remove(connection_id);
                if set.is_empty() {
                    self.relayed.remove(peer_id);
                }
            }
        }
        if !self.for_inner(&event) {
            return;
        }
        self.inner.on_swarm_event(event);
    }

    fn on_connection_handler_event(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {
            Either::Left(Either::Left(e)) => self.inner.on_connection_handler_event(peer, id, e),
            Either::Left(Either::Right(reversal::Out::Asked)) => {
                self.reversal_asked(peer, id, Instant::now())
            }
            Either::Left(Either::Right(reversal::Out::Answered(a))) => {
                self.reversal_answered(peer, a, Instant::now())
            }
            Either::Right(Either::Left(heard)) => self.gate.heard(peer, id, heard),
            Either::Right(Either::Right(never)) => libp2p::core::util::unreachable(never),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<ToSwarm<Event, THandlerInEvent<Self>>> {
        if let Some(addr) = self.queued.pop_front() {
            return Poll::Ready(ToSwarm::NewExternalAddrCandidate(addr));
        }
        if let Some((peer_id, id)) = self.gate.next_close() {
            return Poll::Ready(ToSwarm::CloseConnection {
                peer_id,
                connection: CloseConnection::One(id),
            });
        }
        if let Some(next) = self.reversals.next() {
            return Poll::Ready(next);
        }
        if let Some((peer, connection, heard)) = self.gate.next_heard() {
            return Poll::Ready(ToSwarm::GenerateEvent(Event::Hello {
                peer,
                connection,
                heard,
            }));
        }
        let event = loop {
            let event = match self.inner.poll(cx) {
                Poll::Ready(e) => e,
                Poll::Pending => return Poll::Pending,
            };
            // dcutr's only handler notification: try the punch again after
            // our dial failed. Not when the peer's dial already brought a
            // direct connection up during this punch (over QUIC its
            // handshake can arrive before our hole punch waits for it;
            // over TCP at our listening port): another attempt would make
            // the peer dial again, a second connection.
            if let ToSwarm::NotifyHandler { peer_id, .. } = &event
                && self.open.direct_since_punch_began(peer_id)
            {
                let peer = *peer_id;
                self.metrics.upgrade("skipped_direct");
                tracing::debug!(%peer, "punch not tried again: the peer's dial connected us");
                self.punch_succeeded(&peer, Instant::now());
                continue;
            }
            break event;
        };
        match &event {
            ToSwarm::GenerateEvent(e) => {
                match &e.result {
                    Ok(_) => {
                        tracing::debug!(peer = %e.remote_peer_id, "punched: direct connection up")
                    }
                    Err(err) => {
                        tracing::debug!(peer = %e.remote_peer_id, error = %err, "punch failed")
                    }
                }
                self.punched(e.remote_peer_id, e.result.is_ok(), Instant::now());
            }
            ToSwarm::Dial { opts } => {
                // dcutr dials once its exchange with the peer on the
                // relayed connection is done: a punch with it is under way.
                self.note_punch(opts.connection_id());
                if let Some(peer) = opts.get_peer_id() {
                    self.gate.punch_started(peer, Instant::now());
                    self.open.punch_dialed(&peer);
                }
            }
            _ => {}
        }
        Poll::Ready(
            event
                .map_in(|e| Either::Left(Either::Left(e)))
                .map_out(Event::Punched),
        )
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_repunch;
#[cfg(test)]
mod tests_reversal;
#[cfg(test)]
mod tests_streams;
