//! Calls through the node, both ways: how hard an outbound call tries, how
//! many inbound calls are served and shared among callers, when a call is
//! cut for silence, and the splice that moves its bytes.

use std::time::Duration;

/// Default inbound call streams whose request is still being read, all
/// callers together (`--max-inbound-call-requests`).
pub const DEFAULT_MAX_INBOUND_CALL_REQUESTS: usize = 128;
/// Default deadline of a call stream's first byte, milliseconds
/// (`--call-first-byte-timeout-ms`).
pub const DEFAULT_CALL_FIRST_BYTE_TIMEOUT_MS: u64 = 2000;
/// Default `--call-idle-timeout-secs`: 15 min. A call that moves no byte
/// either way for this long is ended. Sized for what services do over a
/// call, not for attacks: a dead caller's calls end when its connection is
/// found dead (pings: about 2 × `--ping-interval-secs` +
/// `--ping-timeout-secs`), and under contention the token share takes
/// idle calls' slots first, so the deadline is only the backstop for a
/// caller that is alive and silent. It sits above the quiet periods of
/// common long-lived calls: long-polls (10 min, the longest blocking
/// query of common service registries, plus their jitter), and pooled
/// database connections, whose pools close idle ones themselves after
/// 10 min by default. A service quiet for longer (a watch without
/// heartbeats, an interactive shell) raises it, or sets 0 for none.
pub const DEFAULT_CALL_IDLE_TIMEOUT_SECS: u64 = 900;
/// Default buffer of each direction of a call's splice between its stream
/// and the local TCP connection (`--splice-buffer-kib`), KiB: tokio's own
/// default for `copy_bidirectional`.
pub const DEFAULT_SPLICE_BUFFER_KIB: usize = 8;

/// Calls: the attempts of an outbound call, the bounds and fair shares of
/// inbound ones (`crate::call`), the idle deadline and splice buffers of
/// every call, and the services its metrics name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallsConfig {
    /// Providers tried per call before giving up, within the call's budget
    /// (`--call-attempts`, default 3).
    pub attempts: usize,
    /// Inbound calls served at once, all callers (`--max-inbound-calls`,
    /// default 256). Shared by the callers' enrollment tokens (the
    /// credential's `token_id`; the caller's PeerId without one), binding
    /// only when all are taken: one token may use every slot while others
    /// leave them free; once all are taken, a caller whose token holds
    /// fewer than the heaviest token takes that token's least recently
    /// active call (ended, `agentmesh_node_calls_ended_total{reason="preempted"}`),
    /// and one whose token holds its share is refused
    /// (`agentmesh_node_calls_total{direction="inbound",result="token_share"}`).
    pub max_inbound: usize,
    /// Inbound calls served at once per caller PeerId
    /// (`--max-inbound-calls-per-caller`, default 32; refused as
    /// `too_many_calls`).
    pub max_inbound_per_caller: usize,
    /// Inbound call streams whose request is still being read, all callers
    /// together (`--max-inbound-call-requests`, default 128; 0 acts as 1).
    /// Held from the stream's arrival, shared by the caller's PeerId (the
    /// one its connection proved): a caller alone may hold all of them;
    /// when all are taken, a caller holding fewer than the heaviest takes
    /// that caller's oldest stream (closed, counted as `preempted`) and one
    /// holding its share is refused (`caller_share`), both in
    /// `agentmesh_node_calls_total{direction="inbound"}`. Calls in any phase
    /// are bounded by this plus `max_inbound` (more: `overflow`).
    pub max_inbound_requests: usize,
    /// A call stream that sends no byte within this is closed and counted
    /// as `silent` (`--call-first-byte-timeout-ms`, default 2000; at least
    /// 1). Callers write their request at once; the whole request still
    /// has `call_timeout_secs`.
    pub first_byte_timeout_ms: u64,
    /// A call (inbound, or spliced by `--forward` or the Unix socket) that
    /// moves no byte in either direction for this long is ended and its
    /// local TCP connection closed
    /// (`--call-idle-timeout-secs`, default [`DEFAULT_CALL_IDLE_TIMEOUT_SECS`],
    /// 900 s; zero: no idle deadline). Counted in
    /// `agentmesh_node_calls_ended_total{reason="idle_timeout"}`. Whatever
    /// this says, a call ends when the connection carrying it closes.
    pub idle_timeout: Duration,
    /// Buffer of each direction of a call's splice (`--forward` and
    /// `--expose`) between the call's stream and the local TCP
    /// connection, KiB; two per live call (`--splice-buffer-kib`, default
    /// [`DEFAULT_SPLICE_BUFFER_KIB`]; 0 acts as 1). Larger buffers mean
    /// fewer reads and writes per byte moved.
    pub splice_buffer_kib: usize,
    /// Services with a `service` label of their own in
    /// `agentmesh_node_call_duration_seconds`, the `--forward` ones first;
    /// the rest are counted as `other` (`--max-call-metric-services`,
    /// default [`crate::metrics::DEFAULT_MAX_CALL_METRIC_SERVICES`]). Bounds
    /// the series a member exports however many names are called.
    pub max_metric_services: usize,
}

impl Default for CallsConfig {
    fn default() -> Self {
        Self {
            attempts: 3,
            max_inbound: 256,
            max_inbound_per_caller: 32,
            max_inbound_requests: DEFAULT_MAX_INBOUND_CALL_REQUESTS,
            first_byte_timeout_ms: DEFAULT_CALL_FIRST_BYTE_TIMEOUT_MS,
            idle_timeout: Duration::from_secs(DEFAULT_CALL_IDLE_TIMEOUT_SECS),
            splice_buffer_kib: DEFAULT_SPLICE_BUFFER_KIB,
            max_metric_services: crate::metrics::DEFAULT_MAX_CALL_METRIC_SERVICES,
        }
    }
}

impl CallsConfig {
    /// The splice buffer per direction, bytes (at least 1 KiB).
    pub(crate) fn splice_buffer_bytes(&self) -> usize {
        self.splice_buffer_kib.clamp(1, 16 * 1024) * 1024
    }

    /// The idle deadline of a spliced call, `None` when off (zero).
    pub(crate) fn idle_deadline(&self) -> Option<Duration> {
        (!self.idle_timeout.is_zero()).then_some(self.idle_timeout)
    }

    /// The first-byte deadline of an inbound call stream, at least 1 ms.
    pub(crate) fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms.max(1))
    }
}
