//! The control plane's configuration: data only, one field per flag.
//!
//! Every field documents its unit and default; defaults are the `DEFAULT_*`
//! constants below, used both by `Default` and by the clap flags, so they are
//! defined once.

use std::{net::SocketAddr, path::PathBuf};

mod sections;
pub use sections::{GrpcServerConfig, HttpConfig, ScheduleConfig, Sections};

/// Default `--grpc-addr`.
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:7400";
/// Default `--http-addr`.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:7401";
/// Default `--db`.
pub const DEFAULT_DB: &str = "sqlite://./agentmesh-data/controlplane.db";
/// Default `--enroll-rate-per-sec`.
pub const DEFAULT_ENROLL_RATE_PER_SEC: u32 = 10;
/// Default `--enroll-burst`.
pub const DEFAULT_ENROLL_BURST: u32 = 20;
/// Default `--refresh-rate-per-sec` (refresh has its own, higher limit).
pub const DEFAULT_REFRESH_RATE_PER_SEC: u32 = 100;
/// Default `--refresh-burst`.
pub const DEFAULT_REFRESH_BURST: u32 = 200;
/// Default `--enroll-max-retry-after-secs`: the longest `retry-after` a
/// refused enrollment is given (600 callers' worth of slots at 10/s).
pub const DEFAULT_ENROLL_MAX_RETRY_AFTER_SECS: u64 = 60;
/// Default `--refresh-max-retry-after-secs`.
pub const DEFAULT_REFRESH_MAX_RETRY_AFTER_SECS: u64 = 60;
/// Default `--grpc-max-connections`: one per member and router of a 10,000
/// member fleet, with room; the process needs a file-descriptor limit above it.
pub const DEFAULT_GRPC_MAX_CONNECTIONS: usize = 20_000;
/// Default `--grpc-max-concurrent-streams-per-connection`: a member or router
/// makes a few calls at once; a proxy multiplexing many clients needs more.
pub const DEFAULT_GRPC_MAX_CONCURRENT_STREAMS_PER_CONNECTION: usize = 100;
/// Default `--grpc-keepalive-interval-secs`: an HTTP/2 PING this often finds
/// a peer that vanished without closing (laptop lid, NAT timeout) well
/// before the kernel would.
pub const DEFAULT_GRPC_KEEPALIVE_INTERVAL_SECS: u64 = 60;
/// Default `--grpc-keepalive-timeout-secs`: a PING unanswered this long
/// closes the connection and frees its slot.
pub const DEFAULT_GRPC_KEEPALIVE_TIMEOUT_SECS: u64 = 20;
/// Default `--grpc-max-connection-age-secs`: an idle HTTP/2 connection
/// costs the control plane about 22 KiB (buffers, HPACK tables, the
/// connection's task), five times what an enrolled member costs otherwise,
/// and members call only to refresh; after this age a connection is sent
/// GOAWAY and closes once its calls finish, and the member's client
/// connects again at its next call. Five minutes spread over a 10,000
/// member fleet is about 33 new connections a second.
pub const DEFAULT_GRPC_MAX_CONNECTION_AGE_SECS: u64 = 300;
/// Default `--grpc-handshake-timeout-secs`: a real client sends its first
/// call within milliseconds of connecting; a silent socket holds a
/// `--grpc-max-connections` slot no longer than this.
pub const DEFAULT_GRPC_HANDSHAKE_TIMEOUT_SECS: u64 = 20;
/// Default `--grpc-max-message-bytes` (64 KiB): the largest legitimate
/// request, a RouterLease with 32 addresses of 512 bytes, 32 labels and a
/// credential carrying 32 labels, encodes to under 40 KiB
/// (`tests/all/grpc_limits.rs` sends it).
pub const DEFAULT_GRPC_MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Shortest admin bearer token accepted, characters.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// Default `--auth-failures-per-source-per-min`.
pub const DEFAULT_AUTH_FAILURES_PER_SOURCE_PER_MIN: u32 = 60;
/// Default `--failure-guard-max-sources`.
pub const DEFAULT_FAILURE_GUARD_MAX_SOURCES: usize = 100_000;
/// Default `--token-index-max-tokens`: 100,000 live enrollment tokens
/// (about 6 MiB in memory); tokens are minted by operators and reaped
/// when expired or used up.
pub const DEFAULT_TOKEN_INDEX_MAX_TOKENS: usize = 100_000;
/// Default `--token-index-max-age-secs`: a token minted by another process
/// is usable from an address the failure guard refuses within 5 s; while
/// such an address is attacked the index is read at most this often.
pub const DEFAULT_TOKEN_INDEX_MAX_AGE_SECS: u64 = 5;
/// Default `--unauth-rate-per-sec`: what the work before a caller is known
/// may cost (a Refresh verifies two ed25519 signatures); a 10,000-member
/// fleet needs about 200/s (directory reads every minute, refreshes, leases).
pub const DEFAULT_UNAUTH_RATE_PER_SEC: u32 = 1_000;
/// Default `--unauth-burst`: a join burst of 2,000 members passes before
/// the shares bind (they bind once half the burst is spent).
pub const DEFAULT_UNAUTH_BURST: u32 = 4_000;
/// Default `--lease-rate-per-sec`: 100 routers leasing every 15 s need about 7/s.
pub const DEFAULT_LEASE_RATE_PER_SEC: u32 = 50;
/// Default `--lease-burst`.
pub const DEFAULT_LEASE_BURST: u32 = 100;
/// Default `--source-table-max-sources`.
pub const DEFAULT_SOURCE_TABLE_MAX_SOURCES: usize = 100_000;
/// Default `--ipv6-source-prefix-len`: an IPv6 host usually holds a /64.
pub const DEFAULT_IPV6_SOURCE_PREFIX_LEN: u8 = 64;
/// Default `--credential-ttl-secs`.
pub const DEFAULT_CREDENTIAL_TTL_SECS: u64 = 3600;
/// Default `--clock-skew-secs`.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// Default `--refresh-grace-secs`.
pub const DEFAULT_REFRESH_GRACE_SECS: u64 = 300;
/// Default `--key-rotation-interval-secs` (one day).
pub const DEFAULT_KEY_ROTATION_INTERVAL_SECS: u64 = 86_400;
/// Default `--key-publish-ahead-secs`.
pub const DEFAULT_KEY_PUBLISH_AHEAD_SECS: u64 = 600;
/// Default `--key-grace-secs` (must be >= credential TTL + skew + refresh grace).
pub const DEFAULT_KEY_GRACE_SECS: u64 = 7200;
/// Default `--key-check-interval-secs` (at most 60: rotation is checked at least once a minute).
pub const DEFAULT_KEY_CHECK_INTERVAL_SECS: u64 = 30;
/// Default `--node-retention-secs` (30 days).
pub const DEFAULT_NODE_RETENTION_SECS: u64 = 30 * 86_400;
/// Default `--ephemeral-retention-secs`.
pub const DEFAULT_EPHEMERAL_RETENTION_SECS: u64 = 3600;
/// Default `--enrollment-retention-secs` (7 days).
pub const DEFAULT_ENROLLMENT_RETENTION_SECS: u64 = 7 * 86_400;
/// Default `--used-token-retention-secs` (one day).
pub const DEFAULT_USED_TOKEN_RETENTION_SECS: u64 = 86_400;
/// Default `--admin-request-retention-secs` (one day): an admin call
/// retried within a day with its request id gets its first answer; an
/// operator retrying later chooses to do it again.
pub const DEFAULT_ADMIN_REQUEST_RETENTION_SECS: u64 = 86_400;
/// Default `--lease-ttl-secs`.
pub const DEFAULT_LEASE_TTL_SECS: u64 = 30;
/// Default `--reap-interval-secs`.
pub const DEFAULT_REAP_INTERVAL_SECS: u64 = 60;
/// Default `--reap-batch-rows`: deleting 1000 rows holds the writer for
/// milliseconds, so an enrollment waits at most that behind the reaper, and a
/// 100k-row backlog still clears in one pass of 100 transactions.
pub const DEFAULT_REAP_BATCH_ROWS: u64 = 1000;
/// Default `--db-read-connections`.
pub const DEFAULT_DB_READ_CONNECTIONS: usize = crate::store::DEFAULT_READ_CONNECTIONS;
/// Default `--db-pool-connections`.
pub const DEFAULT_DB_POOL_CONNECTIONS: usize = crate::store::DEFAULT_POOL_CONNECTIONS;
/// Default `--db-max-inflight`.
pub const DEFAULT_DB_MAX_INFLIGHT: usize = 64;
/// Default `--db-wait-timeout-secs`.
pub const DEFAULT_DB_WAIT_TIMEOUT_SECS: u64 = 5;
/// Default `--db-unready-after-secs`.
pub const DEFAULT_DB_UNREADY_AFTER_SECS: u64 = 10;
/// Default `--directory-cache-ms`.
pub const DEFAULT_DIRECTORY_CACHE_MS: u64 = 1000;
/// Default `--shutdown-grace-secs`.
pub const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 10;
/// Default `--policy-retention-secs` (90 days): a replaced policy version
/// stays readable (`policy show --version N`, `policy diff`) this long.
pub const DEFAULT_POLICY_RETENTION_SECS: u64 = 90 * 86_400;
/// Default `--policy-check-interval-ms`: a version another process on the
/// same database applied is taken up (and pushed) within a second; one
/// cheap read a second.
pub const DEFAULT_POLICY_CHECK_INTERVAL_MS: u64 = 1000;
/// Default `--watch-max-streams`: routers hold one watch each; a fleet of
/// 10,000 members needs tens of routers, and each watcher costs one
/// HTTP/2 stream and a shared reference to the current event.
pub const DEFAULT_WATCH_MAX_STREAMS: usize = 1024;
/// Default `--watch-max-age-secs`: routers' watches stay where they opened
/// (after a rollout, on the replicas that came up first) unless ended; an
/// end every 2.5-5 minutes per router re-balances a fleet within minutes
/// at one reopen (a proof check, a node read, one full event) per router
/// per few minutes.
pub const DEFAULT_WATCH_MAX_AGE_SECS: u64 = 300;

/// Configuration of one control plane.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Config {
    /// gRPC listen address (port 0 picks a free port). Default 127.0.0.1:7400.
    #[arg(long, default_value = DEFAULT_GRPC_ADDR)]
    pub grpc_addr: SocketAddr,
    /// HTTP listen address for /info, /metrics, /healthz, /readyz. Default 127.0.0.1:7401.
    #[arg(long, default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// Endpoint string members sign in their proofs. Default: `http(s)://` + the bound gRPC address.
    #[arg(long)]
    pub public_url: Option<String>,
    /// PEM certificate chain for gRPC TLS. Default none (plaintext).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for gRPC TLS. Default none.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow plaintext gRPC on a non-loopback address. Default false.
    #[arg(long)]
    pub insecure: bool,
    /// Open gRPC connections at most, per process; when all are open, a connection from a
    /// source holding fewer than the busiest source takes that source's oldest (closed and
    /// counted), else it is closed at accept and counted. Default 20000.
    #[arg(long, default_value_t = DEFAULT_GRPC_MAX_CONNECTIONS)]
    pub grpc_max_connections: usize,
    /// Calls in flight on one gRPC connection at most; more are refused with
    /// RESOURCE_EXHAUSTED + retry-after and counted. Default 100.
    #[arg(long, default_value_t = DEFAULT_GRPC_MAX_CONCURRENT_STREAMS_PER_CONNECTION)]
    pub grpc_max_concurrent_streams_per_connection: usize,
    /// Interval between HTTP/2 keepalive PINGs on an idle gRPC connection, seconds. Default 60.
    #[arg(long, default_value_t = DEFAULT_GRPC_KEEPALIVE_INTERVAL_SECS)]
    pub grpc_keepalive_interval_secs: u64,
    /// How long a keepalive PING may go unanswered before the connection is
    /// closed, seconds. Default 20.
    #[arg(long, default_value_t = DEFAULT_GRPC_KEEPALIVE_TIMEOUT_SECS)]
    pub grpc_keepalive_timeout_secs: u64,
    /// Age after which a gRPC connection is sent GOAWAY and closed once its calls (a Watch
    /// included) have finished, so idle members hold no connection; 0 never, seconds. Default 300.
    #[arg(long, default_value_t = DEFAULT_GRPC_MAX_CONNECTION_AGE_SECS)]
    pub grpc_max_connection_age_secs: u64,
    /// How long an accepted gRPC connection may take to finish its TLS
    /// handshake and HTTP/2 preface and send its first call, seconds; a
    /// connection still silent then is closed and counted. Default 20.
    #[arg(long, default_value_t = DEFAULT_GRPC_HANDSHAKE_TIMEOUT_SECS)]
    pub grpc_handshake_timeout_secs: u64,
    /// Largest gRPC request message accepted, bytes; a larger one is refused
    /// with OUT_OF_RANGE before it is read. Default 65536.
    #[arg(long, default_value_t = DEFAULT_GRPC_MAX_MESSAGE_BYTES)]
    pub grpc_max_message_bytes: usize,
    /// Database: `sqlite://PATH`, or `postgres://USER@HOST:PORT/DATABASE` (libpq's `PG*`
    /// variables fill what the URL leaves out; `sslmode=verify-full&sslrootcert=CA.pem` for
    /// TLS). Default sqlite://./agentmesh-data/controlplane.db.
    #[arg(long, default_value = DEFAULT_DB)]
    pub db: String,
    /// File holding the key-encryption key that seals signing keys in the database (64 hex
    /// digits; `AGENTMESH_KEY_ENCRYPTION_KEY` is read when no file is given). Required for
    /// PostgreSQL; SQLite defaults to `<db>.kek` beside the database, created 0600.
    #[arg(long)]
    pub key_encryption_key_file: Option<PathBuf>,
    /// The key-encryption key being replaced, during a rotation: rows sealed with it are
    /// opened and sealed again with the new one at startup. Default none.
    #[arg(long)]
    pub previous_key_encryption_key_file: Option<PathBuf>,
    /// The key-encryption key itself, 64 hex digits (programs embedding the control plane;
    /// never a flag). Default none.
    #[arg(skip)]
    pub key_encryption_key: Option<String>,
    /// Enrollments whose proof verified, requests per second per process, shared fairly by
    /// sources once contended. Default 10.
    #[arg(long, default_value_t = DEFAULT_ENROLL_RATE_PER_SEC)]
    pub enroll_rate_per_sec: u32,
    /// Enroll budget burst, requests. Default 20.
    #[arg(long, default_value_t = DEFAULT_ENROLL_BURST)]
    pub enroll_burst: u32,
    /// Refreshes whose credential verified, requests per second per process, shared fairly
    /// by sources once contended. Default 100.
    #[arg(long, default_value_t = DEFAULT_REFRESH_RATE_PER_SEC)]
    pub refresh_rate_per_sec: u32,
    /// Refresh budget burst, requests. Default 200.
    #[arg(long, default_value_t = DEFAULT_REFRESH_BURST)]
    pub refresh_burst: u32,
    /// Router leases whose router credential verified, requests per second per process
    /// (members cannot reach this budget). Default 50.
    #[arg(long, default_value_t = DEFAULT_LEASE_RATE_PER_SEC)]
    pub lease_rate_per_sec: u32,
    /// Lease budget burst, requests. Default 100.
    #[arg(long, default_value_t = DEFAULT_LEASE_BURST)]
    pub lease_burst: u32,
    /// Requests before their caller is known (every Enroll, Refresh, RouterLease, GetKeys,
    /// GetDirectory), requests per second per process; once half the burst is spent each
    /// source gets at most its share. Default 1000.
    #[arg(long, default_value_t = DEFAULT_UNAUTH_RATE_PER_SEC)]
    pub unauth_rate_per_sec: u32,
    /// Unauthenticated budget burst, requests. Default 4000.
    #[arg(long, default_value_t = DEFAULT_UNAUTH_BURST)]
    pub unauth_burst: u32,
    /// Longest `retry-after` given to a refused Enroll, seconds: refused callers are
    /// spread over the slots in which the limiter can serve them, up to this far
    /// ahead. Default 60.
    #[arg(long, default_value_t = DEFAULT_ENROLL_MAX_RETRY_AFTER_SECS)]
    pub enroll_max_retry_after_secs: u64,
    /// Longest `retry-after` given to a refused Refresh, seconds (a refused RouterLease is
    /// never queued: it is told the next token). Default 60.
    #[arg(long, default_value_t = DEFAULT_REFRESH_MAX_RETRY_AFTER_SECS)]
    pub refresh_max_retry_after_secs: u64,
    /// Failed authentications (Enroll, Refresh, RouterLease, admin) and malformed requests
    /// allowed per source per minute, per process, before the source is refused for the rest
    /// of the minute. Default 60.
    #[arg(
        long,
        alias = "enroll-failures-per-ip-per-min",
        default_value_t = DEFAULT_AUTH_FAILURES_PER_SOURCE_PER_MIN
    )]
    pub auth_failures_per_source_per_min: u32,
    /// Sources the failure guard tracks at once, sources; new ones are aggregated to wider
    /// prefixes as it fills and share one entry when it is full (none is dropped). Default 100000.
    #[arg(
        long,
        alias = "failure-guard-max-ips",
        default_value_t = DEFAULT_FAILURE_GUARD_MAX_SOURCES
    )]
    pub failure_guard_max_sources: usize,
    /// Live enrollment tokens the failure guard's token index keeps, tokens: an Enroll from
    /// a source over its failures reaches the enroll budget and the database only with a
    /// token the index holds. With more live tokens than this the index cannot refuse
    /// (counted in token_index_loads_total{result="truncated"}); 0 turns it off. Default
    /// 100000.
    #[arg(long, default_value_t = DEFAULT_TOKEN_INDEX_MAX_TOKENS)]
    pub token_index_max_tokens: usize,
    /// Age after which the token index is read from the database again when a source over
    /// its failures enrolls with a token it does not hold, seconds (a mint in this process
    /// makes it stale at once). Default 5.
    #[arg(long, default_value_t = DEFAULT_TOKEN_INDEX_MAX_AGE_SECS)]
    pub token_index_max_age_secs: u64,
    /// Sources each per-source table (unauthenticated, enroll and refresh shares,
    /// connections, refusal logs) tracks at once, sources; aggregated and then shared as it
    /// fills, like the failure guard's. Default 100000.
    #[arg(long, default_value_t = DEFAULT_SOURCE_TABLE_MAX_SOURCES)]
    pub source_table_max_sources: usize,
    /// Bits of an IPv6 address that make one source for every per-source limit (128: each
    /// address alone), bits. Default 64.
    #[arg(long, default_value_t = DEFAULT_IPV6_SOURCE_PREFIX_LEN)]
    pub ipv6_source_prefix_len: u8,
    /// Lifetime of a credential, seconds. Default 3600.
    #[arg(long, default_value_t = DEFAULT_CREDENTIAL_TTL_SECS)]
    pub credential_ttl_secs: u64,
    /// Clock skew tolerated when checking credentials, seconds. Default 60.
    #[arg(long, default_value_t = DEFAULT_CLOCK_SKEW_SECS)]
    pub clock_skew_secs: u64,
    /// How long after expiry a credential is still accepted by Refresh, seconds. Default 300.
    #[arg(long, default_value_t = DEFAULT_REFRESH_GRACE_SECS)]
    pub refresh_grace_secs: u64,
    /// Interval between signing-key rotations, seconds. Default 86400.
    #[arg(long, default_value_t = DEFAULT_KEY_ROTATION_INTERVAL_SECS)]
    pub key_rotation_interval_secs: u64,
    /// How long a new key is published before it signs, seconds. Default 600.
    #[arg(long, default_value_t = DEFAULT_KEY_PUBLISH_AHEAD_SECS)]
    pub key_publish_ahead_secs: u64,
    /// How long a replaced key still verifies, seconds; >= credential TTL + skew + refresh
    /// grace. Default 7200.
    #[arg(long, default_value_t = DEFAULT_KEY_GRACE_SECS)]
    pub key_grace_secs: u64,
    /// How often the rotation deadline is checked, seconds (1..=60). Default 30.
    #[arg(long, default_value_t = DEFAULT_KEY_CHECK_INTERVAL_SECS)]
    pub key_check_interval_secs: u64,
    /// Nodes not seen for this long are deleted, seconds. Default 2592000 (30 days).
    #[arg(long, default_value_t = DEFAULT_NODE_RETENTION_SECS)]
    pub node_retention_secs: u64,
    /// Members of an ephemeral token are deleted this long after they stop refreshing, seconds. Default 3600.
    #[arg(long, default_value_t = DEFAULT_EPHEMERAL_RETENTION_SECS)]
    pub ephemeral_retention_secs: u64,
    /// Enrollment request records are kept this long, seconds. Default 604800 (7 days).
    #[arg(long, default_value_t = DEFAULT_ENROLLMENT_RETENTION_SECS)]
    pub enrollment_retention_secs: u64,
    /// A used-up token is kept this long after its last use (so its holders can re-enroll), seconds. Default 86400.
    #[arg(long, default_value_t = DEFAULT_USED_TOKEN_RETENTION_SECS)]
    pub used_token_retention_secs: u64,
    /// An admin call's request id, digest and answer are kept this long, so a retry with the id gets the first answer, seconds. Default 86400.
    #[arg(long, default_value_t = DEFAULT_ADMIN_REQUEST_RETENTION_SECS)]
    pub admin_request_retention_secs: u64,
    /// Lifetime of a router lease, seconds. Default 30.
    #[arg(long, default_value_t = DEFAULT_LEASE_TTL_SECS)]
    pub lease_ttl_secs: u64,
    /// How often the reapers run, seconds. Default 60.
    #[arg(long, default_value_t = DEFAULT_REAP_INTERVAL_SECS)]
    pub reap_interval_secs: u64,
    /// Rows a reaper transaction deletes at most; the writer is released between
    /// batches so enrollment interleaves with a long backlog. Default 1000.
    #[arg(long, default_value_t = DEFAULT_REAP_BATCH_ROWS)]
    pub reap_batch_rows: u64,
    /// Read-only database connections beside the one writer (WAL lets them read
    /// while it writes), connections. Default 4.
    #[arg(long, default_value_t = DEFAULT_DB_READ_CONNECTIONS)]
    pub db_read_connections: usize,
    /// PostgreSQL connections this process opens at most (the pool); operations beyond it
    /// wait for one within --db-wait-timeout-secs, then UNAVAILABLE. Gauge
    /// `agentmesh_control_plane_db_pool_connections`. Default 16.
    #[arg(long, default_value_t = DEFAULT_DB_POOL_CONNECTIONS)]
    pub db_pool_connections: usize,
    /// Database operations at once; more wait up to --db-wait-timeout-secs, then UNAVAILABLE. Default 64.
    #[arg(long, default_value_t = DEFAULT_DB_MAX_INFLIGHT)]
    pub db_max_inflight: usize,
    /// Longest wait of a database operation, seconds: for a slot, then a connection, then a
    /// lock (SQLite's file lock; PostgreSQL's `lock_timeout` and `statement_timeout`), all
    /// under one deadline; past it, UNAVAILABLE + retry-after. Default 5.
    #[arg(long, default_value_t = DEFAULT_DB_WAIT_TIMEOUT_SECS)]
    pub db_wait_timeout_secs: u64,
    /// How long the database must fail every `/readyz` ping before this replica reports not
    /// ready, seconds (0: at the first failure); a shorter blip keeps every replica in
    /// service. Default 10.
    #[arg(long, default_value_t = DEFAULT_DB_UNREADY_AFTER_SECS)]
    pub db_unready_after_secs: u64,
    /// How long a GetDirectory answer is reused, milliseconds. Default 1000.
    #[arg(long, default_value_t = DEFAULT_DIRECTORY_CACHE_MS)]
    pub directory_cache_ms: u64,
    /// Grace for in-flight RPCs on shutdown, seconds. Default 10.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_GRACE_SECS)]
    pub shutdown_grace_secs: u64,
    /// Listen address for CPU and heap profiles (binary built with `--features pprof`). Default none.
    #[arg(long)]
    pub pprof_addr: Option<SocketAddr>,
    /// Testing only: a supervised task that ends after this many milliseconds, so the supervisor stops the program. Default none.
    #[arg(long, hide = true)]
    pub fault_end_task_after_ms: Option<u64>,
    /// File holding the admin bearer token (admin RPCs are disabled without one). Default none.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// The admin bearer token itself (programs embedding the control plane; never a flag,
    /// so it does not show in `ps`). Default none.
    #[arg(skip)]
    pub admin_token: Option<String>,
    /// Policy file (TOML) applied at start when it differs from the policy in force; a
    /// policy that does not pass its checks stops the start and nothing is applied.
    /// Default none.
    #[arg(long, conflicts_with = "policy_allow_all")]
    pub policy: Option<PathBuf>,
    /// When the database holds no policy yet, apply the built-in allow-all policy (every
    /// member may provide and call every service); a policy already applied stays. Default
    /// false.
    #[arg(long)]
    pub policy_allow_all: bool,
    /// A replaced policy version is kept this long before the reaper deletes it, seconds
    /// (the version in force is always kept). Default 7776000 (90 days).
    #[arg(long, default_value_t = DEFAULT_POLICY_RETENTION_SECS)]
    pub policy_retention_secs: u64,
    /// How often the policy version in force is read from the database, to take up one
    /// another process applied and re-sign after a key rotation, milliseconds. Default 1000.
    #[arg(long, default_value_t = DEFAULT_POLICY_CHECK_INTERVAL_MS)]
    pub policy_check_interval_ms: u64,
    /// Watch streams (routers' pushes of policy, revocations and keys) open at once at most;
    /// more are refused with RESOURCE_EXHAUSTED and counted (limiter watch_streams), streams. Default 1024.
    #[arg(long, default_value_t = DEFAULT_WATCH_MAX_STREAMS)]
    pub watch_max_streams: usize,
    /// A Watch stream is ended with a "move" status (the router watches again at once, on the
    /// next replica it rotates to) at a random age between half of this and this, so routers'
    /// watches spread over the replicas after a rollout; 0 never, seconds. Default 300.
    #[arg(long, default_value_t = DEFAULT_WATCH_MAX_AGE_SECS)]
    pub watch_max_age_secs: u64,
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("default address constants parse")
}

impl Default for Config {
    fn default() -> Self {
        Self {
            grpc_addr: addr(DEFAULT_GRPC_ADDR),
            http_addr: addr(DEFAULT_HTTP_ADDR),
            public_url: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
            db: DEFAULT_DB.to_string(),
            key_encryption_key_file: None,
            previous_key_encryption_key_file: None,
            key_encryption_key: None,
            db_pool_connections: DEFAULT_DB_POOL_CONNECTIONS,
            grpc_max_connections: DEFAULT_GRPC_MAX_CONNECTIONS,
            grpc_max_concurrent_streams_per_connection:
                DEFAULT_GRPC_MAX_CONCURRENT_STREAMS_PER_CONNECTION,
            grpc_keepalive_interval_secs: DEFAULT_GRPC_KEEPALIVE_INTERVAL_SECS,
            grpc_keepalive_timeout_secs: DEFAULT_GRPC_KEEPALIVE_TIMEOUT_SECS,
            grpc_max_connection_age_secs: DEFAULT_GRPC_MAX_CONNECTION_AGE_SECS,
            grpc_handshake_timeout_secs: DEFAULT_GRPC_HANDSHAKE_TIMEOUT_SECS,
            grpc_max_message_bytes: DEFAULT_GRPC_MAX_MESSAGE_BYTES,
            enroll_rate_per_sec: DEFAULT_ENROLL_RATE_PER_SEC,
            enroll_burst: DEFAULT_ENROLL_BURST,
            refresh_rate_per_sec: DEFAULT_REFRESH_RATE_PER_SEC,
            refresh_burst: DEFAULT_REFRESH_BURST,
            enroll_max_retry_after_secs: DEFAULT_ENROLL_MAX_RETRY_AFTER_SECS,
            refresh_max_retry_after_secs: DEFAULT_REFRESH_MAX_RETRY_AFTER_SECS,
            lease_rate_per_sec: DEFAULT_LEASE_RATE_PER_SEC,
            lease_burst: DEFAULT_LEASE_BURST,
            unauth_rate_per_sec: DEFAULT_UNAUTH_RATE_PER_SEC,
            unauth_burst: DEFAULT_UNAUTH_BURST,
            auth_failures_per_source_per_min: DEFAULT_AUTH_FAILURES_PER_SOURCE_PER_MIN,
            failure_guard_max_sources: DEFAULT_FAILURE_GUARD_MAX_SOURCES,
            token_index_max_tokens: DEFAULT_TOKEN_INDEX_MAX_TOKENS,
            token_index_max_age_secs: DEFAULT_TOKEN_INDEX_MAX_AGE_SECS,
            source_table_max_sources: DEFAULT_SOURCE_TABLE_MAX_SOURCES,
            ipv6_source_prefix_len: DEFAULT_IPV6_SOURCE_PREFIX_LEN,
            credential_ttl_secs: DEFAULT_CREDENTIAL_TTL_SECS,
            clock_skew_secs: DEFAULT_CLOCK_SKEW_SECS,
            refresh_grace_secs: DEFAULT_REFRESH_GRACE_SECS,
            key_rotation_interval_secs: DEFAULT_KEY_ROTATION_INTERVAL_SECS,
            key_publish_ahead_secs: DEFAULT_KEY_PUBLISH_AHEAD_SECS,
            key_grace_secs: DEFAULT_KEY_GRACE_SECS,
            key_check_interval_secs: DEFAULT_KEY_CHECK_INTERVAL_SECS,
            node_retention_secs: DEFAULT_NODE_RETENTION_SECS,
            ephemeral_retention_secs: DEFAULT_EPHEMERAL_RETENTION_SECS,
            enrollment_retention_secs: DEFAULT_ENROLLMENT_RETENTION_SECS,
            used_token_retention_secs: DEFAULT_USED_TOKEN_RETENTION_SECS,
            admin_request_retention_secs: DEFAULT_ADMIN_REQUEST_RETENTION_SECS,
            lease_ttl_secs: DEFAULT_LEASE_TTL_SECS,
            reap_interval_secs: DEFAULT_REAP_INTERVAL_SECS,
            reap_batch_rows: DEFAULT_REAP_BATCH_ROWS,
            db_read_connections: DEFAULT_DB_READ_CONNECTIONS,
            db_max_inflight: DEFAULT_DB_MAX_INFLIGHT,
            db_wait_timeout_secs: DEFAULT_DB_WAIT_TIMEOUT_SECS,
            db_unready_after_secs: DEFAULT_DB_UNREADY_AFTER_SECS,
            directory_cache_ms: DEFAULT_DIRECTORY_CACHE_MS,
            shutdown_grace_secs: DEFAULT_SHUTDOWN_GRACE_SECS,
            pprof_addr: None,
            fault_end_task_after_ms: None,
            admin_token_file: None,
            admin_token: None,
            policy: None,
            policy_allow_all: false,
            policy_retention_secs: DEFAULT_POLICY_RETENTION_SECS,
            policy_check_interval_ms: DEFAULT_POLICY_CHECK_INTERVAL_MS,
            watch_max_streams: DEFAULT_WATCH_MAX_STREAMS,
            watch_max_age_secs: DEFAULT_WATCH_MAX_AGE_SECS,
        }
    }
}

impl Config {
    /// A config for tests and embedding: both listeners on 127.0.0.1 port 0,
    /// the database at `db_path`.
    pub fn ephemeral(db_path: &std::path::Path) -> Self {
        Self {
            grpc_addr: addr("127.0.0.1:0"),
            http_addr: addr("127.0.0.1:0"),
            db: format!("sqlite://{}", db_path.display()),
            ..Self::default()
        }
    }

    /// Every value that must be positive, with its flag.
    fn positive_values(&self) -> [(&'static str, u64); 33] {
        [
            ("--enroll-rate-per-sec", u64::from(self.enroll_rate_per_sec)),
            ("--enroll-burst", u64::from(self.enroll_burst)),
            (
                "--refresh-rate-per-sec",
                u64::from(self.refresh_rate_per_sec),
            ),
            ("--refresh-burst", u64::from(self.refresh_burst)),
            ("--lease-rate-per-sec", u64::from(self.lease_rate_per_sec)),
            ("--lease-burst", u64::from(self.lease_burst)),
            ("--unauth-rate-per-sec", u64::from(self.unauth_rate_per_sec)),
            ("--unauth-burst", u64::from(self.unauth_burst)),
            (
                "--auth-failures-per-source-per-min",
                u64::from(self.auth_failures_per_source_per_min),
            ),
            (
                "--source-table-max-sources",
                self.source_table_max_sources as u64,
            ),
            (
                "--enroll-max-retry-after-secs",
                self.enroll_max_retry_after_secs,
            ),
            (
                "--refresh-max-retry-after-secs",
                self.refresh_max_retry_after_secs,
            ),
            ("--credential-ttl-secs", self.credential_ttl_secs),
            (
                "--key-rotation-interval-secs",
                self.key_rotation_interval_secs,
            ),
            ("--lease-ttl-secs", self.lease_ttl_secs),
            ("--reap-interval-secs", self.reap_interval_secs),
            ("--policy-retention-secs", self.policy_retention_secs),
            (
                "--admin-request-retention-secs",
                self.admin_request_retention_secs,
            ),
            ("--policy-check-interval-ms", self.policy_check_interval_ms),
            ("--watch-max-streams", self.watch_max_streams as u64),
            ("--db-max-inflight", self.db_max_inflight as u64),
            ("--db-wait-timeout-secs", self.db_wait_timeout_secs),
            ("--db-read-connections", self.db_read_connections as u64),
            ("--db-pool-connections", self.db_pool_connections as u64),
            ("--reap-batch-rows", self.reap_batch_rows),
            ("--grpc-max-connections", self.grpc_max_connections as u64),
            (
                "--grpc-max-concurrent-streams-per-connection",
                self.grpc_max_concurrent_streams_per_connection as u64,
            ),
            (
                "--failure-guard-max-sources",
                self.failure_guard_max_sources as u64,
            ),
            ("--token-index-max-age-secs", self.token_index_max_age_secs),
            (
                "--grpc-keepalive-interval-secs",
                self.grpc_keepalive_interval_secs,
            ),
            (
                "--grpc-keepalive-timeout-secs",
                self.grpc_keepalive_timeout_secs,
            ),
            (
                "--grpc-handshake-timeout-secs",
                self.grpc_handshake_timeout_secs,
            ),
            (
                "--grpc-max-message-bytes",
                self.grpc_max_message_bytes as u64,
            ),
        ]
    }

    /// Checks values that cannot work together; the error says which flag.
    pub fn validate(&self) -> Result<(), String> {
        // Refresh accepts a credential up to skew + refresh grace after it
        // expires, so the key that signed it must verify at least that long
        // after it stopped signing.
        let need = self
            .credential_ttl_secs
            .saturating_add(self.clock_skew_secs)
            .saturating_add(self.refresh_grace_secs);
        if self.key_grace_secs < need {
            return Err(format!(
                "--key-grace-secs {} must be >= --credential-ttl-secs + --clock-skew-secs + \
                 --refresh-grace-secs ({need}), or a credential signed just before a rotation \
                 would stop verifying while Refresh should still accept it",
                self.key_grace_secs
            ));
        }
        if !(1..=60).contains(&self.key_check_interval_secs) {
            return Err("--key-check-interval-secs must be between 1 and 60".into());
        }
        if self.db_unready_after_secs > 3600 {
            return Err("--db-unready-after-secs must be at most 3600".into());
        }
        for (name, v) in self.positive_values() {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if !(1..=128).contains(&self.ipv6_source_prefix_len) {
            return Err("--ipv6-source-prefix-len must be between 1 and 128".into());
        }
        if self
            .admin_token
            .as_deref()
            .is_some_and(|t| t.trim().len() < MIN_ADMIN_TOKEN_LEN)
        {
            return Err(format!(
                "the admin token must be at least {MIN_ADMIN_TOKEN_LEN} characters"
            ));
        }
        if self.policy.is_some() && self.policy_allow_all {
            return Err("--policy and --policy-allow-all exclude each other: give one".into());
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("--tls-cert and --tls-key go together".into());
        }
        if self.tls_cert.is_none() && !self.insecure && !self.grpc_addr.ip().is_loopback() {
            return Err(format!(
                "refusing plaintext gRPC on non-loopback {}: give --tls-cert/--tls-key or --insecure",
                self.grpc_addr
            ));
        }
        crate::store::DbUrl::parse(&self.db)?;
        Ok(())
    }

    /// The store options: URL, connection counts and the key-encryption key
    /// (`key_encryption_key`, then `--key-encryption-key-file`, then
    /// `AGENTMESH_KEY_ENCRYPTION_KEY`, then, for SQLite, `<db>.kek`). Blocking (reads files).
    pub fn store_options(&self) -> Result<crate::store::OpenOptions, crate::store::StoreError> {
        use crate::store::{KEK_ENV, resolve_kek};
        let env = self
            .key_encryption_key
            .clone()
            .or_else(|| std::env::var(KEK_ENV).ok());
        let kek = match (&self.key_encryption_key, &self.key_encryption_key_file) {
            (Some(k), _) => resolve_kek(
                &self.db,
                None,
                Some(k),
                self.previous_key_encryption_key_file.as_deref(),
            )?,
            (None, file) => resolve_kek(
                &self.db,
                file.as_deref(),
                env.as_deref(),
                self.previous_key_encryption_key_file.as_deref(),
            )?,
        };
        Ok(crate::store::OpenOptions {
            url: self.db.clone(),
            read_connections: self.db_read_connections,
            pool_connections: self.db_pool_connections,
            kek,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn no_flags_is_the_default_config() {
        let cli = Cli::try_parse_from(["agentmesh-control-plane"]).expect("parses");
        assert_eq!(cli.config, Config::default());
        assert_eq!(Config::default().validate(), Ok(()));
    }

    #[test]
    fn incompatible_values_are_refused_with_the_flag_name() {
        let c = Config {
            key_grace_secs: 100,
            ..Config::default()
        };
        assert!(
            c.validate()
                .expect_err("short grace")
                .contains("--key-grace-secs")
        );
        let c = Config {
            grpc_addr: addr("0.0.0.0:7400"),
            ..Config::default()
        };
        assert!(c.validate().expect_err("plaintext").contains("--insecure"));
        let c = Config {
            grpc_addr: addr("0.0.0.0:7400"),
            insecure: true,
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
        let c = Config {
            db: "mysql://x".into(),
            ..Config::default()
        };
        assert!(
            c.validate()
                .expect_err("unknown scheme")
                .contains("postgres://")
        );
        let c = Config {
            db: "postgres://cp@127.0.0.1/cp".into(),
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn key_grace_must_cover_the_refresh_grace_too() {
        // TTL 3600 + skew 60 + refresh grace 300 = 3960.
        let c = Config {
            key_grace_secs: 3959,
            ..Config::default()
        };
        let e = c
            .validate()
            .expect_err("grace shorter than TTL + skew + refresh grace");
        assert!(
            e.contains("--refresh-grace-secs") && e.contains("3960"),
            "{e}"
        );
        // TTL + skew alone (the old rule) is no longer enough.
        let c = Config {
            key_grace_secs: 3660,
            ..Config::default()
        };
        assert!(c.validate().is_err());
        let c = Config {
            key_grace_secs: 3960,
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn grpc_connection_limits_are_positive() {
        for c in [
            Config {
                grpc_keepalive_interval_secs: 0,
                ..Config::default()
            },
            Config {
                grpc_keepalive_timeout_secs: 0,
                ..Config::default()
            },
            Config {
                grpc_handshake_timeout_secs: 0,
                ..Config::default()
            },
            Config {
                grpc_max_message_bytes: 0,
                ..Config::default()
            },
        ] {
            let e = c.validate().expect_err("zero refused");
            assert!(e.starts_with("--grpc-") && e.contains("positive"), "{e}");
        }
        let cli = Cli::try_parse_from([
            "agentmesh-control-plane",
            "--grpc-keepalive-interval-secs",
            "30",
            "--grpc-keepalive-timeout-secs",
            "5",
            "--grpc-handshake-timeout-secs",
            "3",
            "--grpc-max-message-bytes",
            "1024",
        ])
        .expect("parses");
        assert_eq!(
            (
                cli.config.grpc_keepalive_interval_secs,
                cli.config.grpc_keepalive_timeout_secs,
                cli.config.grpc_handshake_timeout_secs,
                cli.config.grpc_max_message_bytes
            ),
            (30, 5, 3, 1024)
        );
    }

    #[test]
    fn an_embedded_admin_token_needs_the_minimum_length() {
        let c = Config {
            admin_token: Some("  short-token   ".into()),
            ..Config::default()
        };
        assert!(c.validate().expect_err("short").contains("16 characters"));
        let c = Config {
            admin_token: Some("0123456789abcdef".into()),
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
    }
}
