//! The members' way in and out: admitting them (the auth protocol and its
//! bounds), how many the router holds (the watermarks trimming keeps it
//! between) and moving them away (a drain and the go-aways it and trimming
//! send).

use std::time::Duration;

/// Connections not admitted within this many seconds are closed.
pub const DEFAULT_AUTH_DEADLINE_SECS: u64 = 10;
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
/// Share of the memory budget that the default high watermark fills with
/// idle members, percent; the rest is headroom for what members do besides
/// idling (circuits and calls at 256 KiB per data stream, transit and
/// unauthenticated connections, control streams).
pub const DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT: u8 = 50;
/// Default grace between go-away OVERLOADED and closing a trimmed member, seconds.
pub const DEFAULT_TRIM_CLOSE_GRACE_SECS: u64 = 10;
/// Default time a drain may take before the router closes, seconds (below
/// the manifests' terminationGracePeriodSeconds).
pub const DEFAULT_DRAIN_GRACE_SECS: u64 = 30;
/// Default go-aways per second per surviving router in a drain or trim:
/// about half of what one router core admits on a quiet machine (≈ 450
/// attaches a second, docs/scalability.md), so survivors keep CPU for the
/// members they already hold; a drain of 5,000 members towards 2 survivors
/// then takes 12.5 s of the 30 s grace.
pub const DEFAULT_DRAIN_RATE_MEMBERS_PER_SEC: u32 = 200;
/// Default go-away streams open at once. A go-away is one small frame and an
/// ack; at 64 at once a router on a loaded 2-core machine sent ≈ 230 a
/// second and could not drain 6,930 members within the 30 s grace (10,000-
/// member ladder, ladder/RESULTS.md); 512 keeps a drain of the default
/// watermark inside the grace while staying a bound.
pub const DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS: usize = 512;
/// Default `retry_after` a go-away asks for, seconds.
pub const DEFAULT_GOAWAY_RETRY_AFTER_SECS: u64 = 300;

/// Admission: how long a connection has to be admitted, and the bounds of
/// the auth protocol's accept loop (slots, the queue in front of them, the
/// refused streams a stranger may open), so a flood of strangers cannot
/// hold what members need to attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthConfig {
    /// Connections not admitted within this time are closed. Default 10 s.
    pub deadline: Duration,
    /// An auth stream that sends no byte within this time is closed and
    /// counted as a failed login of its source (`silent`). Default 2 s.
    pub first_byte_timeout: Duration,
    /// Streams of our own protocols refused on one connection of a peer not
    /// admitted; the next refusal closes the connection and counts as a
    /// failed login of its source. Members, and connections this router
    /// dialed (a peer it chose), are never closed for this. 0: no limit.
    /// Default 32.
    pub stranger_refused_streams_max: u32,
    /// Auth streams served at once, shared fairly by source once all are
    /// taken (a source holding fewer takes the heaviest source's oldest);
    /// refusals are counted. Default 256.
    pub max_inflight_streams: usize,
    /// Auth streams refused a slot that may wait for one, shared fairly by
    /// source like the slots; 0 = none wait (refused streams are dropped).
    /// Default 1024.
    pub queue_max_streams: usize,
    /// Longest wait of an auth stream for a slot; then it is answered busy
    /// with `busy_retry_after`. Keep it below the members' auth
    /// deadline (their call timeout). Default 4 s.
    pub queue_wait: Duration,
    /// The retry-after of a busy answer. Default 2 s.
    pub busy_retry_after: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(DEFAULT_AUTH_DEADLINE_SECS),
            first_byte_timeout: Duration::from_millis(DEFAULT_AUTH_FIRST_BYTE_TIMEOUT_MS),
            stranger_refused_streams_max: DEFAULT_STRANGER_REFUSED_STREAMS_MAX,
            max_inflight_streams: DEFAULT_AUTH_MAX_INFLIGHT_STREAMS,
            queue_max_streams: DEFAULT_AUTH_QUEUE_MAX_STREAMS,
            queue_wait: Duration::from_millis(DEFAULT_AUTH_QUEUE_WAIT_MS),
            busy_retry_after: Duration::from_millis(DEFAULT_AUTH_BUSY_RETRY_AFTER_MS),
        }
    }
}

/// How many members the router holds: the watermarks (explicit, or sized
/// from the memory budget, see [`super::Config::sizing`]) above which it
/// answers new members with go-away and trims, and how long a trimmed
/// member keeps its connection (task `trim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatermarkConfig {
    /// Admitted members the router aims to hold: above it the router trims
    /// and answers new members with go-away. `None` = sized from the memory
    /// budget (see [`super::Config::sizing`]). Default none.
    pub high: Option<u32>,
    /// Share of the memory budget the default high watermark fills with idle
    /// members, percent (the rest is headroom for circuits, calls and
    /// transit). Ignored when `high` is set. Default 50.
    pub high_memory_percent: u8,
    /// Trimming sheds down to this many members; `None` = 15% below the high
    /// watermark. Default none.
    pub low: Option<u32>,
    /// A trimmed member's connection is closed this long after its go-away. Default 10 s.
    pub trim_close_grace: Duration,
}

impl Default for WatermarkConfig {
    fn default() -> Self {
        Self {
            high: None,
            high_memory_percent: DEFAULT_HIGH_WATERMARK_MEMORY_PERCENT,
            low: None,
            trim_close_grace: Duration::from_secs(DEFAULT_TRIM_CLOSE_GRACE_SECS),
        }
    }
}

/// Moving members away: how long a drain may take and who may ask for one
/// over HTTP, and the go-aways a drain or a trim sends (their pace, fan-out
/// and the stay-away they ask for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainConfig {
    /// A drain (last lease, go-away DRAINING, members moving) takes at most
    /// this long before the router closes; keep it below the pod's
    /// termination grace. Default 30 s.
    pub grace: Duration,
    /// Accept `POST /drain` on the metrics listener from any address, not
    /// only from loopback (where `kubectl port-forward` and a shell in the
    /// pod arrive). Off by default: whatever may scrape metrics could
    /// otherwise drain the router; turn it on only where the listener is
    /// protected some other way. Default false.
    pub http_allow_remote: bool,
    /// Go-aways a drain or trim sends per second per surviving router
    /// (paced in waves, see `goaway::pace`); 0 sends them all at once.
    /// Default 200.
    pub rate_members_per_sec: u32,
    /// Go-away streams open at once (fan-out bound). Default 512.
    pub goaway_max_concurrent_streams: usize,
    /// How long a go-away asks members to stay away. Default 300 s.
    pub goaway_retry_after: Duration,
}

impl Default for DrainConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(DEFAULT_DRAIN_GRACE_SECS),
            http_allow_remote: false,
            rate_members_per_sec: DEFAULT_DRAIN_RATE_MEMBERS_PER_SEC,
            goaway_max_concurrent_streams: DEFAULT_GOAWAY_MAX_CONCURRENT_STREAMS,
            goaway_retry_after: Duration::from_secs(DEFAULT_GOAWAY_RETRY_AFTER_SECS),
        }
    }
}
