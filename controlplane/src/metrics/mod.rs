//! The control plane's metrics (prefix `agentmesh_control_plane_`), with every
//! label value created at startup so rates read 0 instead of missing.
//! One group per subsystem (calls, request limits, storage, the gRPC
//! listener, policy and watch), each registering its own metrics; the
//! label values and label sets they share live here.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::store::{DELETE_REASONS, TABLES, Wait, WaitObserver};

mod connections;
mod limits;
mod policy;
mod rpc;
mod storage;

/// gRPC methods, as metric label values.
pub const METHODS: &[&str] = &[
    "Enroll",
    "Refresh",
    "GetKeys",
    "GetDirectory",
    "RouterLease",
    "CreateToken",
    "RevokeNode",
    "RotateKeyNow",
    "ApplyPolicy",
    "GetPolicy",
    "RevokeToken",
    "Watch",
    "ListTokens",
    "ListNodes",
];

/// Limiters, as metric label values: each budget (global, spent) and its
/// per-source share (`*_source_share`: the budget was contended and the
/// source used its share), the failure guard, the database queue and the
/// per-connection call bound. See [`crate::request_limits`].
pub const LIMITERS: &[&str] = &[
    "unauth",
    "unauth_source_share",
    "enroll",
    "enroll_source_share",
    "refresh",
    "refresh_source_share",
    "lease",
    "failure_guard",
    "db_busy",
    "db_conflict",
    "streams_per_connection",
    "watch_streams",
];

/// Results of a policy apply, as label values of `policy_applies_total{result}`.
pub const POLICY_APPLY_RESULTS: &[&str] = &["applied", "unchanged", "superseded", "refused"];

/// Why a Watch stream ended, as label values of `watch_ends_total{reason}`:
/// the replica is stopping and sent the router elsewhere, the stream
/// reached its `--watch-max-age-secs` age and was moved, the router's
/// credential expired, an event revoked the router, or the router (or its
/// connection) went away.
pub const WATCH_END_REASONS: &[&str] = &[
    "stopping",
    "max_age",
    "credential_expired",
    "revoked",
    "closed",
];

/// Per-source tables, as label values of `source_table_*{table}`.
pub const SOURCE_TABLES: &[&str] = &[
    "unauth",
    "enroll",
    "refresh",
    "failure_guard",
    "connections",
];

/// Limiters that spread refused callers over slots (see
/// [`crate::limiter::SpreadingBucket`]), as metric label values.
pub const SPREADING_LIMITERS: &[&str] = &["enroll", "refresh"];

/// Authentication failure reasons, as metric label values.
pub const AUTH_REASONS: &[&str] = &[
    "unknown_token",
    "token_expired",
    "token_used_up",
    "bad_proof",
    "old_proof",
    "bad_credential",
    "wrong_peer",
    "wrong_role",
    "labels_not_allowed",
    "revoked",
    "unknown_node",
    "admin_token",
    "token_revoked",
    "credential_expired",
    "credential_not_yet_valid",
];

/// Why a request was refused before its handler saw it (tonic could not
/// read it; see [`crate::malformed`]), as label values of
/// `malformed_requests_total{reason}`: its message did not decode (or was
/// missing), was larger than `--grpc-max-message-bytes`, or came in a
/// compression the server does not accept.
pub const MALFORMED_REASONS: &[&str] = &["undecodable", "too_large", "unsupported_encoding"];

/// Results of a token index load, as label values of
/// `token_index_loads_total{result}`.
pub const TOKEN_INDEX_LOAD_RESULTS: &[&str] = &["complete", "truncated"];

const CODES: &[tonic::Code] = &[
    tonic::Code::Ok,
    tonic::Code::Cancelled,
    tonic::Code::Unknown,
    tonic::Code::InvalidArgument,
    tonic::Code::DeadlineExceeded,
    tonic::Code::NotFound,
    tonic::Code::AlreadyExists,
    tonic::Code::PermissionDenied,
    tonic::Code::ResourceExhausted,
    tonic::Code::FailedPrecondition,
    tonic::Code::Aborted,
    tonic::Code::OutOfRange,
    tonic::Code::Unimplemented,
    tonic::Code::Internal,
    tonic::Code::Unavailable,
    tonic::Code::DataLoss,
    tonic::Code::Unauthenticated,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCode {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimiterLabel {
    limiter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthLabel {
    method: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodReason {
    method: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabel {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DutyLabel {
    duty: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableReason {
    table: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitLabel {
    wait: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn rpc_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn retry_after_histogram() -> Histogram {
    // 1 s .. 256 s: retry-after is whole seconds, capped by a flag.
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

/// Handles to every metric, in one group per subsystem; each group
/// registers its own metrics.
#[derive(Clone)]
pub struct Metrics {
    rpc: rpc::RpcMetrics,
    limits: limits::LimitMetrics,
    storage: storage::StorageMetrics,
    connections: connections::ConnectionMetrics,
    policy: policy::PolicyMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

impl Metrics {
    /// Registers every metric in `registry` (which should carry no prefix).
    pub fn new(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("agentmesh_control_plane");
        Self {
            rpc: rpc::RpcMetrics::register(r),
            limits: limits::LimitMetrics::register(r),
            storage: storage::StorageMetrics::register(r),
            connections: connections::ConnectionMetrics::register(r),
            policy: policy::PolicyMetrics::register(r),
        }
    }

    /// Records one finished RPC.
    pub fn rpc_done(&self, method: &'static str, code: tonic::Code, secs: f64) {
        self.rpc
            .rpc
            .get_or_create(&MethodCode {
                method: method.into(),
                code: code_name(code),
            })
            .inc();
        self.rpc
            .rpc_duration
            .get_or_create(&MethodLabel {
                method: method.into(),
            })
            .observe(secs);
    }

    /// Counts a request refused before its handler (`reason`: one of
    /// [`MALFORMED_REASONS`]).
    pub fn malformed(&self, method: &str, reason: &'static str) {
        self.rpc
            .malformed
            .get_or_create(&MethodReason {
                method: method.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records a token index load.
    pub fn token_index_loaded(&self, tokens: usize, complete: bool) {
        self.limits
            .token_index_tokens
            .set(i64::try_from(tokens).unwrap_or(i64::MAX));
        let result = if complete { "complete" } else { "truncated" };
        self.limits
            .token_index_loads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a limiter refusal.
    pub fn limited(&self, limiter: &'static str) {
        self.limits
            .limiter_refusals
            .get_or_create(&LimiterLabel {
                limiter: limiter.into(),
            })
            .inc();
    }

    /// Records the `retry-after` a spreading limiter gave a refused caller.
    pub fn retry_after(&self, limiter: &'static str, refusal: &crate::limiter::Refusal) {
        let label = LimiterLabel {
            limiter: limiter.into(),
        };
        let secs = crate::limiter::retry_after_secs(refusal.wait);
        self.limits
            .retry_after
            .get_or_create(&label)
            .observe(secs as f64);
        if refusal.capped {
            self.limits.retry_after_capped.get_or_create(&label).inc();
        }
    }

    /// Counts an authentication failure.
    pub fn auth_failed(&self, method: &'static str, reason: &'static str) {
        self.rpc
            .auth_failures
            .get_or_create(&AuthLabel {
                method: method.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// A watch stream opened (`+1`) or ended (`-1`).
    pub fn watchers_add(&self, d: i64) {
        self.policy.watchers.inc_by(d);
    }

    /// Counts one watch event sent.
    pub fn watch_event_sent(&self) {
        self.policy.watch_events.inc();
    }

    /// Counts a watch stream that ended, by why (one of [`WATCH_END_REASONS`]).
    pub fn watch_ended(&self, reason: &'static str) {
        self.policy
            .watch_ends
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a successful enrollment.
    pub fn enrolled(&self, re_enrolled: bool) {
        let result = if re_enrolled {
            "re_enrolled"
        } else {
            "enrolled"
        };
        self.rpc
            .enrollments
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Sets a table's row count.
    /// Sets the PostgreSQL pool gauges.
    pub fn set_pool(&self, pool: crate::store::PoolConnections) {
        for (state, n) in [("open", pool.open), ("idle", pool.idle), ("max", pool.max)] {
            self.storage
                .db_pool_connections
                .get_or_create(&StateLabel {
                    state: state.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the row count of a table.
    pub fn set_rows(&self, table: &str, rows: i64) {
        self.storage
            .storage_rows
            .get_or_create(&TableLabel {
                table: table.into(),
            })
            .set(rows);
    }

    /// Adds reaper deletions.
    pub fn deleted(&self, table: &str, reason: &str, n: u64) {
        self.storage
            .deleted
            .get_or_create(&TableReason {
                table: table.into(),
                reason: reason.into(),
            })
            .inc_by(n);
    }

    /// Counts one change notification from the database, by kind.
    pub fn change_notification(&self, kind: &str) {
        self.storage
            .change_notifications
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    /// Whether the change listener holds its LISTEN connection.
    pub fn set_change_listener_up(&self, up: bool) {
        self.storage.change_listener_up.set(i64::from(up));
    }

    /// The live replicas this one counted (its share is 1/N).
    pub fn set_live_replicas(&self, n: u32) {
        self.storage.live_replicas.set(i64::from(n));
    }

    /// Whether this replica holds `duty`'s lease (1) or not (0).
    pub fn set_duty_held(&self, duty: &str, held: bool) {
        self.storage
            .duty_held
            .get_or_create(&DutyLabel { duty: duty.into() })
            .set(i64::from(held));
    }

    /// Counts one reaper transaction.
    pub fn reap_batch(&self) {
        self.storage.reap_batches.inc();
    }

    /// Counts a database wait that ran out.
    pub fn db_wait_timeout(&self, wait: Wait) {
        self.storage
            .db_wait_timeouts
            .get_or_create(&WaitLabel {
                wait: wait.as_str().into(),
            })
            .inc();
    }

    /// A gRPC connection got a slot.
    pub fn grpc_connection_opened(&self) {
        self.connections.grpc_connections.inc();
    }

    /// A gRPC connection closed.
    pub fn grpc_connection_closed(&self) {
        self.connections.grpc_connections.dec();
    }

    /// A gRPC connection was closed at accept: the bound was reached.
    pub fn grpc_connection_refused(&self) {
        self.connections.grpc_connections_refused.inc();
    }

    /// Accepting a gRPC connection failed.
    pub fn grpc_accept_error(&self) {
        self.connections.grpc_accept_errors.inc();
    }

    /// A gRPC connection was closed: no call within the handshake timeout.
    pub fn grpc_handshake_timeout(&self) {
        self.connections.grpc_handshake_timeouts.inc();
    }

    /// A gRPC connection was closed: its slot went to a source holding fewer.
    pub fn grpc_connection_preempted(&self) {
        self.connections.grpc_connections_preempted.inc();
    }

    /// Sets a per-source table's numbers.
    pub fn set_source_table(&self, table: &str, stats: agentmesh_fair::MapStats) {
        let label = TableLabel {
            table: table.into(),
        };
        let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.limits
            .source_table_sources
            .get_or_create(&label)
            .set(g(stats.sources as u64));
        self.limits
            .source_table_aggregated
            .get_or_create(&label)
            .set(g(stats.aggregated_total));
        self.limits
            .source_table_overflowed
            .get_or_create(&label)
            .set(g(stats.overflowed_total));
    }

    /// Sets the version of the policy in force.
    pub fn set_policy_version(&self, version: u64) {
        self.policy
            .policy_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Counts a policy apply by its result (one of [`POLICY_APPLY_RESULTS`]).
    pub fn policy_applied(&self, result: &'static str) {
        self.policy
            .policy_applies
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the next rotation instant.
    pub fn set_next_rotation(&self, unix_secs: i64) {
        self.storage.next_rotation.set(unix_secs);
    }
}

impl WaitObserver for Metrics {
    fn wait_timed_out(&self, wait: Wait) {
        self.db_wait_timeout(wait);
    }
}
