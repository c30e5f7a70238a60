//! The control plane's metrics (prefix `agentmesh_control_plane_`), with every
//! label value created at startup so rates read 0 instead of missing.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::store::{DELETE_REASONS, TABLES, Wait, WaitObserver};

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
];

/// Limiters, as metric label values: each budget (global, spent) and its
/// per-source share (`*_source_share`: the budget was contended and the
/// source used its share), the failure guard, the database queue and the
/// per-connection call bound. See [`crate::admission`].
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
pub const POLICY_APPLY_RESULTS: &[&str] = &["applied", "unchanged", "refused"];

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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn rpc_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn retry_after_histogram() -> Histogram {
    // 1 s .. 256 s: retry-after is whole seconds, capped by a flag.
    Histogram::new(exponential_buckets(1.0, 2.0, 9))
}

/// Handles to every metric.
#[derive(Clone)]
pub struct Metrics {
    rpc: Family<MethodCode, Counter>,
    rpc_duration: HistogramFamily<MethodLabel>,
    limiter_refusals: Family<LimiterLabel, Counter>,
    retry_after: HistogramFamily<LimiterLabel>,
    retry_after_capped: Family<LimiterLabel, Counter>,
    auth_failures: Family<AuthLabel, Counter>,
    storage_rows: Family<TableLabel, Gauge>,
    deleted: Family<TableReason, Counter>,
    reap_batches: Counter,
    db_wait_timeouts: Family<WaitLabel, Counter>,
    enrollments: Family<ResultLabel, Counter>,
    next_rotation: Gauge,
    db_pool_connections: Family<StateLabel, Gauge>,
    grpc_connections: Gauge,
    grpc_connections_refused: Counter,
    grpc_accept_errors: Counter,
    grpc_handshake_timeouts: Counter,
    grpc_connections_preempted: Counter,
    source_table_sources: Family<TableLabel, Gauge>,
    source_table_aggregated: Family<TableLabel, Gauge>,
    source_table_overflowed: Family<TableLabel, Gauge>,
    policy_version: Gauge,
    policy_applies: Family<ResultLabel, Counter>,
    watchers: Gauge,
    watch_events: Counter,
    malformed: Family<MethodReason, Counter>,
    token_index_tokens: Gauge,
    token_index_loads: Family<ResultLabel, Counter>,
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
        let m = Self {
            rpc: Family::default(),
            rpc_duration: Family::new_with_constructor(rpc_histogram),
            limiter_refusals: Family::default(),
            retry_after: Family::new_with_constructor(retry_after_histogram),
            retry_after_capped: Family::default(),
            auth_failures: Family::default(),
            storage_rows: Family::default(),
            deleted: Family::default(),
            reap_batches: Counter::default(),
            db_wait_timeouts: Family::default(),
            enrollments: Family::default(),
            next_rotation: Gauge::default(),
            db_pool_connections: Family::default(),
            grpc_connections: Gauge::default(),
            grpc_connections_refused: Counter::default(),
            grpc_accept_errors: Counter::default(),
            grpc_handshake_timeouts: Counter::default(),
            grpc_connections_preempted: Counter::default(),
            source_table_sources: Family::default(),
            source_table_aggregated: Family::default(),
            source_table_overflowed: Family::default(),
            policy_version: Gauge::default(),
            policy_applies: Family::default(),
            watchers: Gauge::default(),
            watch_events: Counter::default(),
            malformed: Family::default(),
            token_index_tokens: Gauge::default(),
            token_index_loads: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("agentmesh_control_plane");
        r.register("rpc", "gRPC calls by method and status code", m.rpc.clone());
        r.register(
            "rpc_duration_seconds",
            "gRPC call latency by method",
            m.rpc_duration.clone(),
        );
        r.register(
            "limiter_refusals",
            "Requests refused by a limit: a budget spent (unauth, enroll, refresh, lease), \
             a source over its share of a contended budget (*_source_share), the failure \
             guard, the database queue (db_busy), streams_per_connection, watch_streams \
             (--watch-max-streams watchers already open)",
            m.limiter_refusals.clone(),
        );
        r.register(
            "retry_after_seconds",
            "retry-after given to callers refused by the enroll and refresh limiters: \
             the wait until the slot the virtual queue assigned them",
            m.retry_after.clone(),
        );
        r.register(
            "retry_after_capped",
            "Refused callers told the cap (--enroll/--refresh-max-retry-after-secs) \
             because the virtual queue reached it",
            m.retry_after_capped.clone(),
        );
        r.register(
            "auth_failures",
            "Requests refused for authentication or authorization, by reason",
            m.auth_failures.clone(),
        );
        r.register(
            "storage_rows",
            "Rows per table (COUNT per table at each reaper pass)",
            m.storage_rows.clone(),
        );
        r.register(
            "deleted",
            "Rows deleted by the reapers, by table and reason",
            m.deleted.clone(),
        );
        r.register(
            "reap_batches",
            "Reaper transactions, each deleting at most --reap-batch-rows rows",
            m.reap_batches.clone(),
        );
        r.register(
            "db_wait_timeouts",
            "Database operations refused because a wait passed --db-wait-timeout-secs: \
             for a slot (--db-max-inflight), the writer connection, a read connection \
             (--db-read-connections) or the file lock (another connection or process)",
            m.db_wait_timeouts.clone(),
        );
        r.register(
            "enrollments",
            "Successful enrollments: enrolled (a token use spent) or re_enrolled (none spent)",
            m.enrollments.clone(),
        );
        r.register(
            "next_key_rotation_timestamp_seconds",
            "Unix time of the next signing-key rotation (stored in the database)",
            m.next_rotation.clone(),
        );
        r.register(
            "db_pool_connections",
            "PostgreSQL pool connections: open, idle, max (--db-pool-connections); 0 on SQLite",
            m.db_pool_connections.clone(),
        );
        r.register(
            "grpc_connections",
            "Open gRPC connections (bounded by --grpc-max-connections)",
            m.grpc_connections.clone(),
        );
        r.register(
            "grpc_connections_refused",
            "gRPC connections closed at accept: --grpc-max-connections were open and this \
             source already held its share",
            m.grpc_connections_refused.clone(),
        );
        r.register(
            "grpc_connections_preempted",
            "gRPC connections closed because all --grpc-max-connections were open and a \
             source holding fewer took the busiest source's oldest",
            m.grpc_connections_preempted.clone(),
        );
        r.register(
            "source_table_sources",
            "Sources in a per-source table (bounded by --source-table-max-sources, \
             --failure-guard-max-sources)",
            m.source_table_sources.clone(),
        );
        r.register(
            "source_table_aggregated",
            "Sources a per-source table keyed at a wider prefix than the finest because it \
             was filling, since start",
            m.source_table_aggregated.clone(),
        );
        r.register(
            "source_table_overflowed",
            "Times a full per-source table put new sources into its one shared overflow \
             source, since start",
            m.source_table_overflowed.clone(),
        );
        r.register(
            "grpc_accept_errors",
            "gRPC accept errors (e.g. out of file descriptors); the listener keeps serving",
            m.grpc_accept_errors.clone(),
        );
        r.register(
            "grpc_handshake_timeouts",
            "gRPC connections closed because no call arrived within \
             --grpc-handshake-timeout-secs of accept (TLS handshake, HTTP/2 preface, first call)",
            m.grpc_handshake_timeouts.clone(),
        );
        r.register(
            "policy_version",
            "Version of the policy in force (0: none applied, every call denied)",
            m.policy_version.clone(),
        );
        r.register(
            "policy_applies",
            "Policy applies by result: applied (a new version), unchanged (the text in force), \
             refused (did not pass its checks; nothing applied)",
            m.policy_applies.clone(),
        );
        r.register(
            "watchers",
            "Watch streams open (routers holding the push of policy, revocations and keys)",
            m.watchers.clone(),
        );
        r.register(
            "watch_events",
            "Watch events sent, over every stream (the first full event of each stream included)",
            m.watch_events.clone(),
        );
        r.register(
            "malformed_requests",
            "Requests refused before their handler because tonic could not read them, by \
             method and reason (undecodable: answered INVALID_ARGUMENT; too_large: \
             OUT_OF_RANGE; unsupported_encoding: UNIMPLEMENTED); each is a failure of its \
             source for the failure guard and spends its unauthenticated share",
            m.malformed.clone(),
        );
        r.register(
            "token_index_tokens",
            "Live enrollment token digests the failure guard's token index holds (loaded \
             only while a source over its failures enrolls)",
            m.token_index_tokens.clone(),
        );
        r.register(
            "token_index_loads",
            "Token index loads from the database: complete, or truncated at \
             --token-index-max-tokens (the index then cannot refuse a token)",
            m.token_index_loads.clone(),
        );
        for method in METHODS {
            for reason in MALFORMED_REASONS {
                let _ = m.malformed.get_or_create(&MethodReason {
                    method: (*method).into(),
                    reason: (*reason).into(),
                });
            }
            for code in CODES {
                let _ = m.rpc.get_or_create(&MethodCode {
                    method: (*method).into(),
                    code: code_name(*code),
                });
            }
            let _ = m.rpc_duration.get_or_create(&MethodLabel {
                method: (*method).into(),
            });
            for reason in AUTH_REASONS {
                let _ = m.auth_failures.get_or_create(&AuthLabel {
                    method: (*method).into(),
                    reason: (*reason).into(),
                });
            }
        }
        for l in LIMITERS {
            let _ = m.limiter_refusals.get_or_create(&LimiterLabel {
                limiter: (*l).into(),
            });
        }
        for t in SOURCE_TABLES {
            let label = TableLabel { table: (*t).into() };
            let _ = m.source_table_sources.get_or_create(&label);
            let _ = m.source_table_aggregated.get_or_create(&label);
            let _ = m.source_table_overflowed.get_or_create(&label);
        }
        for l in SPREADING_LIMITERS {
            let label = LimiterLabel {
                limiter: (*l).into(),
            };
            let _ = m.retry_after.get_or_create(&label);
            let _ = m.retry_after_capped.get_or_create(&label);
        }
        for t in TABLES {
            let _ = m
                .storage_rows
                .get_or_create(&TableLabel { table: (*t).into() });
        }
        for (t, reason) in DELETE_REASONS {
            let _ = m.deleted.get_or_create(&TableReason {
                table: (*t).into(),
                reason: (*reason).into(),
            });
        }
        for w in Wait::ALL {
            let _ = m.db_wait_timeouts.get_or_create(&WaitLabel {
                wait: w.as_str().into(),
            });
        }
        for state in ["open", "idle", "max"] {
            let _ = m.db_pool_connections.get_or_create(&StateLabel {
                state: state.into(),
            });
        }
        for r in POLICY_APPLY_RESULTS.iter().copied() {
            let _ = m
                .policy_applies
                .get_or_create(&ResultLabel { result: r.into() });
        }
        for r in TOKEN_INDEX_LOAD_RESULTS {
            let _ = m.token_index_loads.get_or_create(&ResultLabel {
                result: (*r).into(),
            });
        }
        for r in ["enrolled", "re_enrolled"] {
            let _ = m
                .enrollments
                .get_or_create(&ResultLabel { result: r.into() });
        }
        m
    }

    /// Records one finished RPC.
    pub fn rpc_done(&self, method: &'static str, code: tonic::Code, secs: f64) {
        self.rpc
            .get_or_create(&MethodCode {
                method: method.into(),
                code: code_name(code),
            })
            .inc();
        self.rpc_duration
            .get_or_create(&MethodLabel {
                method: method.into(),
            })
            .observe(secs);
    }

    /// Counts a request refused before its handler (`reason`: one of
    /// [`MALFORMED_REASONS`]).
    pub fn malformed(&self, method: &str, reason: &'static str) {
        self.malformed
            .get_or_create(&MethodReason {
                method: method.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records a token index load.
    pub fn token_index_loaded(&self, tokens: usize, complete: bool) {
        self.token_index_tokens
            .set(i64::try_from(tokens).unwrap_or(i64::MAX));
        let result = if complete { "complete" } else { "truncated" };
        self.token_index_loads
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts a limiter refusal.
    pub fn limited(&self, limiter: &'static str) {
        self.limiter_refusals
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
        self.retry_after.get_or_create(&label).observe(secs as f64);
        if refusal.capped {
            self.retry_after_capped.get_or_create(&label).inc();
        }
    }

    /// Counts an authentication failure.
    pub fn auth_failed(&self, method: &'static str, reason: &'static str) {
        self.auth_failures
            .get_or_create(&AuthLabel {
                method: method.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// A watch stream opened (`+1`) or ended (`-1`).
    pub fn watchers_add(&self, d: i64) {
        self.watchers.inc_by(d);
    }

    /// Counts one watch event sent.
    pub fn watch_event_sent(&self) {
        self.watch_events.inc();
    }

    /// Counts a successful enrollment.
    pub fn enrolled(&self, re_enrolled: bool) {
        let result = if re_enrolled {
            "re_enrolled"
        } else {
            "enrolled"
        };
        self.enrollments
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Sets a table's row count.
    /// Sets the PostgreSQL pool gauges.
    pub fn set_pool(&self, pool: crate::store::PoolConnections) {
        for (state, n) in [("open", pool.open), ("idle", pool.idle), ("max", pool.max)] {
            self.db_pool_connections
                .get_or_create(&StateLabel {
                    state: state.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the row count of a table.
    pub fn set_rows(&self, table: &str, rows: i64) {
        self.storage_rows
            .get_or_create(&TableLabel {
                table: table.into(),
            })
            .set(rows);
    }

    /// Adds reaper deletions.
    pub fn deleted(&self, table: &str, reason: &str, n: u64) {
        self.deleted
            .get_or_create(&TableReason {
                table: table.into(),
                reason: reason.into(),
            })
            .inc_by(n);
    }

    /// Counts one reaper transaction.
    pub fn reap_batch(&self) {
        self.reap_batches.inc();
    }

    /// Counts a database wait that ran out.
    pub fn db_wait_timeout(&self, wait: Wait) {
        self.db_wait_timeouts
            .get_or_create(&WaitLabel {
                wait: wait.as_str().into(),
            })
            .inc();
    }

    /// A gRPC connection got a slot.
    pub fn grpc_connection_opened(&self) {
        self.grpc_connections.inc();
    }

    /// A gRPC connection closed.
    pub fn grpc_connection_closed(&self) {
        self.grpc_connections.dec();
    }

    /// A gRPC connection was closed at accept: the bound was reached.
    pub fn grpc_connection_refused(&self) {
        self.grpc_connections_refused.inc();
    }

    /// Accepting a gRPC connection failed.
    pub fn grpc_accept_error(&self) {
        self.grpc_accept_errors.inc();
    }

    /// A gRPC connection was closed: no call within the handshake timeout.
    pub fn grpc_handshake_timeout(&self) {
        self.grpc_handshake_timeouts.inc();
    }

    /// A gRPC connection was closed: its slot went to a source holding fewer.
    pub fn grpc_connection_preempted(&self) {
        self.grpc_connections_preempted.inc();
    }

    /// Sets a per-source table's numbers.
    pub fn set_source_table(&self, table: &str, stats: agentmesh_fair::MapStats) {
        let label = TableLabel {
            table: table.into(),
        };
        let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.source_table_sources
            .get_or_create(&label)
            .set(g(stats.sources as u64));
        self.source_table_aggregated
            .get_or_create(&label)
            .set(g(stats.aggregated_total));
        self.source_table_overflowed
            .get_or_create(&label)
            .set(g(stats.overflowed_total));
    }

    /// Sets the version of the policy in force.
    pub fn set_policy_version(&self, version: u64) {
        self.policy_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// Counts a policy apply by its result (one of [`POLICY_APPLY_RESULTS`]).
    pub fn policy_applied(&self, result: &'static str) {
        self.policy_applies
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the next rotation instant.
    pub fn set_next_rotation(&self, unix_secs: i64) {
        self.next_rotation.set(unix_secs);
    }
}

impl WaitObserver for Metrics {
    fn wait_timed_out(&self, wait: Wait) {
        self.db_wait_timeout(wait);
    }
}
