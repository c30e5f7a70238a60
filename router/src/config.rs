//! The router's configuration: data only, one field per command-line flag.
//!
//! Every default is defined once, here, as a named constant; `crate::cli`
//! maps flags 1:1 onto these fields and a test checks that no flags yields
//! [`Config::default`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use libp2p::Multiaddr;

use crate::resources::budget::{Budgets, Watermarks};
use crate::resources::sizing::SizingFlags;
pub use crate::resources::sizing::{Sizing, high_watermark_for_budget};

/// Default control-plane URL (the `agentmesh-one` gRPC port on loopback),
/// shared with the other programs' `--control-plane`.
pub const DEFAULT_CONTROL_PLANE: &str = agentmesh_runtime::cli::DEFAULT_CONTROL_PLANE;
/// Default key file.
pub const DEFAULT_KEY_PATH: &str = "router.key";
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "/ip4/0.0.0.0/tcp/4001";
/// Connections not admitted within this many seconds are closed.
pub const DEFAULT_AUTH_DEADLINE_SECS: u64 = 10;
/// Share of the memory budget that the default high watermark fills with
/// idle members, percent; the rest is headroom for what members do besides
/// idling (circuits and calls at 256 KiB per data stream, transit and
/// unauthenticated connections, control streams).
pub const DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT: u8 = 50;
/// Default time a drain may take before the router closes, seconds (below
/// the manifests' terminationGracePeriodSeconds).
pub const DEFAULT_DRAIN_GRACE_SECS: u64 = 30;
/// Default go-away streams open at once. A go-away is one small frame and an
/// ack; at 64 at once a router on a loaded 2-core machine sent ≈ 230 a
/// second and could not drain 6,930 members within the 30 s grace (10,000-
/// member ladder, ladder/RESULTS.md); 512 keeps a drain of the default
/// watermark inside the grace while staying a bound.
pub const DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS: usize = 512;
/// Default bound on policy push streams open at once. A round is about
/// (members ÷ this) push round trips long, and a push's round trip is the
/// member's time to answer: measured at 10,003 members (≈ 2,500 pushed
/// per router) it was 90–200 ms on a loaded host, so 64 took a round to
/// 3.7–6.9 s at p99 against the 5 s target (`ladder/RESULTS.md`,
/// session 14); 256 keeps it near a second with a quarter of that round
/// trip to spare, at a few MB of small frames in flight.
pub const DEFAULT_POLICY_PUSH_CONCURRENCY: usize = 256;
/// Default deadline of one policy push (open, write, ack), milliseconds.
pub const DEFAULT_POLICY_PUSH_DEADLINE_MS: u64 = 5_000;
/// Default deadline of one command to the swarm loop's tables (queue and
/// answer), milliseconds: the loop answers in microseconds unless it is
/// stalled, and an auth stream's own timeout is longer.
pub const DEFAULT_STATE_COMMAND_DEADLINE_MS: u64 = 5_000;
/// Default wait before a router probes the members that named it a
/// fallback, milliseconds: past the time their primaries need to push
/// 10,000 members, so the probes never compete with those pushes, and
/// short enough that a member whose primary died or withheld is current
/// within seconds more.
pub const DEFAULT_POLICY_PUSH_FALLBACK_DELAY_MS: u64 = 5_000;
/// Default cap on the backoff between control-plane Watch attempts,
/// milliseconds (the directory poll covers the gap).
pub const DEFAULT_POLICY_WATCH_BACKOFF_MAX_MS: u64 = 30_000;
/// Default `retry_after` a go-away asks for, seconds.
pub const DEFAULT_GOAWAY_RETRY_AFTER_SECS: u64 = 300;
/// Default go-aways per second per surviving router in a drain or trim:
/// about half of what one router core admits on a quiet machine (≈ 450
/// attaches a second, docs/scalability.md), so survivors keep CPU for the
/// members they already hold; a drain of 5,000 members towards 2 survivors
/// then takes 12.5 s of the 30 s grace.
pub const DEFAULT_DRAIN_RATE_MEMBERS_PER_SEC: u32 = 200;
/// Default grace between go-away OVERLOADED and closing a trimmed member, seconds.
pub const DEFAULT_TRIM_CLOSE_GRACE_SECS: u64 = 10;
/// Default relay reservations one peer may hold at once. A member reserves
/// once per router (renewals replace it); the rest is room for a member that
/// reconnects while its old reservation is still being torn down.
pub const DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER: usize = 4;
/// Default relay circuits per peer.
pub const DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER: usize = 1024;
/// Default relay circuits in total.
pub const DEFAULT_RELAY_MAX_CIRCUITS: usize = 16 * 1024;
/// Default circuit lifetime: one hour.
pub const DEFAULT_RELAY_CIRCUIT_DURATION_SECS: u64 = 3600;
/// Default bytes per circuit: 0 means unlimited.
pub const DEFAULT_RELAY_CIRCUIT_BYTES: u64 = 0;
/// Default reservation lifetime (members renew before it ends).
pub const DEFAULT_RELAY_RESERVATION_DURATION_SECS: u64 = 3600;
/// Default seconds between leases (and directory/key syncs).
pub const DEFAULT_LEASE_INTERVAL_SECS: u64 = 15;
/// Default allowed clock difference when checking credentials.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// Default deadline for each read/write on one of our streams.
pub const DEFAULT_STREAM_TIMEOUT_SECS: u64 = 10;
/// Default time an auth stream has to send its first byte, milliseconds:
/// a member writes its whole request at once, so only a stream that means
/// to hold a slot stays silent this long; one that has started and is
/// merely slow is given the full stream timeout.
pub const DEFAULT_AUTH_FIRST_BYTE_TIMEOUT_MS: u64 = 2_000;
/// Default refused streams a stranger's connection may have before it is
/// closed: far more than a member opens before its auth answer (one auth
/// stream, a retry or two), far fewer than a loop that reopens them.
pub const DEFAULT_STRANGER_REFUSED_STREAMS_MAX: u32 = 32;
/// Default bound on concurrently served auth streams.
pub const DEFAULT_AUTH_MAX_INFLIGHT_STREAMS: usize = 256;
/// Default auth streams that may wait for an auth slot: four times the
/// slots, enough for a re-attach wave of a few thousand members to wait
/// rather than be dropped.
pub const DEFAULT_AUTH_QUEUE_MAX_STREAMS: usize = 1024;
/// Default longest wait of an auth stream for a slot, milliseconds: well
/// below the members' own auth deadline (their call timeout, 10 s), so the
/// busy answer reaches them before they give up and retry on their own.
pub const DEFAULT_AUTH_QUEUE_WAIT_MS: u64 = 4_000;
/// Default retry-after of a busy answer, milliseconds (members add jitter).
pub const DEFAULT_AUTH_BUSY_RETRY_AFTER_MS: u64 = 2_000;
/// Default bound on concurrently served catalog streams.
pub const DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS: usize = 256;
/// Default cap on records the router holds for its members.
pub const DEFAULT_CATALOG_MAX_RECORDS: usize = 10_000;
/// Default cap on providers in one lookup answer.
pub const DEFAULT_CATALOG_MAX_RESULTS: usize = 64;
/// Default time a member's lookup may spend asking other routers. Well
/// below a member's own deadline for the whole lookup (its call timeout,
/// 10 s), so the answer — local records plus whatever other routers sent in
/// time — reaches the member before it gives up and it can still ask its
/// next router.
pub const DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS: u64 = 3_000;
/// Default time a provider search's non-empty answer is reused: short
/// beside the DHT's own staleness (records re-announced every 120 s, kept
/// 360 s), long enough that a storm of lookups runs one search per service.
pub const DEFAULT_CATALOG_PROVIDER_CACHE_MS: u64 = 5_000;
/// Default idle connection timeout.
pub const DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS: u64 = 120;
/// Default interval of the router's own pings on each connection. Members
/// ping their routers every 15 s to find a dead router; the router's pings
/// only find dead members (a link down, a NAT that lost its mapping), which
/// cost a slot and a catalog entry until found, so they can be rarer: half
/// the ping traffic of an idle mesh, a dead member found within 50 s.
pub const DEFAULT_PING_INTERVAL_SECS: u64 = 30;
/// Default time one ping may wait for its answer before the connection is
/// closed as dead (libp2p-ping's own default).
pub const DEFAULT_PING_TIMEOUT_SECS: u64 = 20;
/// Default total time budget of one control-plane call including retries.
pub const DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS: u64 = 30;
/// Default timeout of one control-plane RPC attempt.
pub const DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS: u64 = 10;
/// Default inbound streams per protocol waiting for an accept loop: the
/// streams crate's own default (re-exported so the flag's default is
/// defined once).
pub const DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL: usize =
    agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL;

/// Everything a router needs to start. Data only; see `spawn`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Control-plane gRPC URL. Default `http://127.0.0.1:7400`.
    pub control_plane: String,
    /// PEM file of the CA that signs the control plane's TLS certificate. Default none.
    pub control_plane_ca: Option<PathBuf>,
    /// The router-role enrollment token (the command line reads `--token-file` into it). Default empty.
    pub token: String,
    /// Ed25519 identity key file, created (mode 0600) on first run. Default `router.key`.
    pub key_path: PathBuf,
    /// Multiaddrs to listen on (TCP). Default `/ip4/0.0.0.0/tcp/4001`.
    pub listen: Vec<Multiaddr>,
    /// Addresses members dial; required when listening on 0.0.0.0 or port 0 off
    /// loopback, otherwise derived from the bound address. Default none.
    pub external_addr: Vec<Multiaddr>,
    /// Labels announced in the directory (`k=v`; only labels the token allows). Default none.
    pub labels: BTreeMap<String, String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. Default none (off).
    pub metrics_addr: Option<SocketAddr>,
    /// Connections not admitted within this time are closed. Default 10 s.
    pub auth_deadline: Duration,
    /// Admitted members the router aims to hold: above it the router trims
    /// and answers new members with go-away. `None` = sized from the memory
    /// budget (see [`Config::sizing`]). Default none.
    pub high_watermark: Option<u32>,
    /// Share of the memory budget the default high watermark fills with idle
    /// members, percent (the rest is headroom for circuits, calls and
    /// transit). Ignored when `high_watermark` is set. Default 50.
    pub high_watermark_memory_percent: u8,
    /// Trimming sheds down to this many members; `None` = 15% below the high
    /// watermark. Default none.
    pub low_watermark: Option<u32>,
    /// A drain (last lease, go-away DRAINING, members moving) takes at most
    /// this long before the router closes; keep it below the pod's
    /// termination grace. Default 30 s.
    pub drain_grace: Duration,
    /// Accept `POST /drain` on the metrics listener from any address, not
    /// only from loopback (where `kubectl port-forward` and a shell in the
    /// pod arrive). Off by default: whatever may scrape metrics could
    /// otherwise drain the router; turn it on only where the listener is
    /// protected some other way. Default false.
    pub drain_http_allow_remote: bool,
    /// Go-away streams open at once (fan-out bound). Default 512.
    pub goaway_max_concurrent_streams: usize,
    /// How long a go-away asks members to stay away. Default 300 s.
    pub goaway_retry_after: Duration,
    /// Policy push streams open at once (fan-out bound). Default 64.
    pub policy_push_concurrency: usize,
    /// Deadline of one policy push to one member (open, write, ack).
    /// Default 5 s.
    pub policy_push_deadline: Duration,
    /// Deadline of one command to the swarm loop (the tables' admit, keys,
    /// revocations, regroup, router set; trim's and drain's disconnects;
    /// queue and answer). Default 5 s.
    pub state_command_deadline: Duration,
    /// How long after taking a new state the router probes the members
    /// that named it a fallback (`AuthRequest.policy_push_slot`), and
    /// pushes the policy to those that still lack it. Default 5 s.
    pub policy_push_fallback_delay: Duration,
    /// Cap on the jittered backoff between control-plane Watch attempts
    /// (meanwhile the directory poll brings the policy). Default 30 s.
    pub policy_watch_backoff_max: Duration,
    /// Whether to hold the control plane's Watch at all (else the
    /// directory poll alone brings policy, revocations and keys).
    pub policy_watch: bool,
    /// Go-aways a drain or trim sends per second per surviving router
    /// (paced in waves, see `goaway::pace`); 0 sends them all at once.
    /// Default 200.
    pub drain_rate_members_per_sec: u32,
    /// A trimmed member's connection is closed this long after its go-away. Default 10 s.
    pub trim_close_grace: Duration,
    /// Relay reservations at most; `None` = the effective high watermark. Default none.
    pub relay_max_reservations: Option<usize>,
    /// Relay reservations one peer may hold at once (at least 1). Default 4.
    pub relay_max_reservations_per_peer: usize,
    /// Relay circuits at most in total. Default 16384.
    pub relay_max_circuits: usize,
    /// Relay circuits at most per peer. Default 1024.
    pub relay_max_circuits_per_peer: usize,
    /// Longest life of one circuit. Default 3600 s.
    pub relay_circuit_duration: Duration,
    /// Bytes one circuit may carry; 0 = unlimited. Default 0.
    pub relay_circuit_bytes: u64,
    /// Life of one relay reservation. Default 3600 s.
    pub relay_reservation_duration: Duration,
    /// Time between leases, directory syncs and key syncs. Default 15 s.
    pub lease_interval: Duration,
    /// Allowed clock difference when checking credential validity. Default 60 s.
    pub clock_skew: Duration,
    /// Deadline of each read or write on an auth or catalog stream. Default 10 s.
    pub stream_timeout: Duration,
    /// An auth stream that sends no byte within this time is closed and
    /// counted as a failed login of its source (`silent`). Default 2 s.
    pub auth_first_byte_timeout: Duration,
    /// Streams of our own protocols refused on one connection of a peer not
    /// admitted; the next refusal closes the connection and counts as a
    /// failed login of its source. Members, and connections this router
    /// dialed (a peer it chose), are never closed for this. 0: no limit.
    /// Default 32.
    pub stranger_refused_streams_max: u32,
    /// Auth streams served at once, shared fairly by source once all are
    /// taken (a source holding fewer takes the heaviest source's oldest);
    /// refusals are counted. Default 256.
    pub auth_max_inflight_streams: usize,
    /// Auth streams refused a slot that may wait for one, shared fairly by
    /// source like the slots; 0 = none wait (refused streams are dropped).
    /// Default 1024.
    pub auth_queue_max_streams: usize,
    /// Longest wait of an auth stream for a slot; then it is answered busy
    /// with `auth_busy_retry_after`. Keep it below the members' auth
    /// deadline (their call timeout). Default 4 s.
    pub auth_queue_wait: Duration,
    /// The retry-after of a busy answer. Default 2 s.
    pub auth_busy_retry_after: Duration,
    /// Catalog streams served at once, shared like the auth streams;
    /// peers not admitted get none. Default 256.
    pub catalog_max_inflight_streams: usize,
    /// Member records held at most. Default 10000.
    pub catalog_max_records: usize,
    /// Providers in one lookup answer at most. Default 64.
    pub catalog_max_results: usize,
    /// Time one lookup may spend finding and asking other routers; what
    /// arrived by then is answered (counted as result "partial"); zero
    /// answers from this router's own records only. Default 3 s.
    pub catalog_remote_lookup_budget: Duration,
    /// How long a search's non-empty list of provider routers is reused by
    /// later lookups of the same service (zero: never; lookups running at
    /// the same time always share one search). Default 5 s.
    pub catalog_provider_cache: Duration,
    /// Connections with nothing keeping them alive close after this. Default 120 s.
    pub idle_connection_timeout: Duration,
    /// Interval of the router's pings on each connection. Default 30 s.
    pub ping_interval: Duration,
    /// A ping unanswered for this long closes its connection as dead
    /// (`agentmesh_router_connections_closed_total{reason="ping_failed"}`).
    /// Default 20 s.
    pub ping_timeout: Duration,
    /// Time budget of one control-plane call, retries included. Default 30 s.
    pub control_plane_retry_budget: Duration,
    /// Timeout of one control-plane RPC attempt. Default 10 s.
    pub control_plane_rpc_timeout: Duration,
    /// Negotiated inbound streams of one protocol (auth, catalog, ping…)
    /// that may wait for its accept loop; more are dropped and counted in
    /// `agentmesh_streams_inbound_dropped_total{reason="queue_full"}`.
    /// At least 1. Default 16.
    pub stream_inbound_queue_per_protocol: usize,
    /// Stream opens (go-aways, catalog lookups to other routers…) that may
    /// wait for a dial to one peer; more are refused at once and counted in
    /// `agentmesh_streams_pending_opens_refused_total{limit="per_peer"}`.
    /// At least 1. Default 64.
    pub stream_max_pending_opens_per_peer: usize,
    /// Stream opens that may wait for dials to all peers together; more are
    /// refused, `limit="total"`. At least 1. Default 4096.
    pub stream_max_pending_opens_total: usize,
    /// Resource budgets and limits (see `resource_config`).
    pub resources: crate::resources::config::ResourceConfig,
    /// Run the runtime stall watchdog (`agentmesh_runtime_stalls_total` on
    /// /metrics) and show the allocator's bytes
    /// (`agentmesh_runtime_allocator_*`, jemalloc). One per process: the
    /// binary turns it on; programs that embed several routers run their
    /// own. Default off.
    pub runtime_watchdog: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: DEFAULT_CONTROL_PLANE.to_string(),
            control_plane_ca: None,
            token: String::new(),
            key_path: PathBuf::from(DEFAULT_KEY_PATH),
            listen: vec![
                DEFAULT_LISTEN
                    .parse()
                    .expect("DEFAULT_LISTEN is a valid multiaddr"),
            ],
            external_addr: Vec::new(),
            labels: BTreeMap::new(),
            metrics_addr: None,
            auth_deadline: Duration::from_secs(DEFAULT_AUTH_DEADLINE_SECS),
            high_watermark: None,
            high_watermark_memory_percent: DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT,
            low_watermark: None,
            drain_grace: Duration::from_secs(DEFAULT_DRAIN_GRACE_SECS),
            drain_http_allow_remote: false,
            goaway_max_concurrent_streams: DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS,
            goaway_retry_after: Duration::from_secs(DEFAULT_GOAWAY_RETRY_AFTER_SECS),
            policy_push_concurrency: DEFAULT_POLICY_PUSH_CONCURRENCY,
            policy_push_deadline: Duration::from_millis(DEFAULT_POLICY_PUSH_DEADLINE_MS),
            state_command_deadline: Duration::from_millis(DEFAULT_STATE_COMMAND_DEADLINE_MS),
            policy_push_fallback_delay: Duration::from_millis(
                DEFAULT_POLICY_PUSH_FALLBACK_DELAY_MS,
            ),
            policy_watch_backoff_max: Duration::from_millis(DEFAULT_POLICY_WATCH_BACKOFF_MAX_MS),
            policy_watch: true,
            drain_rate_members_per_sec: DEFAULT_DRAIN_RATE_MEMBERS_PER_SEC,
            trim_close_grace: Duration::from_secs(DEFAULT_TRIM_CLOSE_GRACE_SECS),
            relay_max_reservations: None,
            relay_max_reservations_per_peer: DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER,
            relay_max_circuits: DEFAULT_RELAY_MAX_CIRCUITS,
            relay_max_circuits_per_peer: DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER,
            relay_circuit_duration: Duration::from_secs(DEFAULT_RELAY_CIRCUIT_DURATION_SECS),
            relay_circuit_bytes: DEFAULT_RELAY_CIRCUIT_BYTES,
            relay_reservation_duration: Duration::from_secs(
                DEFAULT_RELAY_RESERVATION_DURATION_SECS,
            ),
            lease_interval: Duration::from_secs(DEFAULT_LEASE_INTERVAL_SECS),
            clock_skew: Duration::from_secs(DEFAULT_CLOCK_SKEW_SECS),
            stream_timeout: Duration::from_secs(DEFAULT_STREAM_TIMEOUT_SECS),
            auth_first_byte_timeout: Duration::from_millis(DEFAULT_AUTH_FIRST_BYTE_TIMEOUT_MS),
            stranger_refused_streams_max: DEFAULT_STRANGER_REFUSED_STREAMS_MAX,
            auth_max_inflight_streams: DEFAULT_AUTH_MAX_INFLIGHT_STREAMS,
            auth_queue_max_streams: DEFAULT_AUTH_QUEUE_MAX_STREAMS,
            auth_queue_wait: Duration::from_millis(DEFAULT_AUTH_QUEUE_WAIT_MS),
            auth_busy_retry_after: Duration::from_millis(DEFAULT_AUTH_BUSY_RETRY_AFTER_MS),
            catalog_max_inflight_streams: DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS,
            catalog_max_records: DEFAULT_CATALOG_MAX_RECORDS,
            catalog_max_results: DEFAULT_CATALOG_MAX_RESULTS,
            catalog_remote_lookup_budget: Duration::from_millis(
                DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS,
            ),
            catalog_provider_cache: Duration::from_millis(DEFAULT_CATALOG_PROVIDER_CACHE_MS),
            idle_connection_timeout: Duration::from_secs(DEFAULT_IDLE_CONNECTION_TIMEOUT_SECS),
            ping_interval: Duration::from_secs(DEFAULT_PING_INTERVAL_SECS),
            ping_timeout: Duration::from_secs(DEFAULT_PING_TIMEOUT_SECS),
            control_plane_retry_budget: Duration::from_secs(
                DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS,
            ),
            control_plane_rpc_timeout: Duration::from_secs(DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS),
            stream_inbound_queue_per_protocol: DEFAULT_STREAM_INBOUND_QUEUE_PER_PROTOCOL,
            stream_max_pending_opens_per_peer:
                agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER,
            stream_max_pending_opens_total: agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL,
            resources: Default::default(),
            runtime_watchdog: false,
        }
    }
}

impl Config {
    /// The watermarks and reservation cap for a memory budget of
    /// `memory_budget_bytes`: `high_watermark` if set, else
    /// `high_watermark_memory_percent` of the budget ÷ the idle member
    /// charge; low = `low_watermark` (capped at high) else 15% below high;
    /// reservations = `relay_max_reservations` else the high watermark.
    pub fn sizing(&self, memory_budget_bytes: u64) -> Sizing {
        Sizing::new(
            SizingFlags {
                high_watermark: self.high_watermark,
                low_watermark: self.low_watermark,
                relay_max_reservations: self.relay_max_reservations,
                high_watermark_memory_percent: self.high_watermark_memory_percent,
            },
            &self.resources,
            memory_budget_bytes,
        )
    }

    /// What the default resource budgets derive from: the watermarks in
    /// effect and the relay caps.
    pub(crate) fn watermarks(&self, sizing: &Sizing) -> Watermarks {
        Watermarks {
            high_watermark: sizing.high_watermark,
            relay_max_circuits: u32::try_from(self.relay_max_circuits).unwrap_or(u32::MAX),
            relay_max_reservations: u32::try_from(sizing.relay_max_reservations)
                .unwrap_or(u32::MAX),
        }
    }

    /// Bytes per circuit for the relay (0 = unlimited becomes `u64::MAX`).
    pub fn effective_circuit_bytes(&self) -> u64 {
        if self.relay_circuit_bytes == 0 {
            u64::MAX
        } else {
            self.relay_circuit_bytes
        }
    }
}

/// Warns when an explicit `--high-watermark` is more than the memory budget
/// holds even with every member idle (connection and ping streams only):
/// then the memory budget, not the watermark, decides when members are
/// refused (see docs/scalability.md). A sized watermark always fits.
pub(crate) fn check_watermarks(sizing: &Sizing, budgets: &Budgets) -> bool {
    let over = u64::from(sizing.high_watermark) > sizing.members_that_fit;
    if over {
        tracing::warn!(
            high_watermark = sizing.high_watermark,
            low_watermark = sizing.low_watermark,
            memory_budget_bytes = budgets.memory_bytes,
            idle_member_charge_bytes = sizing.idle_member_charge_bytes,
            members_that_fit = sizing.members_that_fit,
            "the memory budget holds fewer members than --high-watermark; lower it or raise the memory limit"
        );
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory budget the router derives from a container limit of `gib` GiB.
    fn budget_of(gib: u64) -> u64 {
        crate::resources::memory::budget(
            gib << 30,
            crate::resources::config::DEFAULT_MEMORY_BUDGET_PERCENT,
        )
    }

    #[test]
    fn the_default_high_watermark_is_sized_from_the_memory_budget() {
        let c = Config::default();
        let s = c.sizing(budget_of(2));
        // 2 GiB × 75% × 50% ÷ (64 KiB + 2 × 4 KiB) = 10,922 members: above
        // the 6,667 a router needs for 10,000 members × K=2 on 4 routers
        // with one lost.
        assert_eq!(s.idle_member_charge_bytes, 72 * 1024);
        assert_eq!(s.high_watermark, 10_922);
        assert!(s.high_watermark > 6_667);
        assert_eq!(s.low_watermark, 10_922 * 85 / 100);
        assert_eq!(s.relay_max_reservations, 10_922);
        assert!(s.sized_from_memory);
        assert_eq!(s.members_that_fit, 2 * 10_922 + 1);
        // The fallback limit (1 GiB) holds half as many.
        assert_eq!(c.sizing(budget_of(1)).high_watermark, 5_461);
        // A tiny budget still admits one member.
        assert_eq!(c.sizing(1).high_watermark, 1);
    }

    #[test]
    fn flags_win_over_the_sized_watermark() {
        let c = Config {
            high_watermark: Some(200),
            low_watermark: Some(300),
            relay_max_reservations: Some(50),
            ..Default::default()
        };
        let s = c.sizing(budget_of(2));
        assert_eq!(
            (s.high_watermark, s.low_watermark, s.relay_max_reservations),
            (200, 200, 50),
            "low is capped at high"
        );
        assert!(!s.sized_from_memory);
        let mut c = Config {
            high_watermark_memory_percent: 25,
            ..Default::default()
        };
        assert_eq!(c.sizing(budget_of(2)).high_watermark, 5_461);
        c.resources.connection_charge_bytes = 1 << 20;
        assert_eq!(
            c.sizing(budget_of(2)).idle_member_charge_bytes,
            (1 << 20) + 8 * 1024
        );
    }

    #[test]
    fn sizing_never_overflows() {
        assert_eq!(high_watermark_for_budget(u64::MAX, 100, 1), u32::MAX);
        assert_eq!(high_watermark_for_budget(0, 50, 0), 1);
        assert_eq!(
            high_watermark_for_budget(1000, 200, 10),
            100,
            "percent capped at 100"
        );
    }

    #[test]
    fn only_a_watermark_above_what_the_budget_holds_warns() {
        let budget = 768 << 20;
        let budgets = |c: &Config| {
            crate::resources::budgets(&c.resources, c.watermarks(&c.sizing(budget)), budget)
        };
        let sized = Config::default();
        let b = budgets(&sized);
        assert!(!check_watermarks(&sized.sizing(budget), &b), "sized fits");
        let explicit = Config {
            high_watermark: Some(20_000),
            ..Default::default()
        };
        let s = explicit.sizing(budget);
        assert_eq!(s.members_that_fit, 10_922);
        assert!(
            check_watermarks(&s, &b),
            "20,000 idle members need more than 768 MiB"
        );
        let fits = Config {
            high_watermark: Some(10_000),
            ..Default::default()
        };
        assert!(!check_watermarks(&fits.sizing(budget), &b));
    }
}
