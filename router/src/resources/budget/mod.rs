//! Pure budget policy: given the counts in use, may one more stream or
//! connection open, and what does it cost? No I/O, no clocks, no locks;
//! the manager passes counts in and applies the answer.

use std::collections::BTreeMap;

use std::time::Duration;

use agentmesh_proto::protocols;

pub(crate) mod stranger_pool;

use stranger_pool::StrangerUsage;

/// Memory charged for a stream that carries data (relay circuits, calls): its
/// full yamux receive window.
pub(crate) const DATA_STREAM_CHARGE_BYTES: u64 = 256 * 1024;
/// Memory charged for a control stream (auth, catalog, kad, identify, ...):
/// one maximal frame, which its handler reads promptly.
pub(crate) const CONTROL_STREAM_CHARGE_BYTES: u64 = protocols::MAX_FRAME_BYTES as u64;
/// Memory charged for a ping stream: its frames are 32 bytes, read as they
/// come, so it holds the stream's state and small buffers only. Every
/// connection keeps two (one each way) for its whole life, so charging them
/// a maximal frame would dwarf the connection itself. Measured together
/// with the connection (`tests/all/connection_charge.rs`).
pub(crate) const PING_STREAM_CHARGE_BYTES: u64 = 4 * 1024;
/// The least memory one peer's inbound streams may hold whatever the
/// per-peer share of a small budget comes to: four data streams, so every
/// peer can still reserve and call through a router with little memory
/// (the system budget still applies).
pub(crate) const PEER_MEMORY_FLOOR_BYTES: u64 = 4 * DATA_STREAM_CHARGE_BYTES;

/// The per-peer memory cap for a budget of `memory_budget_bytes`: `percent`
/// of it, at least [`PEER_MEMORY_FLOOR_BYTES`].
pub(crate) fn peer_memory_bytes(memory_budget_bytes: u64, percent: u8) -> u64 {
    crate::resources::memory::budget(memory_budget_bytes, percent).max(PEER_MEMORY_FLOOR_BYTES)
}

/// Long-lived streams of an idle attached member: a ping stream each way.
pub(crate) const IDLE_MEMBER_PING_STREAMS: u64 = 2;

/// A protocol as the resource manager sees it (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Proto {
    /// `/agentmesh/auth/1`.
    Auth,
    /// `/agentmesh/catalog/1`.
    Catalog,
    /// `/agentmesh/call/1` (members only; a router never serves it).
    Call,
    /// `/agentmesh/goaway/1`.
    Goaway,
    /// Relay v2 HOP: reservations and circuits, from the source member.
    RelayHop,
    /// Relay v2 STOP: the circuit's leg to the destination member.
    RelayStop,
    /// Identify and identify push.
    Identify,
    /// The router DHT (`/agentmesh/kad/1`).
    Kad,
    /// Ping.
    Ping,
    /// Anything else.
    Other,
}

impl Proto {
    /// Number of variants.
    pub(crate) const COUNT: usize = 10;
    /// Every protocol, in label order.
    pub(crate) const ALL: [Proto; Self::COUNT] = [
        Proto::Auth,
        Proto::Catalog,
        Proto::Call,
        Proto::Goaway,
        Proto::RelayHop,
        Proto::RelayStop,
        Proto::Identify,
        Proto::Kad,
        Proto::Ping,
        Proto::Other,
    ];

    /// The metric label (and the name used in `--stream-budget PROTOCOL=N`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Catalog => "catalog",
            Self::Call => "call",
            Self::Goaway => "goaway",
            Self::RelayHop => "relay_hop",
            Self::RelayStop => "relay_stop",
            Self::Identify => "identify",
            Self::Kad => "kad",
            Self::Ping => "ping",
            Self::Other => "other",
        }
    }

    /// The protocol named by a label, if any.
    pub(crate) fn from_label(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Classifies a negotiated protocol id.
    pub(crate) fn from_protocol_id(id: &str) -> Self {
        match id {
            protocols::AUTH => Self::Auth,
            protocols::CATALOG => Self::Catalog,
            protocols::CALL => Self::Call,
            protocols::GOAWAY => Self::Goaway,
            "/libp2p/circuit/relay/0.2.0/hop" => Self::RelayHop,
            "/libp2p/circuit/relay/0.2.0/stop" => Self::RelayStop,
            "/ipfs/id/1.0.0" | "/ipfs/id/push/1.0.0" => Self::Identify,
            crate::protocols::KAD_PROTOCOL => Self::Kad,
            "/ipfs/ping/1.0.0" => Self::Ping,
            _ => Self::Other,
        }
    }

    /// Array index.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// Whether streams of this protocol carry bulk data (charged a full window).
    pub(crate) fn carries_data(self) -> bool {
        matches!(self, Self::RelayHop | Self::RelayStop | Self::Call)
    }

    /// Memory charged per live stream of this protocol.
    pub(crate) fn charge_bytes(self) -> u64 {
        if self.carries_data() {
            DATA_STREAM_CHARGE_BYTES
        } else if self == Self::Ping {
            PING_STREAM_CHARGE_BYTES
        } else {
            CONTROL_STREAM_CHARGE_BYTES
        }
    }
}

/// What ran out (the `resource` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Resource {
    /// A connection.
    Connection,
    /// A stream.
    Stream,
    /// The memory budget.
    Memory,
    /// A relay reservation.
    Reservation,
    /// A relay circuit.
    Circuit,
}

impl Resource {
    /// Every resource.
    pub(crate) const ALL: [Resource; 5] = [
        Self::Connection,
        Self::Stream,
        Self::Memory,
        Self::Reservation,
        Self::Circuit,
    ];
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Stream => "stream",
            Self::Memory => "memory",
            Self::Reservation => "reservation",
            Self::Circuit => "circuit",
        }
    }
}

/// Whose budget ran out (the `scope` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// The whole router.
    System,
    /// One protocol across the router.
    Protocol,
    /// One peer (PeerId).
    Peer,
    /// One source: an IP, IPv4 address or IPv6 prefix (unauthenticated
    /// connections, failed logins, a source's share of the strangers'
    /// memory), or the member that asked for a circuit (its share of the
    /// circuits to one destination).
    Source,
    /// One connection (relay STOP handshakes in flight on it).
    Connection,
    /// The strangers' memory (peers not admitted; `strangers.rs`).
    Unauthenticated,
}

impl Scope {
    /// Every scope.
    pub(crate) const ALL: [Scope; 6] = [
        Self::System,
        Self::Protocol,
        Self::Peer,
        Self::Source,
        Self::Connection,
        Self::Unauthenticated,
    ];
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Protocol => "protocol",
            Self::Peer => "peer",
            Self::Source => "source",
            Self::Connection => "connection",
            Self::Unauthenticated => "unauthenticated",
        }
    }
}

/// A refusal: which resource, in which scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// What ran out.
    pub(crate) resource: Resource,
    /// Whose budget.
    pub(crate) scope: Scope,
}

impl Refusal {
    /// A refusal of `resource` in `scope`.
    pub(crate) fn new(resource: Resource, scope: Scope) -> Self {
        Self { resource, scope }
    }
}

/// Effective budgets (all counts are live streams or connections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Budgets {
    /// Memory the charges may add up to, bytes.
    pub(crate) memory_bytes: u64,
    /// Charge of one connection, bytes.
    pub(crate) connection_charge_bytes: u64,
    /// Memory the inbound streams of one peer may hold, bytes (see
    /// [`admit_inbound_stream`]).
    pub(crate) peer_memory_bytes: u64,
    /// Memory the connections and inbound streams of peers not admitted
    /// may hold together, bytes (`strangers.rs`).
    pub(crate) unauthenticated_memory_bytes: u64,
    /// Inbound streams across the router.
    pub(crate) system_streams: u32,
    /// Inbound streams per protocol across the router.
    pub(crate) protocol_streams: [u32; Proto::COUNT],
    /// Inbound streams of one peer, all protocols.
    pub(crate) peer_streams: u32,
    /// Inbound streams of one peer per protocol.
    pub(crate) peer_protocol_streams: [u32; Proto::COUNT],
    /// Relay STOP streams (circuits) to one destination peer.
    pub(crate) circuits_per_destination: u32,
    /// Relay STOP handshakes in flight on one connection (see
    /// [`admit_outbound_stream`]).
    pub(crate) stop_handshakes_per_connection: u32,
    /// Connections from one IP whose peer is not admitted.
    pub(crate) unauthenticated_connections_per_ip: u32,
    /// Failed logins from one source within a minute that block it.
    pub(crate) failed_logins_per_ip_per_minute: u32,
    /// How long a block lasts (`logins.rs`).
    pub(crate) failed_login_block: Duration,
    /// Bits of an IPv6 source that make its per-source key (see `source.rs`).
    pub(crate) ipv6_source_prefix_len: u8,
    /// Inbound connections in their handshake at once, all sources,
    /// shared fairly by source (`slots.rs`).
    pub(crate) pending_connections_max: u32,
}

/// Inputs from which default budgets are derived.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watermarks {
    /// Admitted members the router aims to hold.
    pub(crate) high_watermark: u32,
    /// Relay circuits at most in total.
    pub(crate) relay_max_circuits: u32,
    /// Relay reservations at most.
    pub(crate) relay_max_reservations: u32,
}

/// Default system-wide live inbound streams of `p`, from the watermarks.
pub(crate) fn default_protocol_budget(p: Proto, w: Watermarks) -> u32 {
    let hw = w.high_watermark.max(1);
    match p {
        // Every member may be (re-)authenticating or asking the catalog at once.
        Proto::Auth | Proto::Goaway | Proto::Call => hw,
        Proto::Catalog | Proto::Identify | Proto::Ping => hw.saturating_mul(2),
        // Every circuit holds its HOP stream; reservations hold one briefly.
        Proto::RelayHop => w
            .relay_max_circuits
            .saturating_add(w.relay_max_reservations),
        Proto::RelayStop => hw,
        // Routers only: 32 streams (kad's own per-connection cap) × 64 routers.
        Proto::Kad => 32 * 64,
        Proto::Other => 64,
    }
}

/// Default live inbound streams of one peer per protocol.
pub(crate) fn default_peer_budget(p: Proto) -> u32 {
    match p {
        Proto::Auth | Proto::Goaway | Proto::Call | Proto::RelayStop | Proto::Identify => 4,
        Proto::Ping => 2,
        Proto::Catalog => 16,
        Proto::RelayHop => 256,
        Proto::Kad => 32,
        Proto::Other => 4,
    }
}

/// Default overrides applied: `overrides` maps labels to counts.
pub(crate) fn per_protocol(
    default: impl Fn(Proto) -> u32,
    overrides: &BTreeMap<String, u32>,
) -> [u32; Proto::COUNT] {
    Proto::ALL.map(|p| {
        overrides
            .get(p.as_str())
            .copied()
            .unwrap_or_else(|| default(p))
    })
}

/// Live counts relevant to one new inbound stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamUsage {
    /// Inbound streams across the router.
    pub(crate) system: u32,
    /// Inbound streams of this protocol across the router.
    pub(crate) protocol: u32,
    /// Inbound streams of this peer.
    pub(crate) peer: u32,
    /// Inbound streams of this peer and protocol.
    pub(crate) peer_protocol: u32,
    /// Memory charged now, bytes.
    pub(crate) memory_bytes: u64,
    /// Memory charged now to this peer's inbound streams, bytes.
    pub(crate) peer_memory_bytes: u64,
    /// The strangers' memory, when the peer is not admitted.
    pub(crate) stranger: Option<StrangerUsage>,
}

/// May one more inbound stream of `p` open? `Ok(charge)` or the refusal.
/// Order: the system's memory, the strangers' memory (a peer not
/// admitted), the peer's memory, then the narrowest scope first
/// (peer+protocol, peer, protocol, system), so a flooding peer is told it
/// is the peer.
///
/// The peer's memory is what its own inbound streams hold (a caller's relay
/// HOP streams, one window per circuit it opens): a few busy peers cannot
/// take the whole budget. Its connections are not counted (one charge
/// each, bounded per source before admission), nor the STOP streams of
/// circuits towards it, which other peers open (bounded by
/// `circuits_per_destination`).
pub(crate) fn admit_inbound_stream(b: &Budgets, p: Proto, u: StreamUsage) -> Result<u64, Refusal> {
    let charge = p.charge_bytes();
    if u.memory_bytes.saturating_add(charge) > b.memory_bytes {
        return Err(Refusal::new(Resource::Memory, Scope::System));
    }
    if let Some(s) = u.stranger {
        stranger_pool::admit(b.unauthenticated_memory_bytes, s, charge)?;
    }
    if u.peer_memory_bytes.saturating_add(charge) > b.peer_memory_bytes {
        return Err(Refusal::new(Resource::Memory, Scope::Peer));
    }
    if u.peer_protocol >= b.peer_protocol_streams[p.index()] || u.peer >= b.peer_streams {
        return Err(Refusal::new(Resource::Stream, Scope::Peer));
    }
    if u.protocol >= b.protocol_streams[p.index()] {
        return Err(Refusal::new(Resource::Stream, Scope::Protocol));
    }
    if u.system >= b.system_streams {
        return Err(Refusal::new(Resource::Stream, Scope::System));
    }
    Ok(charge)
}

/// Live counts relevant to one new outbound stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutboundUsage {
    /// Outbound streams of this protocol to the peer (circuits, for STOP).
    pub(crate) to_peer: u32,
    /// STOP handshakes in flight on this connection.
    pub(crate) handshakes_on_connection: u32,
    /// Memory charged now, bytes.
    pub(crate) memory_bytes: u64,
}

/// May the router open one more outbound stream of `p`? Only circuits (STOP)
/// are capped: per destination peer, and per connection while their
/// handshake is in flight. libp2p-relay runs at most 10 STOP handshakes per
/// connection and drops the next stream with only a log line, so the
/// circuit's source waits out its timeout (and its relay client then drops
/// its own reservation here); a STOP stream refused by us instead fails its
/// handshake at once and the source is denied straight away. Data streams
/// also need memory. Control streams the router opens itself are bounded by
/// its own logic and always allowed.
pub(crate) fn admit_outbound_stream(
    b: &Budgets,
    p: Proto,
    u: OutboundUsage,
) -> Result<u64, Refusal> {
    let charge = p.charge_bytes();
    if p == Proto::RelayStop {
        if u.to_peer >= b.circuits_per_destination {
            return Err(Refusal::new(Resource::Circuit, Scope::Peer));
        }
        if u.handshakes_on_connection >= b.stop_handshakes_per_connection {
            return Err(Refusal::new(Resource::Circuit, Scope::Connection));
        }
    }
    if p.carries_data() && u.memory_bytes.saturating_add(charge) > b.memory_bytes {
        return Err(Refusal::new(Resource::Memory, Scope::System));
    }
    Ok(charge)
}

/// Live counts relevant to charging one circuit to its source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CircuitSourceUsage {
    /// Circuits (STOP streams) to the destination besides this one.
    pub(crate) to_destination: u32,
    /// Of those, circuits the same source asked for.
    pub(crate) from_source: u32,
}

/// May one more circuit to a destination be charged to its source (the
/// member that asked for it)? A source holding some circuits to the
/// destination gets another only while it holds fewer than remain free
/// (`circuits_per_destination` minus those held); a source holding none
/// gets in while any is free. Alone, a source thus gets at most half the
/// cap, the next at most half of what is left, and so on: the share never
/// binds while the destination is less than half full, one member (or a
/// few) can never take every circuit to another, and near the cap only
/// sources holding few get in. No circuit is taken back: the relay cannot
/// close one circuit of a source, so the share leaves room instead.
pub(crate) fn admit_circuit_source(b: &Budgets, u: CircuitSourceUsage) -> Result<(), Refusal> {
    let free = b.circuits_per_destination.saturating_sub(u.to_destination);
    if u.from_source > 0 && u.from_source >= free {
        return Err(Refusal::new(Resource::Circuit, Scope::Source));
    }
    Ok(())
}

/// Whether a source already holding `held` unauthenticated connections
/// (handshakes included) may not open one more. One past the cap is let in:
/// a newcomer at the cap evicts the source's oldest unauthenticated
/// connection once it is up (the swarm loop, `admission::conns`), so an
/// attacker holding a source's whole share cannot keep a member behind
/// the same address out. The source holds at most the cap again once that
/// close completes; until then further newcomers are refused.
pub(crate) fn past_source_cap(b: &Budgets, held: u32) -> bool {
    held > b.unauthenticated_connections_per_ip
}

/// Live counts relevant to one new inbound connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConnectionUsage {
    /// Memory charged now, bytes.
    pub(crate) memory_bytes: u64,
    /// Whether the connecting peer is already admitted (e.g. a second connection).
    pub(crate) peer_admitted: bool,
    /// Connections from the same source whose peers are not admitted.
    pub(crate) unauthenticated_from_source: u32,
    /// Whether the source is blocked for failed logins (`logins.rs`).
    pub(crate) source_blocked: bool,
    /// The strangers' memory (used when the peer is not admitted).
    pub(crate) stranger: StrangerUsage,
}

/// May one more inbound connection open? `Ok(charge)` or the refusal.
/// Per-source limits and the strangers' memory never apply to a peer that
/// is already admitted.
pub(crate) fn admit_inbound_connection(b: &Budgets, u: ConnectionUsage) -> Result<u64, Refusal> {
    let charge = b.connection_charge_bytes;
    if u.memory_bytes.saturating_add(charge) > b.memory_bytes {
        return Err(Refusal::new(Resource::Memory, Scope::System));
    }
    if u.peer_admitted {
        return Ok(charge);
    }
    if past_source_cap(b, u.unauthenticated_from_source) || u.source_blocked {
        return Err(Refusal::new(Resource::Connection, Scope::Source));
    }
    stranger_pool::admit(b.unauthenticated_memory_bytes, u.stranger, charge)?;
    Ok(charge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn budgets() -> Budgets {
        let w = Watermarks {
            high_watermark: 100,
            relay_max_circuits: 1000,
            relay_max_reservations: 100,
        };
        Budgets {
            memory_bytes: 64 << 20,
            connection_charge_bytes: 1 << 20,
            peer_memory_bytes: 4 << 20,
            unauthenticated_memory_bytes: 8 << 20,
            system_streams: 1000,
            protocol_streams: per_protocol(|p| default_protocol_budget(p, w), &BTreeMap::new()),
            peer_streams: 64,
            peer_protocol_streams: per_protocol(default_peer_budget, &BTreeMap::new()),
            circuits_per_destination: 8,
            stop_handshakes_per_connection: 3,
            unauthenticated_connections_per_ip: 4,
            failed_logins_per_ip_per_minute: 10,
            failed_login_block: Duration::from_secs(10),
            ipv6_source_prefix_len: 64,
            pending_connections_max: 16,
        }
    }

    #[test]
    fn labels_round_trip_and_protocol_ids_classify() {
        for p in Proto::ALL {
            assert_eq!(Proto::from_label(p.as_str()), Some(p));
            assert_eq!(Proto::ALL[p.index()], p);
        }
        assert_eq!(Proto::from_protocol_id(protocols::AUTH), Proto::Auth);
        assert_eq!(
            Proto::from_protocol_id("/ipfs/id/push/1.0.0"),
            Proto::Identify
        );
        assert_eq!(
            Proto::from_protocol_id("/libp2p/circuit/relay/0.2.0/hop"),
            Proto::RelayHop
        );
        assert_eq!(Proto::from_protocol_id("/x/y"), Proto::Other);
    }

    #[test]
    fn overrides_replace_defaults() {
        let mut o = BTreeMap::new();
        o.insert("auth".to_string(), 7);
        let a = per_protocol(default_peer_budget, &o);
        assert_eq!(a[Proto::Auth.index()], 7);
        assert_eq!(
            a[Proto::Catalog.index()],
            default_peer_budget(Proto::Catalog)
        );
    }

    #[test]
    fn admitted_peer_is_never_limited_by_source() {
        let b = budgets();
        let u = ConnectionUsage {
            peer_admitted: true,
            unauthenticated_from_source: 1000,
            source_blocked: true,
            stranger: StrangerUsage {
                used_bytes: u64::MAX,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(admit_inbound_connection(&b, u).is_ok());
        let u = ConnectionUsage {
            peer_admitted: false,
            ..u
        };
        assert_eq!(
            admit_inbound_connection(&b, u),
            Err(Refusal::new(Resource::Connection, Scope::Source))
        );
    }

    #[test]
    fn strangers_are_charged_in_their_own_pool_and_members_are_not() {
        let b = budgets();
        let full = StrangerUsage {
            used_bytes: b.unauthenticated_memory_bytes,
            ..Default::default()
        };
        let pool_full = Err(Refusal::new(Resource::Memory, Scope::Unauthenticated));
        let u = ConnectionUsage {
            stranger: full,
            ..Default::default()
        };
        assert_eq!(admit_inbound_connection(&b, u), pool_full);
        let member = ConnectionUsage {
            peer_admitted: true,
            ..u
        };
        assert!(admit_inbound_connection(&b, member).is_ok());
        let stream = StreamUsage {
            stranger: Some(full),
            ..Default::default()
        };
        assert_eq!(admit_inbound_stream(&b, Proto::Auth, stream), pool_full);
        let member_stream = StreamUsage {
            stranger: None,
            ..stream
        };
        assert!(admit_inbound_stream(&b, Proto::Auth, member_stream).is_ok());
    }

    #[test]
    fn circuits_are_capped_per_destination_and_handshakes_per_connection() {
        let b = budgets();
        let u = |to_peer, handshakes_on_connection, memory_bytes| OutboundUsage {
            to_peer,
            handshakes_on_connection,
            memory_bytes,
        };
        assert!(admit_outbound_stream(&b, Proto::RelayStop, u(7, 2, 0)).is_ok());
        assert_eq!(
            admit_outbound_stream(&b, Proto::RelayStop, u(8, 0, 0)),
            Err(Refusal::new(Resource::Circuit, Scope::Peer))
        );
        assert_eq!(
            admit_outbound_stream(&b, Proto::RelayStop, u(1, 3, 0)),
            Err(Refusal::new(Resource::Circuit, Scope::Connection))
        );
        // The destination's cap is named first when both bite.
        assert_eq!(
            admit_outbound_stream(&b, Proto::RelayStop, u(8, 3, 0)),
            Err(Refusal::new(Resource::Circuit, Scope::Peer))
        );
        assert_eq!(
            admit_outbound_stream(&b, Proto::RelayStop, u(0, 0, u64::MAX)),
            Err(Refusal::new(Resource::Memory, Scope::System))
        );
        assert!(admit_outbound_stream(&b, Proto::Kad, u(10_000, 10_000, u64::MAX)).is_ok());
    }

    fn proto() -> impl Strategy<Value = Proto> {
        (0..Proto::COUNT).prop_map(|i| Proto::ALL[i])
    }

    proptest! {
        /// Admitting never lets any count pass its budget, and the charge is
        /// the protocol's. Each count is drawn as a share (0–125 %) of its
        /// own budget, so about a quarter of the cases are admitted and every
        /// kind of refusal is reached (uniform counts over fixed ranges were
        /// almost never all below the small per-peer protocol budgets).
        #[test]
        fn admitted_streams_stay_within_every_budget(
            p in proto(),
            f in proptest::array::uniform6(0.0f64..1.25),
        ) {
            let b = budgets();
            let share = |budget: u64, f: f64| (budget as f64 * f) as u64;
            let count = |budget: u32, f: f64| share(u64::from(budget), f) as u32;
            let (system, protocol, peer, peer_protocol) = (
                count(b.system_streams, f[0]),
                count(b.protocol_streams[p.index()], f[1]),
                count(b.peer_streams, f[2]),
                count(b.peer_protocol_streams[p.index()], f[3]),
            );
            let (memory_bytes, peer_memory_bytes) =
                (share(b.memory_bytes, f[4]), share(b.peer_memory_bytes, f[5]));
            let u = StreamUsage { system, protocol, peer, peer_protocol, memory_bytes, peer_memory_bytes, stranger: None };
            match admit_inbound_stream(&b, p, u) {
                Ok(charge) => {
                    prop_assert_eq!(charge, p.charge_bytes());
                    prop_assert!(memory_bytes + charge <= b.memory_bytes);
                    prop_assert!(peer_memory_bytes + charge <= b.peer_memory_bytes);
                    prop_assert!(system < b.system_streams);
                    prop_assert!(protocol < b.protocol_streams[p.index()]);
                    prop_assert!(peer < b.peer_streams);
                    prop_assert!(peer_protocol < b.peer_protocol_streams[p.index()]);
                }
                Err(r) => {
                    let over = match (r.resource, r.scope) {
                        (Resource::Memory, Scope::System) => memory_bytes + p.charge_bytes() > b.memory_bytes,
                        (Resource::Memory, Scope::Peer) => peer_memory_bytes + p.charge_bytes() > b.peer_memory_bytes,
                        (Resource::Stream, Scope::Peer) => peer >= b.peer_streams || peer_protocol >= b.peer_protocol_streams[p.index()],
                        (Resource::Stream, Scope::Protocol) => protocol >= b.protocol_streams[p.index()],
                        (Resource::Stream, Scope::System) => system >= b.system_streams,
                        _ => false,
                    };
                    prop_assert!(over, "refusal {:?} without its budget being spent", r);
                }
            }
        }

        /// Filling one peer's budget for one protocol from zero admits exactly
        /// the budget, and other protocols still have room.
        #[test]
        fn a_flood_on_one_protocol_leaves_the_others(p in proto()) {
            let b = budgets();
            let mut live = [0u32; Proto::COUNT];
            let mut admitted = 0;
            for _ in 0..10_000 {
                let u = StreamUsage {
                    system: live.iter().sum(),
                    protocol: live[p.index()],
                    peer: live.iter().sum(),
                    peer_protocol: live[p.index()],
                    memory_bytes: 0,
                    peer_memory_bytes: 0,
                    stranger: None,
                };
                if admit_inbound_stream(&b, p, u).is_ok() {
                    live[p.index()] += 1;
                    admitted += 1;
                }
            }
            prop_assert_eq!(admitted, b.peer_protocol_streams[p.index()].min(b.peer_streams));
            for q in Proto::ALL {
                if q != p && live.iter().sum::<u32>() < b.peer_streams {
                    let u = StreamUsage { system: live.iter().sum(), protocol: 0, peer: live.iter().sum(), peer_protocol: 0, memory_bytes: 0, peer_memory_bytes: 0, stranger: None };
                    prop_assert!(admit_inbound_stream(&b, q, u).is_ok());
                }
            }
        }

        /// Circuits to one destination opened and closed by five sources in
        /// any order (the per-destination cap checked first, as at a STOP
        /// stream's open): no source ever holds more than half the cap
        /// (rounded up), and a source holding none is refused only when
        /// the destination is full.
        #[test]
        fn circuit_source_shares_hold(
            cap in 1u32..40,
            ops in proptest::collection::vec((0usize..5, any::<bool>()), 1..400),
        ) {
            let b = Budgets { circuits_per_destination: cap, ..budgets() };
            let mut held = [0u32; 5];
            for (src, close) in ops {
                if close {
                    held[src] = held[src].saturating_sub(1);
                    continue;
                }
                let to_destination: u32 = held.iter().sum();
                if to_destination >= cap {
                    continue; // refused by the per-destination cap
                }
                let u = CircuitSourceUsage { to_destination, from_source: held[src] };
                match admit_circuit_source(&b, u) {
                    Ok(()) => held[src] += 1,
                    Err(r) => {
                        prop_assert_eq!((r.resource, r.scope), (Resource::Circuit, Scope::Source));
                        prop_assert!(held[src] > 0, "a source holding none refused below the cap");
                    }
                }
                prop_assert!(held[src] <= cap.div_ceil(2), "held {} of {}", held[src], cap);
            }
        }
    }

    #[test]
    fn a_lone_source_takes_half_the_circuits_and_the_next_half_of_the_rest() {
        let b = budgets(); // 8 circuits per destination
        let fill = |held_by_others: u32| {
            let mut mine = 0;
            while admit_circuit_source(
                &b,
                CircuitSourceUsage {
                    to_destination: held_by_others + mine,
                    from_source: mine,
                },
            )
            .is_ok()
                && held_by_others + mine < b.circuits_per_destination
            {
                mine += 1;
            }
            mine
        };
        assert_eq!(fill(0), 4);
        assert_eq!(fill(4), 2);
        assert_eq!(fill(6), 1);
        // One circuit left: a newcomer gets it.
        let u = CircuitSourceUsage {
            to_destination: 7,
            from_source: 0,
        };
        assert!(admit_circuit_source(&b, u).is_ok());
    }
}
