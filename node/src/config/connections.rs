//! The node's connections: how it dials, when an idle or dead connection
//! closes, the bounds of the streams and yamux windows on each, and the
//! direct connections between members.

use std::net::IpAddr;
use std::time::Duration;

/// Default time a relayed connection to a peer stays open after the last
/// call on it (`--relayed-idle-secs`).
pub const DEFAULT_RELAYED_IDLE: Duration = Duration::from_secs(3);
/// Default `--ping-interval-secs`: the routers' own interval. Pings were
/// ≈ 40% of what an idle member costs on both sides at libp2p-ping's 15 s
/// (2,003 members, release, CPU-s per member-hour, member side / routers:
/// 0.21 / 0.16 at 15 s, 0.17 / 0.12 at 30 s, 0.13 / 0.10 at 60 s; see
/// ladder/RESULTS.md). The router's pings already keep a NAT's
/// mapping alive and free a dead member's connection; the member's find a
/// dead router, which it holds beside K − 1 others, in about 90 s.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Default `--ping-timeout-secs` (libp2p-ping's own default).
pub const DEFAULT_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// Default inbound streams per protocol waiting for the node's accept loop
/// (`--stream-inbound-queue-per-protocol`): the streams crate's own default,
/// re-exported so it is defined once.
pub const DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL: usize =
    agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL;
/// Default opens waiting for a dial to one peer
/// (`--stream-max-pending-opens-per-peer`): the streams crate's default.
pub const DEFAULT_STREAM_MAX_PENDING_OPENS_PER_PEER: usize =
    agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER;
/// Default opens waiting for dials to all peers together
/// (`--stream-max-pending-opens-total`): the streams crate's default.
pub const DEFAULT_STREAM_MAX_PENDING_OPENS_TOTAL: usize =
    agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL;
/// Default yamux streams open at once on one connection
/// (`--yamux-max-streams`): yamux's and libp2p-yamux's own default.
pub const DEFAULT_YAMUX_MAX_STREAMS: usize = 512;
/// Default receive window of one yamux connection, KiB
/// (`--yamux-connection-window-kib`): 256 KiB for each of
/// [`DEFAULT_YAMUX_MAX_STREAMS`] (what yamux guarantees every stream) plus
/// 16 MiB one fast stream may grow into (its bandwidth-delay product up to
/// 1 Gbit/s at 128 ms), against libp2p-yamux's fixed 1 GiB.
pub const DEFAULT_YAMUX_CONNECTION_WINDOW_KIB: u64 =
    DEFAULT_YAMUX_MAX_STREAMS as u64 * 256 + 16 * 1024;

/// The swarm's connections (`crate::transport`): the source address of
/// dials, when idle, relayed-idle and dead connections close, and the
/// bounds of the streams behaviour and of yamux on each connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Outgoing TCP and QUIC connections leave from this local IP
    /// (`--dial-source-ip`, default none): one process can then hold more
    /// connections to a router than one address has ephemeral ports.
    pub dial_source_ip: Option<IpAddr>,
    /// Close connections (transit, finished circuits) idle this long
    /// (`--idle-connection-secs`, default 30 s; less than 1 s acts as 1 s).
    pub idle: Duration,
    /// Close a relayed connection (a circuit through a router) to a peer
    /// this long after the last call with that peer ended
    /// (`--relayed-idle-secs`, default 3 s; zero: off, only
    /// `idle` applies). Routers cap the circuits to one provider, and callers
    /// holding idle circuits would keep a popular provider at that cap. The
    /// calling side closes after this; the provider side after twice this
    /// (so it rarely closes under a caller that is about to reuse it).
    /// Counted in `agentmesh_node_relayed_idle_closed_total{direction}`.
    pub relayed_idle: Duration,
    /// Interval between pings on every connection (`--ping-interval-secs`,
    /// default 30 s; less than 1 s acts as 1 s). A connection whose pings
    /// fail twice in a row (libp2p-ping lets a first failure pass) is
    /// closed, so a router behind a dead link is replaced or redialed
    /// within about 2 × interval + timeout + 10 s (a new ping stream's
    /// negotiation timeout), not when TCP gives up many minutes later.
    pub ping_interval: Duration,
    /// How long a ping may go unanswered (`--ping-timeout-secs`, default
    /// 20 s; less than 1 s acts as 1 s).
    pub ping_timeout: Duration,
    /// Negotiated inbound streams of one protocol (calls, go-aways) that may
    /// wait for the node's accept loop; more are dropped and counted in
    /// `agentmesh_streams_inbound_dropped_total{reason="queue_full"}`
    /// (`--stream-inbound-queue-per-protocol`, default 16; 0 acts as 1).
    pub stream_inbound_queue_per_protocol: usize,
    /// Stream opens (auth, catalog, call, ...) that may wait for a dial to
    /// one peer not yet connected; more are refused at once, so a loop
    /// toward an unreachable peer cannot queue without end, and counted in
    /// `agentmesh_streams_pending_opens_refused_total{limit="per_peer"}`
    /// (`--stream-max-pending-opens-per-peer`, default 64; 0 acts as 1).
    pub stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together; more are
    /// refused and counted with `limit="total"`
    /// (`--stream-max-pending-opens-total`, default 4096; 0 acts as 1).
    pub stream_max_pending_opens_total: usize,
    /// Streams open at once on one yamux connection (to a router or a
    /// relayed peer); yamux resets more (`--yamux-max-streams`, default 512).
    pub yamux_max_streams: usize,
    /// Receive window of one yamux connection, all its streams together,
    /// KiB: what a peer may make this node buffer on one connection; at
    /// least 256 KiB per stream (`--yamux-connection-window-kib`, default
    /// [`DEFAULT_YAMUX_CONNECTION_WINDOW_KIB`]).
    pub yamux_connection_window_kib: u64,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            dial_source_ip: None,
            idle: Duration::from_secs(30),
            relayed_idle: DEFAULT_RELAYED_IDLE,
            ping_interval: DEFAULT_PING_INTERVAL,
            ping_timeout: DEFAULT_PING_TIMEOUT,
            stream_inbound_queue_per_protocol: DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
            stream_max_pending_opens_per_peer: DEFAULT_STREAM_MAX_PENDING_OPENS_PER_PEER,
            stream_max_pending_opens_total: DEFAULT_STREAM_MAX_PENDING_OPENS_TOTAL,
            yamux_max_streams: DEFAULT_YAMUX_MAX_STREAMS,
            yamux_connection_window_kib: DEFAULT_YAMUX_CONNECTION_WINDOW_KIB,
        }
    }
}

/// Direct connections between members (`docs/direct.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectConfig {
    /// Listen on one TCP port, dial every router and peer from it, learn
    /// the address routers observe, and upgrade relayed connections to
    /// direct ones by hole punching (`--direct`, default on; off, every
    /// call is relayed and the member listens on nothing).
    pub enabled: bool,
    /// The TCP port direct connections use, for listening and for every
    /// dial (`--listen-port`, default 0: a free port chosen at start).
    pub listen_port: u16,
    /// The address that port binds (`--listen-ip`, default `0.0.0.0`);
    /// with `--dial-source-ip`, dials leave from the source IP on that port.
    pub listen_ip: IpAddr,
    /// Pause before punching a peer again after its punch failed
    /// (`--punch-backoff-min-secs`, default 30 s), doubled per failure in
    /// a row up to `punch_backoff_max`, plus 0–50% jitter; skipped
    /// punches are counted as `skipped_backoff`.
    pub punch_backoff_min: Duration,
    /// Longest such pause (`--punch-backoff-max-secs`, default 900 s).
    pub punch_backoff_max: Duration,
    /// Inbound connections in their handshake on the listening port at
    /// once, all sources together (`--direct-max-pending-inbound`,
    /// default 64; 0 acts as 1). When all are taken, a newcomer from a
    /// source holding fewer than the heaviest source closes that source's
    /// least progressed handshake
    /// (`inbound_refused_total{reason="handshake_shed_lighter_source"}`),
    /// one from a source holding its fair share closes its own source's
    /// (`"handshake_shed_budget_full"`), and one whose source holds none
    /// while every source holds its share is refused at accept
    /// (`"pending_full"`). See `transport/handshakes.rs`.
    pub max_pending_inbound: usize,
    /// Inbound handshakes one source (an IPv4 address, an IPv6 /64) may
    /// hold at once (`--direct-max-pending-inbound-per-source`, default 8;
    /// 0 acts as 1): a newcomer past it closes its source's least
    /// progressed handshake (`"handshake_shed_source_full"`), so a flood
    /// of stalled connections sheds its own and a peer's punch, whose
    /// handshake moves at once, still completes.
    pub max_pending_inbound_per_source: usize,
    /// How long bytes written on a member's TCP socket may stay
    /// unacknowledged before the kernel drops the connection
    /// (`TCP_USER_TIMEOUT`; `--direct-tcp-user-timeout-secs`, default 10 s;
    /// zero: the kernel's default, about 15 minutes of retransmissions).
    /// A direct path that stops carrying bytes then fails the streams on
    /// it within this bound instead of hanging them, and the calls move to
    /// the relay. Counted in
    /// `agentmesh_node_direct_closed_total{reason="timed_out"}`.
    pub tcp_user_timeout: Duration,
    /// How long a QUIC connection (to a router or a member) may hear
    /// nothing from its peer before it is closed
    /// (`--direct-quic-idle-timeout-secs`, default 10 s, libp2p's; zero:
    /// that default; under 1 s acts as 1 s). quinn sends a keep-alive every
    /// half of it, so only a path that stopped carrying bytes reaches it:
    /// the QUIC counterpart of [`Self::tcp_user_timeout`], counted in
    /// `agentmesh_node_direct_closed_total{reason="timed_out"}` for direct
    /// connections.
    pub quic_idle_timeout: Duration,
    /// How long a direct connection to a member may stay open before the
    /// peer's credential arrives on it and verifies
    /// (`--direct-auth-timeout-ms`, default 5 s; less than 1 ms acts as
    /// 1 ms). Past it the connection is closed and counted in
    /// `agentmesh_node_direct_closed_total{reason="unauthenticated"}`.
    /// Its own flag rather than `--call-first-byte-timeout-ms`: the hello
    /// crosses a path punched a moment ago and its check may re-fetch the
    /// control plane's keys, and closing an honest connection costs a
    /// punch, so it is longer than a call's first byte.
    pub auth_timeout: Duration,
    /// Let punches dial loopback addresses (`--direct-allow-loopback-targets`,
    /// default off): for tests and benches with every member on one host,
    /// where peers see each other only on loopback. Off, a punch never
    /// dials loopback (a lying peer must not make us dial our own host);
    /// refused without [`DirectConfig::enabled`].
    pub allow_loopback_targets: bool,
    /// Direct connections to members open at once
    /// (`--direct-max-connections`, default 1024; 0 acts as 1). Past it
    /// relayed connections are not punched (`result="skipped_full"`),
    /// reversals are declined and inbound direct connections refused
    /// (`inbound_refused_total{reason="direct_full"}`): calls stay relayed.
    /// Each direct TCP connection holds a file descriptor and its yamux
    /// windows, and a popular provider would otherwise hold one per caller.
    pub max_connections: usize,
    /// Which transport direct connections use (`--direct-transport`,
    /// default TCP): see [`DirectTransport`].
    pub transport: DirectTransport,
}

/// The transport of a member's direct connections, and so of the
/// connections to its routers that show its NAT mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DirectTransport {
    /// One listening TCP port; routers are dialled over TCP from it and
    /// punches are TCP simultaneous opens.
    #[default]
    Tcp,
    /// One listening UDP socket (QUIC); routers are dialled over QUIC from
    /// it where they offer QUIC (their UDP mapping is what they observe),
    /// and punches are QUIC: one side sends random datagrams to open its
    /// NAT while the other's QUIC handshake comes in, so each punch makes
    /// exactly one connection. TCP then only dials, from any port.
    Quic,
}

impl DirectTransport {
    /// Its name in flags, `status` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Quic => "quic",
        }
    }
}

/// Default [`DirectConfig::punch_backoff_min`], seconds.
pub const DEFAULT_PUNCH_BACKOFF_MIN_SECS: u64 = 30;
/// Default [`DirectConfig::punch_backoff_max`], seconds.
pub const DEFAULT_PUNCH_BACKOFF_MAX_SECS: u64 = 900;
/// Default [`DirectConfig::max_pending_inbound`], connections.
pub const DEFAULT_DIRECT_MAX_PENDING_INBOUND: usize = 64;
/// Default [`DirectConfig::max_pending_inbound_per_source`], connections.
pub const DEFAULT_DIRECT_MAX_PENDING_INBOUND_PER_SOURCE: usize = 8;
/// Default [`DirectConfig::tcp_user_timeout`], seconds.
pub const DEFAULT_DIRECT_TCP_USER_TIMEOUT_SECS: u64 = 10;
/// Default [`DirectConfig::quic_idle_timeout`], seconds.
pub const DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS: u64 = 10;
/// Default [`DirectConfig::max_connections`], connections.
pub const DEFAULT_DIRECT_MAX_CONNECTIONS: usize = 1024;
/// Default [`DirectConfig::auth_timeout`], milliseconds.
pub const DEFAULT_DIRECT_AUTH_TIMEOUT_MS: u64 = 5000;

impl Default for DirectConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen_port: 0,
            listen_ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            punch_backoff_min: Duration::from_secs(DEFAULT_PUNCH_BACKOFF_MIN_SECS),
            punch_backoff_max: Duration::from_secs(DEFAULT_PUNCH_BACKOFF_MAX_SECS),
            max_pending_inbound: DEFAULT_DIRECT_MAX_PENDING_INBOUND,
            max_pending_inbound_per_source: DEFAULT_DIRECT_MAX_PENDING_INBOUND_PER_SOURCE,
            tcp_user_timeout: Duration::from_secs(DEFAULT_DIRECT_TCP_USER_TIMEOUT_SECS),
            quic_idle_timeout: Duration::from_secs(DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS),
            auth_timeout: Duration::from_millis(DEFAULT_DIRECT_AUTH_TIMEOUT_MS),
            allow_loopback_targets: false,
            transport: DirectTransport::Tcp,
            max_connections: DEFAULT_DIRECT_MAX_CONNECTIONS,
        }
    }
}
