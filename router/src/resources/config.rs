//! The resource manager's part of the router configuration: data only, one
//! field per flag (see `main.rs`), defaults named once here. Budgets left
//! `None` or unset default from the watermarks (`budget.rs`), never from the
//! host's RAM.

use std::collections::BTreeMap;

/// Fallback memory limit when neither `--memory-limit-bytes` nor a cgroup limit is set: 1 GiB.
pub const DEFAULT_MEMORY_DEFAULT_LIMIT_BYTES: u64 = 1 << 30;
/// Share of the memory limit the charged buffers may use, percent.
pub const DEFAULT_MEMORY_BUDGET_PERCENT: u8 = 75;
/// Charge of one connection, bytes: the measured base of an idle one.
/// `tests/all/connection_charge.rs` measures ≈ 49 KiB (50,503 bytes) of router
/// RSS per idle connection with identify exchanged and its two ping streams
/// open (real binary, jemalloc, 200 connections); the ladder measured
/// 50–64 KiB per attached member (admission, reservation and catalog state
/// included). 64 KiB plus the two ping streams' 4 KiB each (72 KiB per idle
/// member) covers both. What a busy connection buffers is charged to its
/// streams: data streams their full 256 KiB window, control streams one
/// maximal frame.
pub const DEFAULT_CONNECTION_CHARGE_BYTES: u64 = 64 * 1024;
/// Live inbound streams of one peer, all protocols.
pub const DEFAULT_PEER_STREAM_BUDGET_TOTAL: u32 = 512;
/// Share of the memory budget the streams one peer opens may hold, percent.
/// The per-peer stream budgets alone let one peer hold over 64 MiB (its 256
/// relay HOP streams at 256 KiB, besides control streams): over 8% of the
/// 1 GiB fallback's budget, a third of a 256 MiB container's, so a few busy
/// callers could take it all. At 5%, the headroom the default high watermark leaves
/// (half the budget) takes ten peers at their cap to fill, and a caller
/// still holds ≈ 150 circuits through one router at the 1 GiB fallback.
/// Never below `budget::PEER_MEMORY_FLOOR_BYTES`.
pub const DEFAULT_MEMORY_PER_PEER_MAX_PERCENT: u8 = 5;
/// Circuits (relay STOP streams) to one destination member: below a member's
/// yamux stream limit (512), so circuits alone cannot exhaust it.
pub const DEFAULT_CIRCUITS_PER_DESTINATION: u32 = 256;
/// Relay STOP handshakes in flight on one connection: below libp2p-relay's
/// own 10 per connection (it drops the 11th STOP stream silently), with
/// room for the two its count may run ahead of ours (a handshake whose
/// answer we have seen but whose future the relay has not finished yet).
pub const DEFAULT_RELAY_STOP_HANDSHAKES_PER_CONNECTION: u32 = 8;
/// libp2p-relay 0.22's STOP handshakes per connection (MAX_CONCURRENT_STREAMS_PER_CONNECTION).
pub const RELAY_STOP_HANDSHAKES_LIBRARY_MAX: u32 = 10;
/// Connections from one IP whose peers are not (yet) admitted, handshakes in
/// progress included (those are refused before the handshake).
pub const DEFAULT_UNAUTHENTICATED_CONNECTIONS_PER_IP: u32 = 64;
/// Failed logins from one IP within a minute that block it.
pub const DEFAULT_FAILED_LOGINS_PER_IP_PER_MINUTE: u32 = 30;
/// How long a source is blocked after its failed logins reached the limit,
/// seconds: short, so members sharing an address with a broken or hostile
/// client lose seconds, not minutes; the count starts over after it.
pub const DEFAULT_FAILED_LOGIN_BLOCK_SECS: u64 = 10;
/// Share of the memory budget that peers not admitted may hold together
/// (their connections and inbound streams), percent: members keep the rest
/// whatever strangers do. 20% of the 1 GiB fallback's budget holds over a
/// thousand strangers in their auth exchange (≈ 140 KiB each), more than
/// the default `--pending-connections-max` lets in at once; never below one
/// source's whole share of unauthenticated connections.
pub const DEFAULT_UNAUTHENTICATED_MEMORY_MAX_PERCENT: u8 = 20;
/// IPv6 sources are aggregated to this prefix for the per-source limits,
/// bits: one host normally holds a whole /64, so counting per address let
/// it spread over as many addresses as it liked (see `source.rs`).
pub const DEFAULT_IPV6_SOURCE_PREFIX_LEN: u8 = 64;
/// Inbound connections in their handshake (noise + yamux, or QUIC) at once,
/// all sources together: a handshake is cheap, but a flood from many IPs
/// must not queue without bound (each takes at most 20 s).
pub const DEFAULT_PENDING_CONNECTIONS_MAX: u32 = 1024;
/// Listen backlog of each TCP listening socket, connections: libp2p-tcp's
/// own default, well above what an accept loop that never blocks leaves
/// queued, and below the usual `net.core.somaxconn` (4096) cap.
pub const DEFAULT_LISTEN_BACKLOG_CONNECTIONS: u32 = 1024;
/// Inbound yamux streams one connection buffers while the swarm has not
/// taken them yet (libp2p-yamux's own bound); more are dropped (the remote
/// sees a reset) and counted in
/// `refused_total{resource="stream",scope="connection",protocol="none"}`.
/// The swarm takes streams as fast as it runs, so only a peer opening
/// streams faster than the router's loop turns fills it.
pub const DEFAULT_YAMUX_MAX_BUFFERED_INBOUND_STREAMS: u32 = 256;
/// QUIC: concurrent streams per connection (like the yamux backstop).
pub const DEFAULT_QUIC_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// QUIC: receive window per stream, bytes (the yamux window).
pub const DEFAULT_QUIC_MAX_STREAM_DATA_BYTES: u32 = 256 * 1024;
/// QUIC: receive window per connection, bytes.
pub const DEFAULT_QUIC_MAX_CONNECTION_DATA_BYTES: u32 = 16 * 1024 * 1024;

/// Resource budgets and limits. Data only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    /// Memory limit, bytes; `None` = the cgroup's `memory.max`, else
    /// `memory_default_limit_bytes`. Default none.
    pub memory_limit_bytes: Option<u64>,
    /// Memory limit when no flag and no cgroup limit is set, bytes. Default 1 GiB.
    pub memory_default_limit_bytes: u64,
    /// Share of the memory limit that charged buffers may use, percent. Default 75.
    pub memory_budget_percent: u8,
    /// Memory charged per connection, bytes. Default 64 KiB (measured, see
    /// `DEFAULT_CONNECTION_CHARGE_BYTES`).
    pub connection_charge_bytes: u64,
    /// Share of the memory budget the inbound streams of one peer may hold,
    /// percent (1–100; 100 = only the system budget), at least 1 MiB.
    /// Default 5.
    pub memory_per_peer_max_percent: u8,
    /// Live inbound streams across the router; `None` = the sum of the
    /// per-protocol budgets. Default none.
    pub stream_budget_system: Option<u32>,
    /// Live inbound streams per protocol across the router (`PROTOCOL=N`);
    /// unset protocols default from the high watermark. Default none.
    pub stream_budgets: BTreeMap<String, u32>,
    /// Live inbound streams of one peer, all protocols. Default 512.
    pub peer_stream_budget_total: u32,
    /// Live inbound streams of one peer per protocol (`PROTOCOL=N`); unset
    /// protocols use built-in defaults. Default none.
    pub peer_stream_budgets: BTreeMap<String, u32>,
    /// Circuits to one destination member at once. Default 256. Shared by
    /// the members that ask for them (by PeerId): one holding some gets
    /// another only while it holds fewer than remain free, so alone it gets
    /// at most half; refused as `resource="circuit",scope="source"`.
    pub circuits_per_destination: u32,
    /// Relay STOP handshakes in flight on one connection (1–10). Default 8.
    pub relay_stop_handshakes_per_connection: u32,
    /// Connections from one IP whose peers are not admitted; a newcomer
    /// at the cap is let in and the source's oldest closed. Default 64.
    pub unauthenticated_connections_per_ip: u32,
    /// Failed logins of one source (IP, IPv6 prefix) within a minute that
    /// block it: its new connections whose peers are not admitted are
    /// refused. Default 30.
    pub failed_logins_per_ip_per_minute: u32,
    /// How long such a block lasts, seconds (failures during it neither
    /// extend it nor count towards the next). Default 10.
    pub failed_login_block_secs: u64,
    /// Share of the memory budget the connections and inbound streams of
    /// peers not admitted may hold together, percent (1–100), at least
    /// `unauthenticated_connections_per_ip` connections' worth; past half
    /// of it each source holds at most its share. Default 20.
    pub unauthenticated_memory_max_percent: u8,
    /// IPv6 prefix length, bits (1–128), per-source limits aggregate IPv6
    /// sources to (unauthenticated connections, handshakes and failed
    /// logins per IP); 128 = per address. IPv4 (and IPv4-mapped IPv6)
    /// sources count per address. Default 64.
    pub ipv6_source_prefix_len: u8,
    /// Inbound connections in their handshake at once, all sources. Default 1024.
    pub pending_connections_max: u32,
    /// What the listening sockets and the muxers accept before our budgets
    /// see a stream.
    pub transport: TransportLimits,
}

/// The limits the transport itself enforces: the kernel's accept queue,
/// yamux's buffer of streams not yet taken, QUIC's windows. A section of
/// its own because [`super::transport::build`] is its only reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportLimits {
    /// Connections the kernel queues on a TCP listening socket before the
    /// router accepts them (the `listen()` backlog; the kernel caps it at
    /// `net.core.somaxconn`). Default 1024.
    pub listen_backlog_connections: u32,
    /// Inbound yamux streams one connection buffers before the swarm takes
    /// them; more are dropped and counted. At least 1. Default 256.
    pub yamux_max_buffered_inbound_streams: u32,
    /// QUIC concurrent streams per connection. Default 1024.
    pub quic_max_concurrent_streams: u32,
    /// QUIC receive window per stream, bytes. Default 256 KiB.
    pub quic_max_stream_data_bytes: u32,
    /// QUIC receive window per connection, bytes. Default 16 MiB.
    pub quic_max_connection_data_bytes: u32,
}

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            listen_backlog_connections: DEFAULT_LISTEN_BACKLOG_CONNECTIONS,
            yamux_max_buffered_inbound_streams: DEFAULT_YAMUX_MAX_BUFFERED_INBOUND_STREAMS,
            quic_max_concurrent_streams: DEFAULT_QUIC_MAX_CONCURRENT_STREAMS,
            quic_max_stream_data_bytes: DEFAULT_QUIC_MAX_STREAM_DATA_BYTES,
            quic_max_connection_data_bytes: DEFAULT_QUIC_MAX_CONNECTION_DATA_BYTES,
        }
    }
}

impl Default for ResourceConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: None,
            memory_default_limit_bytes: DEFAULT_MEMORY_DEFAULT_LIMIT_BYTES,
            memory_budget_percent: DEFAULT_MEMORY_BUDGET_PERCENT,
            connection_charge_bytes: DEFAULT_CONNECTION_CHARGE_BYTES,
            memory_per_peer_max_percent: DEFAULT_MEMORY_PER_PEER_MAX_PERCENT,
            stream_budget_system: None,
            stream_budgets: BTreeMap::new(),
            peer_stream_budget_total: DEFAULT_PEER_STREAM_BUDGET_TOTAL,
            peer_stream_budgets: BTreeMap::new(),
            circuits_per_destination: DEFAULT_CIRCUITS_PER_DESTINATION,
            relay_stop_handshakes_per_connection: DEFAULT_RELAY_STOP_HANDSHAKES_PER_CONNECTION,
            unauthenticated_connections_per_ip: DEFAULT_UNAUTHENTICATED_CONNECTIONS_PER_IP,
            failed_logins_per_ip_per_minute: DEFAULT_FAILED_LOGINS_PER_IP_PER_MINUTE,
            failed_login_block_secs: DEFAULT_FAILED_LOGIN_BLOCK_SECS,
            unauthenticated_memory_max_percent: DEFAULT_UNAUTHENTICATED_MEMORY_MAX_PERCENT,
            ipv6_source_prefix_len: DEFAULT_IPV6_SOURCE_PREFIX_LEN,
            pending_connections_max: DEFAULT_PENDING_CONNECTIONS_MAX,
            transport: TransportLimits::default(),
        }
    }
}

/// The command-line flags of [`ResourceConfig`], one per field (flattened
/// into the router's flags by `main.rs`).
#[derive(Debug, Clone, clap::Args)]
pub struct ResourceArgs {
    /// Memory limit in bytes (default: the cgroup's memory.max, else --memory-default-limit-bytes).
    #[arg(long)]
    pub memory_limit_bytes: Option<u64>,
    /// Memory limit in bytes when no flag and no cgroup limit is set.
    #[arg(long, default_value_t = DEFAULT_MEMORY_DEFAULT_LIMIT_BYTES)]
    pub memory_default_limit_bytes: u64,
    /// Share of the memory limit that connection and stream charges may use, percent.
    #[arg(long, default_value_t = DEFAULT_MEMORY_BUDGET_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub memory_budget_percent: u8,
    /// Memory charged per connection, bytes.
    #[arg(long, default_value_t = DEFAULT_CONNECTION_CHARGE_BYTES)]
    pub connection_charge_bytes: u64,
    /// Share of the memory budget the streams one peer opens may hold,
    /// percent (at least 1 MiB); beyond, its new streams are refused and
    /// counted as agentmesh_router_refused_total{resource="memory",scope="peer"}.
    #[arg(long, default_value_t = DEFAULT_MEMORY_PER_PEER_MAX_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub memory_per_peer_max_percent: u8,
    /// Live inbound streams across the router (default: sum of the per-protocol budgets).
    #[arg(long)]
    pub stream_budget_system: Option<u32>,
    /// Live inbound streams of one protocol across the router, PROTOCOL=N (repeatable).
    #[arg(long = "stream-budget", value_parser = parse_protocol_budget)]
    pub stream_budgets: Vec<(String, u32)>,
    /// Live inbound streams of one peer, all protocols.
    #[arg(long, default_value_t = DEFAULT_PEER_STREAM_BUDGET_TOTAL)]
    pub peer_stream_budget_total: u32,
    /// Live inbound streams of one peer for one protocol, PROTOCOL=N (repeatable).
    #[arg(long = "peer-stream-budget", value_parser = parse_protocol_budget)]
    pub peer_stream_budgets: Vec<(String, u32)>,
    /// Circuits to one destination member at once (a member holding some gets another only while it holds fewer than remain free), circuits.
    #[arg(long, default_value_t = DEFAULT_CIRCUITS_PER_DESTINATION)]
    pub circuits_per_destination: u32,
    /// Relay STOP handshakes (circuits being set up) in flight on one
    /// connection; more are refused at once, so the source is denied instead
    /// of waiting out libp2p-relay's silent drop past 10.
    #[arg(long, default_value_t = DEFAULT_RELAY_STOP_HANDSHAKES_PER_CONNECTION,
          value_parser = clap::value_parser!(u32).range(1..=RELAY_STOP_HANDSHAKES_LIBRARY_MAX as i64))]
    pub relay_stop_handshakes_per_connection: u32,
    /// Connections from one IP (IPv6: prefix) whose peers are not admitted, connections; a newcomer at the cap is let in and the source's oldest unauthenticated connection closed (agentmesh_router_connections_closed_total{reason="evicted_by_newcomer"}).
    #[arg(long, default_value_t = DEFAULT_UNAUTHENTICATED_CONNECTIONS_PER_IP)]
    pub unauthenticated_connections_per_ip: u32,
    /// Failed logins from one IP (IPv6: prefix) within a minute that block it, logins; a block refuses its new unauthenticated connections (counted in agentmesh_router_failed_login_blocks_total).
    #[arg(long, default_value_t = DEFAULT_FAILED_LOGINS_PER_IP_PER_MINUTE)]
    pub failed_logins_per_ip_per_minute: u32,
    /// How long a source is blocked after --failed-logins-per-ip-per-minute failed logins, seconds.
    #[arg(long, default_value_t = DEFAULT_FAILED_LOGIN_BLOCK_SECS)]
    pub failed_login_block_secs: u64,
    /// Share of the memory budget that peers not admitted may hold together, percent (1-100, at least --unauthenticated-connections-per-ip connections' worth); beyond, refused as agentmesh_router_refused_total{resource="memory",scope="unauthenticated"} (scope="source" past a source's share).
    #[arg(long, default_value_t = DEFAULT_UNAUTHENTICATED_MEMORY_MAX_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub unauthenticated_memory_max_percent: u8,
    /// IPv6 prefix length (bits, 1–128) the per-IP limits count IPv6 sources
    /// under: one host with a /64 is one source (128 = per address). IPv4
    /// and IPv4-mapped sources count per address.
    #[arg(long, default_value_t = DEFAULT_IPV6_SOURCE_PREFIX_LEN,
          value_parser = clap::value_parser!(u8).range(1..=128))]
    pub ipv6_source_prefix_len: u8,
    /// Inbound connections in their handshake at once, all sources together, connections; shared fairly by source once all are taken, a newcomer closing the handshake that progressed least (agentmesh_router_handshakes_shed_total{reason,progress}, _refused_total{reason}).
    #[arg(long, default_value_t = DEFAULT_PENDING_CONNECTIONS_MAX)]
    pub pending_connections_max: u32,
    /// Connections the kernel queues on each TCP listening socket before the
    /// router accepts them (the listen() backlog, capped by the kernel at
    /// net.core.somaxconn), connections; more are refused by the kernel and
    /// counted in agentmesh_runtime_tcp_listen_overflows_total.
    #[arg(long, default_value_t = DEFAULT_LISTEN_BACKLOG_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub listen_backlog_connections: u32,
    /// Inbound yamux streams one connection buffers before the router takes
    /// them; more are dropped (reset) and counted in agentmesh_router_refused_total
    /// {resource="stream",scope="connection",protocol="none"}.
    #[arg(long, default_value_t = DEFAULT_YAMUX_MAX_BUFFERED_INBOUND_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub yamux_max_buffered_inbound_streams: u32,
    /// QUIC concurrent streams per connection.
    #[arg(long, default_value_t = DEFAULT_QUIC_MAX_CONCURRENT_STREAMS)]
    pub quic_max_concurrent_streams: u32,
    /// QUIC receive window per stream, bytes.
    #[arg(long, default_value_t = DEFAULT_QUIC_MAX_STREAM_DATA_BYTES)]
    pub quic_max_stream_data_bytes: u32,
    /// QUIC receive window per connection, bytes.
    #[arg(long, default_value_t = DEFAULT_QUIC_MAX_CONNECTION_DATA_BYTES)]
    pub quic_max_connection_data_bytes: u32,
}

impl ResourceArgs {
    /// The configuration these flags give.
    pub fn into_config(self) -> ResourceConfig {
        ResourceConfig {
            memory_limit_bytes: self.memory_limit_bytes,
            memory_default_limit_bytes: self.memory_default_limit_bytes,
            memory_budget_percent: self.memory_budget_percent,
            connection_charge_bytes: self.connection_charge_bytes,
            memory_per_peer_max_percent: self.memory_per_peer_max_percent,
            stream_budget_system: self.stream_budget_system,
            stream_budgets: self.stream_budgets.into_iter().collect(),
            peer_stream_budget_total: self.peer_stream_budget_total,
            peer_stream_budgets: self.peer_stream_budgets.into_iter().collect(),
            circuits_per_destination: self.circuits_per_destination,
            relay_stop_handshakes_per_connection: self.relay_stop_handshakes_per_connection,
            unauthenticated_connections_per_ip: self.unauthenticated_connections_per_ip,
            failed_logins_per_ip_per_minute: self.failed_logins_per_ip_per_minute,
            failed_login_block_secs: self.failed_login_block_secs,
            unauthenticated_memory_max_percent: self.unauthenticated_memory_max_percent,
            ipv6_source_prefix_len: self.ipv6_source_prefix_len,
            pending_connections_max: self.pending_connections_max,
            transport: TransportLimits {
                listen_backlog_connections: self.listen_backlog_connections,
                yamux_max_buffered_inbound_streams: self.yamux_max_buffered_inbound_streams,
                quic_max_concurrent_streams: self.quic_max_concurrent_streams,
                quic_max_stream_data_bytes: self.quic_max_stream_data_bytes,
                quic_max_connection_data_bytes: self.quic_max_connection_data_bytes,
            },
        }
    }
}

/// Parses `PROTOCOL=N` for `--stream-budget` and `--peer-stream-budget`;
/// PROTOCOL is one of auth, catalog, call, goaway, relay_hop, relay_stop,
/// identify, kad, ping, other.
pub fn parse_protocol_budget(s: &str) -> Result<(String, u32), String> {
    let (p, n) = s
        .split_once('=')
        .ok_or_else(|| format!("expected PROTOCOL=N, got {s:?}"))?;
    if super::budget::Proto::from_label(p).is_none() {
        let known: Vec<_> = super::budget::Proto::ALL
            .iter()
            .map(|p| p.as_str())
            .collect();
        return Err(format!(
            "unknown protocol {p:?}; one of {}",
            known.join(", ")
        ));
    }
    let n = n
        .parse::<u32>()
        .map_err(|e| format!("budget of {p}: {e}"))?;
    Ok((p.to_string(), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        r: ResourceArgs,
    }

    #[test]
    fn no_flags_give_the_default_config_and_flags_map_one_to_one() {
        use clap::Parser;
        let cli = Cli::try_parse_from(["x"]).expect("parse");
        assert_eq!(cli.r.into_config(), ResourceConfig::default());
        let cli = Cli::try_parse_from([
            "x",
            "--stream-budget",
            "auth=5",
            "--peer-stream-budget",
            "catalog=2",
            "--memory-limit-bytes",
            "1000",
        ])
        .expect("parse");
        let c = cli.r.into_config();
        assert_eq!(c.stream_budgets.get("auth"), Some(&5));
        assert_eq!(c.peer_stream_budgets.get("catalog"), Some(&2));
        assert_eq!(c.memory_limit_bytes, Some(1000));
        assert!(Cli::try_parse_from(["x", "--stream-budget", "bogus=1"]).is_err());
        let c = Cli::try_parse_from(["x", "--yamux-max-buffered-inbound-streams", "8"])
            .expect("parse")
            .r
            .into_config();
        assert_eq!(c.transport.yamux_max_buffered_inbound_streams, 8);
        let c = Cli::try_parse_from(["x", "--listen-backlog-connections", "64"])
            .expect("parse")
            .r
            .into_config();
        assert_eq!(c.transport.listen_backlog_connections, 64);
        assert!(
            Cli::try_parse_from(["x", "--listen-backlog-connections", "0"]).is_err(),
            "a backlog of 0 is the kernel's minimum, not a choice anyone means"
        );
        assert!(
            Cli::try_parse_from(["x", "--yamux-max-buffered-inbound-streams", "0"]).is_err(),
            "a buffer of 0 would drop every inbound stream"
        );
        let c = Cli::try_parse_from(["x", "--ipv6-source-prefix-len", "128"])
            .expect("parse")
            .r
            .into_config();
        assert_eq!(c.ipv6_source_prefix_len, 128);
        let c = Cli::try_parse_from(["x", "--memory-per-peer-max-percent=20"])
            .expect("parse")
            .r
            .into_config();
        assert_eq!(c.memory_per_peer_max_percent, 20);
        for bad in ["0", "101"] {
            let flag = format!("--memory-per-peer-max-percent={bad}");
            let err = Cli::try_parse_from(["x", flag.as_str()]).expect_err("outside 1..=100");
            assert!(
                err.to_string().contains("memory-per-peer-max-percent"),
                "{err}"
            );
        }
        for bad in ["0", "129", "-1", "64x"] {
            let flag = format!("--ipv6-source-prefix-len={bad}");
            let err = Cli::try_parse_from(["x", flag.as_str()]).expect_err("outside 1..=128");
            assert!(err.to_string().contains("ipv6-source-prefix-len"), "{err}");
        }
        // Past libp2p-relay's own 10 the cap would never bite: refused.
        for bad in ["0", "11"] {
            assert!(
                Cli::try_parse_from(["x", "--relay-stop-handshakes-per-connection", bad]).is_err()
            );
        }
    }

    #[test]
    fn protocol_budgets_parse_with_clear_errors() {
        assert_eq!(parse_protocol_budget("auth=3"), Ok(("auth".into(), 3)));
        assert!(parse_protocol_budget("auth").is_err());
        assert!(
            parse_protocol_budget("nope=3")
                .expect_err("unknown protocol")
                .contains("unknown protocol")
        );
        assert!(parse_protocol_budget("kad=-1").is_err());
    }
}
