//! The ladder's configuration: one clap flag per field, defaults defined once.

use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Default members per step.
pub const DEFAULT_STEP: u64 = 100;
/// Default number of steps.
pub const DEFAULT_STEPS: u32 = 3;
/// Default joiners started per second (the control plane's default enrollment rate).
pub const DEFAULT_JOIN_RATE: f64 = 10.0;
/// Default routers each member attaches to (K).
pub const DEFAULT_MEMBER_ROUTERS: usize = 2;
/// Default provider members exposing echo.
pub const DEFAULT_PROVIDERS: u64 = 3;
/// Default hold after the last step, seconds.
pub const DEFAULT_HOLD_SECS: u64 = 30;
/// Default file descriptors charged per member when sizing workers.
pub const DEFAULT_FDS_PER_MEMBER: u64 = 8;
/// Default file descriptors kept free in each worker.
pub const DEFAULT_FD_HEADROOM: u64 = 1_000;
/// Default number of 127.0.0.x source addresses members dial from.
pub const DEFAULT_SOURCE_IPS: u8 = 16;
/// First source address members dial from (127.0.0.10 by default).
pub const FIRST_SOURCE_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 10);
/// Default deadline for a step (every joiner ready and called, or exited), seconds.
pub const DEFAULT_STEP_DEADLINE_SECS: u64 = 600;
/// Default timeout of one echo call, seconds.
pub const DEFAULT_CALL_TIMEOUT_SECS: u64 = 10;
/// Members' ping interval, seconds: the node's own default.
pub const DEFAULT_MEMBER_PING_INTERVAL_SECS: u64 =
    agentmesh_node::config::DEFAULT_PING_INTERVAL.as_secs();
/// Members' rejoin spread, milliseconds: the node's own default.
pub const DEFAULT_MEMBER_REJOIN_SPREAD_MS: u64 =
    agentmesh_node::config::DEFAULT_ROUTER_REJOIN_SPREAD_MS;
/// Default time budget of a member's first call (with retries), seconds.
pub const DEFAULT_CALL_BUDGET_SECS: u64 = 120;
/// Default echo calls per second per worker during an event window.
pub const DEFAULT_WINDOW_CALLS_PER_SEC: u32 = 5;
/// Default `--warm-call-after-secs`: issue 36's warm call.
pub const DEFAULT_WARM_CALL_AFTER_SECS: u64 = 2;
/// Default number of routers in local mode.
pub const DEFAULT_ROUTERS: usize = 4;
/// Default deadline for a child program's `/readyz`, seconds.
pub const DEFAULT_READY_DEADLINE_SECS: u64 = 60;
/// Default wait for every router to exit after `--restart-all-routers-at`
/// sent them SIGTERM, seconds: above the routers' own default drain grace
/// (30 s, `--drain-grace-secs`), so a drain ends on its own first.
pub const DEFAULT_RESTART_ALL_ROUTERS_EXIT_DEADLINE_SECS: u64 = 60;
/// Default interval between router RSS samples after teardown, seconds.
pub const DEFAULT_AFTER_INTERVAL_SECS: u64 = 5;
/// Most control-plane replicas a local run starts (each holds its own
/// pool of database connections).
pub const MAX_CONTROL_PLANES: i64 = 16;

/// What the fleet does: steps, hold, events, burst, after. Shared by both modes.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct FleetConfig {
    /// Members joining per step.
    #[arg(long, default_value_t = DEFAULT_STEP)]
    pub step: u64,
    /// Number of steps.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: u32,
    /// Joiners started per second, across all workers (0 = all at once).
    #[arg(long = "join-rate", default_value_t = DEFAULT_JOIN_RATE)]
    pub join_rate_per_sec: f64,
    /// Routers each member attaches to (the node's `--routers`, K).
    #[arg(long, default_value_t = DEFAULT_MEMBER_ROUTERS)]
    pub member_routers: usize,
    /// Provider members exposing the echo service (started before step 1).
    #[arg(long, default_value_t = DEFAULT_PROVIDERS)]
    pub providers: u64,
    /// Hold after the last step, seconds (readiness sampled every second).
    #[arg(long, default_value_t = DEFAULT_HOLD_SECS)]
    pub hold_secs: u64,
    /// SIGKILL one router this many seconds into the hold.
    #[arg(long = "kill-router-at")]
    pub kill_router_at_secs: Option<u64>,
    /// SIGTERM (drain) one router this many seconds into the hold.
    #[arg(long = "drain-router-at")]
    pub drain_router_at_secs: Option<u64>,
    /// Restart the control plane this many seconds into the hold.
    #[arg(long = "restart-control-plane-at")]
    pub restart_control_plane_at_secs: Option<u64>,
    /// Call RotateKeyNow this many seconds into the hold.
    #[arg(long = "rotate-key-at")]
    pub rotate_key_at_secs: Option<u64>,
    /// Restart every router at once this many seconds into the hold (local
    /// mode): SIGTERM (each drains, as a rollout or an `agentmesh-one`
    /// restart does), wait until every router process exited, start them
    /// again on the same ports and keys; the report measures each member's
    /// way back from the first router ready again.
    #[arg(long = "restart-all-routers-at")]
    pub restart_all_routers_at_secs: Option<u64>,
    /// How long `--restart-all-routers-at` waits for every router to exit
    /// after SIGTERM before it SIGKILLs those still running, seconds
    /// (default 60; the report counts them as `killed_after_deadline`).
    #[arg(long, default_value_t = DEFAULT_RESTART_ALL_ROUTERS_EXIT_DEADLINE_SECS)]
    pub restart_all_routers_exit_deadline_secs: u64,
    /// After the hold, start this many joiners at the same instant (0 = no burst).
    #[arg(long, default_value_t = 0)]
    pub burst: u64,
    /// After the fleet leaves, sample router RSS for this many seconds.
    #[arg(long = "after-secs", default_value_t = 0)]
    pub after_secs: u64,
    /// Interval between router RSS samples after the fleet leaves, seconds.
    #[arg(long, default_value_t = DEFAULT_AFTER_INTERVAL_SECS)]
    pub after_interval_secs: u64,
    /// Times a fleet of the same size joins (providers and steps) and leaves
    /// again; rounds after the first have no hold, events or burst, and
    /// router RSS is sampled after each (`--after-secs`): shows whether what
    /// routers keep after the fleet left grows from round to round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Members per worker process (0 = computed from the open-files limit).
    #[arg(long, default_value_t = 0)]
    pub members_per_worker: u64,
    /// File descriptors charged per member when computing members per worker.
    #[arg(long, default_value_t = DEFAULT_FDS_PER_MEMBER)]
    pub fds_per_member: u64,
    /// File descriptors kept free in each worker.
    #[arg(long, default_value_t = DEFAULT_FD_HEADROOM)]
    pub fd_headroom: u64,
    /// Number of 127.0.0.x source addresses members dial from (from 127.0.0.10;
    /// 0 = the kernel chooses). Default: 16 in local mode; 0 in remote mode,
    /// where members dial from the host's own addresses.
    #[arg(long)]
    pub source_ips: Option<u8>,
    /// Deadline for one step (every joiner ready and called, or exited), seconds.
    #[arg(long, default_value_t = DEFAULT_STEP_DEADLINE_SECS)]
    pub step_deadline_secs: u64,
    /// Members' call timeout (node `--call-timeout-secs`), seconds: also the wait for an
    /// accepted call's echo; `call()` itself gets connect + call timeout + a 2 s grace.
    #[arg(long, default_value_t = DEFAULT_CALL_TIMEOUT_SECS)]
    pub call_timeout_secs: u64,
    /// Time budget of a member's first call, retries included, seconds.
    #[arg(long, default_value_t = DEFAULT_CALL_BUDGET_SECS)]
    pub call_budget_secs: u64,
    /// Members' ping interval on each connection (node
    /// `--ping-interval-secs`), seconds: what an idle member costs
    /// depends on it (see the hold's idle row).
    #[arg(long, default_value_t = DEFAULT_MEMBER_PING_INTERVAL_SECS)]
    pub member_ping_interval_secs: u64,
    /// Members' longest wait, once back on one router after losing every
    /// router, before attaching the other K - 1 (node
    /// `--router-rejoin-spread-ms`), milliseconds.
    #[arg(long, default_value_t = DEFAULT_MEMBER_REJOIN_SPREAD_MS)]
    pub member_rejoin_spread_ms: u64,
    /// Echo calls per second per worker during an event window.
    #[arg(long, default_value_t = DEFAULT_WINDOW_CALLS_PER_SEC)]
    pub window_calls_per_sec: u32,
    /// Members run with direct connections on (node `--direct`): each
    /// listens on one TCP port and dials from it, so its cost in memory
    /// and file descriptors shows beside a run without. On one host's
    /// loopback no punch is made (punches never dial loopback).
    #[arg(long)]
    pub member_direct: bool,
    /// With --member-direct: the members' direct transport, tcp|quic (node
    /// `--direct-transport`); with quic the routers listen on QUIC too (the
    /// UDP port of their TCP one), so members dial them over QUIC and
    /// punch over QUIC.
    #[arg(long, value_enum, default_value_t = agentmesh_node::config::DirectTransport::Tcp)]
    pub member_direct_transport: agentmesh_node::config::DirectTransport,
    /// Members' QUIC idle timeout (node `--direct-quic-idle-timeout-secs`):
    /// over QUIC a killed router is noticed only when it runs out,
    /// seconds.
    #[arg(long, default_value_t = agentmesh_node::config::DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS)]
    pub member_quic_idle_timeout_secs: u64,
    /// With --member-direct: how long after its first window call a caller
    /// makes its warm call (counted by path), seconds (issue 36's warm
    /// call: the relayed connection has existed this long).
    #[arg(long, default_value_t = DEFAULT_WARM_CALL_AFTER_SECS)]
    pub warm_call_after_secs: u64,
    /// Directory for data, tokens and logs (default: a new directory under the
    /// system temp dir). An earlier run's database, logs and member data there
    /// are removed first; router keys are kept.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Admin token file for RotateKeyNow in remote mode (local mode makes its own).
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// Hostile peers during the hold (`--attack-*`).
    #[command(flatten)]
    pub attack: crate::attack::AttackConfig,
    /// Policy change and token revocation during the hold.
    #[command(flatten)]
    pub propagation: crate::propagation::PropagationConfig,
    /// Control-plane replica events during the hold.
    #[command(flatten)]
    pub replicas: crate::replicas::ReplicaEventsConfig,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            step: DEFAULT_STEP,
            steps: DEFAULT_STEPS,
            join_rate_per_sec: DEFAULT_JOIN_RATE,
            member_routers: DEFAULT_MEMBER_ROUTERS,
            providers: DEFAULT_PROVIDERS,
            hold_secs: DEFAULT_HOLD_SECS,
            kill_router_at_secs: None,
            drain_router_at_secs: None,
            restart_control_plane_at_secs: None,
            rotate_key_at_secs: None,
            restart_all_routers_at_secs: None,
            restart_all_routers_exit_deadline_secs: DEFAULT_RESTART_ALL_ROUTERS_EXIT_DEADLINE_SECS,
            burst: 0,
            after_secs: 0,
            after_interval_secs: DEFAULT_AFTER_INTERVAL_SECS,
            rounds: 1,
            report: None,
            members_per_worker: 0,
            fds_per_member: DEFAULT_FDS_PER_MEMBER,
            fd_headroom: DEFAULT_FD_HEADROOM,
            source_ips: None,
            step_deadline_secs: DEFAULT_STEP_DEADLINE_SECS,
            call_timeout_secs: DEFAULT_CALL_TIMEOUT_SECS,
            call_budget_secs: DEFAULT_CALL_BUDGET_SECS,
            member_ping_interval_secs: DEFAULT_MEMBER_PING_INTERVAL_SECS,
            member_rejoin_spread_ms: DEFAULT_MEMBER_REJOIN_SPREAD_MS,
            window_calls_per_sec: DEFAULT_WINDOW_CALLS_PER_SEC,
            member_direct: false,
            member_direct_transport: agentmesh_node::config::DirectTransport::Tcp,
            member_quic_idle_timeout_secs:
                agentmesh_node::config::DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS,
            warm_call_after_secs: DEFAULT_WARM_CALL_AFTER_SECS,
            work_dir: None,
            admin_token_file: None,
            attack: crate::attack::AttackConfig::default(),
            propagation: crate::propagation::PropagationConfig::default(),
            replicas: crate::replicas::ReplicaEventsConfig::default(),
        }
    }
}

impl FleetConfig {
    /// The 127.0.0.x source addresses members dial from: as asked, else
    /// [`DEFAULT_SOURCE_IPS`] for a local mesh (on loopback) and none for a
    /// remote one (loopback addresses cannot reach it).
    pub fn source_ips(&self, local: bool) -> u8 {
        self.source_ips
            .unwrap_or(if local { DEFAULT_SOURCE_IPS } else { 0 })
    }

    /// Every member the run will start (providers and steps each round,
    /// burst, the attack's joiners).
    pub fn total_members(&self) -> u64 {
        (self.providers + self.step * u64::from(self.steps)) * u64::from(self.rounds.max(1))
            + self.burst
            + self.attack.members()
    }
}

/// Local mode: the ladder starts its own control plane and routers.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct LocalConfig {
    /// Routers to start.
    #[arg(long, default_value_t = DEFAULT_ROUTERS)]
    pub routers: usize,
    /// Control-plane replicas to start on the one database, replicas (each on
    /// loopback ports of its own, all serving the first one's URL as
    /// `--public-url`; routers and members get each as a
    /// `--control-plane-endpoint`). Above 1 needs PostgreSQL
    /// (`--control-plane-store postgres` or `--control-plane-db postgres://…`).
    /// Default 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_CONTROL_PLANES))]
    pub control_planes: u32,
    /// Extra argument for the control plane (repeatable), e.g. `--control-plane-arg=--enroll-rate-per-sec=50`.
    #[arg(long = "control-plane-arg", allow_hyphen_values = true)]
    pub control_plane_args: Vec<String>,
    /// Extra argument for every router (repeatable).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    pub router_args: Vec<String>,
    /// Deadline for a child program's `/readyz`, seconds.
    #[arg(long, default_value_t = DEFAULT_READY_DEADLINE_SECS)]
    pub ready_deadline_secs: u64,
    /// Start a killed or drained router again (same key and port) when its
    /// event's window ends, as Kubernetes would, so later events find the
    /// full set of routers. Without it a router stays gone.
    #[arg(long)]
    pub restart_routers: bool,
    /// Serve the control plane's gRPC over TLS with a self-signed certificate
    /// made for the run; routers and members get it as their CA (the path a
    /// remote run against an `https://` control plane takes).
    #[arg(long)]
    pub control_plane_tls: bool,
    /// Cap the whole run (control plane, routers, fleet workers, the ladder
    /// itself) at this many CPU cores, e.g. 1.4, in a cgroup of its own the
    /// ladder creates and removes (cgroup v2 `cpu.max` or v1 CFS quota; needs
    /// root). Default: no cap.
    #[arg(long)]
    pub cpu_quota: Option<f64>,
    /// The control plane's database, e.g. `postgres://USER@HOST:PORT/DB` (an empty
    /// database; the ladder writes a key-encryption key for it into the work dir).
    /// Default: SQLite in the work dir (`control-plane.db`).
    #[arg(long)]
    pub control_plane_db: Option<String>,
    /// The control plane's store: `sqlite` (a file in the work dir, or
    /// `--control-plane-db`) or `postgres`: a PostgreSQL server the ladder
    /// starts for the run (initdb in a temp dir, as the `postgres` user when
    /// root, 127.0.0.1 on a free port) and stops and removes at the end.
    #[arg(long, value_enum, default_value_t = crate::postgres::StoreKind::Sqlite)]
    pub control_plane_store: crate::postgres::StoreKind,
    /// Directory of the PostgreSQL binaries (`initdb`, `postgres`,
    /// `pg_isready`, `createdb`) for `--control-plane-store postgres`.
    /// Default: the newest of /usr/lib/postgresql/{17,16,15}/bin.
    #[arg(long)]
    pub postgres_bin_dir: Option<PathBuf>,
    /// Members' (and routers') credential lifetime, seconds: passed to the
    /// control plane as `--credential-ttl-secs`, so that a short one makes
    /// the fleet refresh during the run (each about two thirds into its
    /// lifetime) and the report's `refresh` measures it. Default: the
    /// control plane's (3600 s: no refresh in a short ladder).
    #[arg(long)]
    pub credential_ttl_secs: Option<u64>,
    /// Environment for the control plane (the password of a server the
    /// ladder started); not a flag.
    #[arg(skip)]
    pub control_plane_env: Vec<(String, String)>,
    /// Routers listen on QUIC too, on the UDP port of their TCP one: set
    /// when the members' direct transport is QUIC; not a flag.
    #[arg(skip)]
    pub routers_quic: bool,
    /// The pid of the database server the ladder started (its CPU and
    /// memory are read beside the control plane's); not a flag.
    #[arg(skip)]
    pub store_server_pid: Option<u32>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            routers: DEFAULT_ROUTERS,
            control_planes: 1,
            control_plane_args: Vec::new(),
            router_args: Vec::new(),
            ready_deadline_secs: DEFAULT_READY_DEADLINE_SECS,
            restart_routers: false,
            control_plane_tls: false,
            cpu_quota: None,
            control_plane_db: None,
            control_plane_store: crate::postgres::StoreKind::Sqlite,
            postgres_bin_dir: None,
            credential_ttl_secs: None,
            control_plane_env: Vec::new(),
            routers_quic: false,
            store_server_pid: None,
        }
    }
}

/// Remote mode: the fleet joins an existing mesh.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct RemoteConfig {
    /// The control plane's gRPC URL (`http://` on loopback, else `https://`).
    #[arg(long)]
    pub control_plane: String,
    /// PEM CA certificate of an `https://` control plane (default: the system roots).
    #[arg(long)]
    pub control_plane_ca: Option<PathBuf>,
    /// A member token good for the whole run (ephemeral, enough uses).
    #[arg(long)]
    pub token_file: PathBuf,
    /// A router's `/metrics` address to scrape each step (repeatable).
    #[arg(long = "router-metrics-addr")]
    pub router_metrics_addrs: Vec<std::net::SocketAddr>,
    /// The control plane's HTTP address (`/metrics`), to scrape each step.
    #[arg(long)]
    pub control_plane_http_addr: Option<std::net::SocketAddr>,
}

/// A worker process: hosts members, driven over stdin/stdout.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct WorkerConfig {
    /// This worker's index (names its data and logs).
    #[arg(long, default_value_t = 0)]
    pub index: usize,
    /// The control plane's gRPC URL.
    #[arg(long)]
    pub control_plane: String,
    /// A control-plane replica to dial (repeatable; default: none, the URL
    /// alone). Each member starts on a different one, as a Service would
    /// spread them.
    #[arg(long = "control-plane-endpoint")]
    pub control_plane_endpoints: Vec<String>,
    /// PEM CA certificate of an `https://` control plane.
    #[arg(long)]
    pub control_plane_ca: Option<PathBuf>,
    /// The member token file.
    #[arg(long)]
    pub token_file: PathBuf,
    /// Directory for the members' data dirs and sockets.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Routers each member attaches to (K).
    #[arg(long, default_value_t = DEFAULT_MEMBER_ROUTERS)]
    pub member_routers: usize,
    /// Number of 127.0.0.x source addresses (0 = let the kernel choose).
    #[arg(long, default_value_t = DEFAULT_SOURCE_IPS)]
    pub source_ips: u8,
    /// Members' call timeout (node `--call-timeout-secs`), seconds: also the wait for an
    /// accepted call's echo; `call()` itself gets connect + call timeout + a 2 s grace.
    #[arg(long, default_value_t = DEFAULT_CALL_TIMEOUT_SECS)]
    pub call_timeout_secs: u64,
    /// Time budget of a member's first call, seconds.
    #[arg(long, default_value_t = DEFAULT_CALL_BUDGET_SECS)]
    pub call_budget_secs: u64,
    /// Members' ping interval on each connection (node
    /// `--ping-interval-secs`), seconds: what an idle member costs
    /// depends on it (see the hold's idle row).
    #[arg(long, default_value_t = DEFAULT_MEMBER_PING_INTERVAL_SECS)]
    pub member_ping_interval_secs: u64,
    /// Members' longest wait, once back on one router after losing every
    /// router, before attaching the other K - 1 (node
    /// `--router-rejoin-spread-ms`), milliseconds.
    #[arg(long, default_value_t = DEFAULT_MEMBER_REJOIN_SPREAD_MS)]
    pub member_rejoin_spread_ms: u64,
    /// Echo calls per second during an event window.
    #[arg(long, default_value_t = DEFAULT_WINDOW_CALLS_PER_SEC)]
    pub window_calls_per_sec: u32,
    /// Members run with direct connections on (node `--direct`).
    #[arg(long)]
    pub member_direct: bool,
    /// Their direct transport (node `--direct-transport`).
    #[arg(long, value_enum, default_value_t = agentmesh_node::config::DirectTransport::Tcp)]
    pub member_direct_transport: agentmesh_node::config::DirectTransport,
    /// Their QUIC idle timeout (node `--direct-quic-idle-timeout-secs`), seconds.
    #[arg(long, default_value_t = agentmesh_node::config::DEFAULT_DIRECT_QUIC_IDLE_TIMEOUT_SECS)]
    pub member_quic_idle_timeout_secs: u64,
    /// Seconds from a window caller's first call to its warm call.
    #[arg(long, default_value_t = DEFAULT_WARM_CALL_AFTER_SECS)]
    pub warm_call_after_secs: u64,
    /// The propagation events' part (second service, revocable token).
    #[command(flatten)]
    pub propagation: crate::propagation::PropagationWorkerConfig,
}

/// The source address for member `index` (None when spreading is off).
pub fn source_ip(index: u64, source_ips: u8) -> Option<Ipv4Addr> {
    if source_ips == 0 {
        return None;
    }
    let [a, b, c, d] = FIRST_SOURCE_IP.octets();
    let offset = (index % u64::from(source_ips)) as u8;
    Some(Ipv4Addr::new(a, b, c, d.saturating_add(offset)))
}

/// Members one worker may host given its open-files limit.
pub fn members_per_worker(nofile: u64, fds_per_member: u64, headroom: u64) -> u64 {
    (nofile.saturating_sub(headroom) / fds_per_member.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Both {
        #[command(flatten)]
        fleet: FleetConfig,
        #[command(flatten)]
        local: LocalConfig,
    }

    #[test]
    fn no_flags_give_the_defaults() {
        let b = Both::parse_from(["agentmesh-ladder"]);
        assert_eq!(b.fleet, FleetConfig::default());
        assert_eq!(b.local, LocalConfig::default());
    }

    #[test]
    fn flags_from_the_issue_parse() {
        let b = Both::parse_from([
            "agentmesh-ladder",
            "--step",
            "1000",
            "--steps",
            "10",
            "--join-rate",
            "20",
            "--drain-router-at",
            "15",
            "--routers",
            "4",
            "--control-plane-arg=--enroll-rate-per-sec=50",
        ]);
        assert_eq!(b.fleet.step, 1000);
        assert_eq!(b.fleet.drain_router_at_secs, Some(15));
        assert_eq!(b.local.control_plane_args, ["--enroll-rate-per-sec=50"]);
        assert_eq!(b.fleet.total_members(), 3 + 10_000);
    }

    #[test]
    fn sizing_and_source_addresses() {
        assert_eq!(members_per_worker(20_000, 8, 1_000), 2_375);
        assert_eq!(members_per_worker(10, 8, 1_000), 1);
        assert_eq!(source_ip(0, 16), Some(Ipv4Addr::new(127, 0, 0, 10)));
        assert_eq!(source_ip(17, 16), Some(Ipv4Addr::new(127, 0, 0, 11)));
        assert_eq!(source_ip(5, 0), None);
    }

    #[test]
    fn remote_members_dial_from_loopback_only_when_asked() {
        let mut fleet = FleetConfig::default();
        assert_eq!(fleet.source_ips(true), DEFAULT_SOURCE_IPS);
        assert_eq!(fleet.source_ips(false), 0);
        fleet.source_ips = Some(4);
        assert_eq!((fleet.source_ips(true), fleet.source_ips(false)), (4, 4));
    }
}
