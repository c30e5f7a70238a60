//! The control plane as the router sees it: the link (where, how it is
//! trusted, the enrollment token, the budgets of its calls, how often the
//! router leases) and the policy it distributes (held through `Watch`,
//! pushed on to the members).

use std::path::PathBuf;
use std::time::Duration;

/// Default control-plane URL (the `agentmesh-one` gRPC port on loopback),
/// shared with the other programs' `--control-plane`.
pub const DEFAULT_CONTROL_PLANE: &str = agentmesh_runtime::cli::DEFAULT_CONTROL_PLANE;
/// Default seconds between leases (and directory/key syncs).
pub const DEFAULT_LEASE_INTERVAL_SECS: u64 = 15;
/// Default allowed clock difference when checking credentials.
pub const DEFAULT_CLOCK_SKEW_SECS: u64 = 60;
/// Default total time budget of one control-plane call including retries.
pub const DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS: u64 = 30;
/// Default timeout of one control-plane RPC attempt.
pub const DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS: u64 = 10;
/// Default HTTP/2 keep-alive ping interval on the router's control-plane
/// connections while a call or the Watch is open, seconds: with the
/// timeout, a half-open connection (a replica's host gone, a dropped NAT
/// mapping) is noticed within 10 s and the watch moves to another replica.
pub const DEFAULT_CONTROL_PLANE_KEEPALIVE_INTERVAL_SECS: u64 = 5;
/// Default time a keep-alive ping may go unanswered before the connection
/// is closed, seconds.
pub const DEFAULT_CONTROL_PLANE_KEEPALIVE_TIMEOUT_SECS: u64 = 5;
// The promise: a half-open connection noticed within 10 s by default.
const _: () = assert!(
    DEFAULT_CONTROL_PLANE_KEEPALIVE_INTERVAL_SECS + DEFAULT_CONTROL_PLANE_KEEPALIVE_TIMEOUT_SECS
        <= 10
);
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
/// Default wait before a router probes the members that named it a
/// fallback, milliseconds: past the time their primaries need to push
/// 10,000 members, so the probes never compete with those pushes, and
/// short enough that a member whose primary died or withheld is current
/// within seconds more.
pub const DEFAULT_POLICY_PUSH_FALLBACK_DELAY_MS: u64 = 5_000;
/// Default cap on the backoff between control-plane Watch attempts,
/// milliseconds (the directory poll covers the gap).
pub const DEFAULT_POLICY_WATCH_BACKOFF_MAX_MS: u64 = 30_000;

/// The link to the control plane: where it is, how its TLS is trusted,
/// the token the router enrolls with, the budgets of each call, how often
/// the router leases and syncs, and the clock difference allowed on the
/// credentials it issues (`cp`, the client built at start, and every
/// credential check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneConfig {
    /// Control-plane gRPC URL. Default `http://127.0.0.1:7400`.
    pub url: String,
    /// PEM file of the CA that signs the control plane's TLS certificate. Default none.
    pub ca: Option<PathBuf>,
    /// The control plane's replicas to dial (`--control-plane-endpoint`,
    /// repeatable; empty: `url` alone). A call moves to the next one when
    /// the one it is on does not answer; `url` stays the logical name
    /// proofs are bound to and TLS verifies, so every replica serves the
    /// same `--public-url`.
    pub endpoints: Vec<String>,
    /// The router-role enrollment token (the command line reads `--token-file` into it). Default empty.
    pub token: String,
    /// Time budget of one control-plane call, retries included. Default 30 s.
    pub retry_budget: Duration,
    /// Timeout of one control-plane RPC attempt. Default 10 s.
    pub rpc_timeout: Duration,
    /// HTTP/2 keep-alive ping interval while a call or the Watch is open.
    /// Default 5 s.
    pub keepalive_interval: Duration,
    /// An unanswered keep-alive ping closes the connection after this.
    /// Default 5 s.
    pub keepalive_timeout: Duration,
    /// Time between leases, directory syncs and key syncs. Default 15 s.
    pub lease_interval: Duration,
    /// Allowed clock difference when checking credential validity. Default 60 s.
    pub clock_skew: Duration,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_CONTROL_PLANE.to_string(),
            ca: None,
            endpoints: Vec::new(),
            token: String::new(),
            retry_budget: Duration::from_secs(DEFAULT_CONTROL_PLANE_RETRY_BUDGET_SECS),
            rpc_timeout: Duration::from_secs(DEFAULT_CONTROL_PLANE_RPC_TIMEOUT_SECS),
            keepalive_interval: Duration::from_secs(DEFAULT_CONTROL_PLANE_KEEPALIVE_INTERVAL_SECS),
            keepalive_timeout: Duration::from_secs(DEFAULT_CONTROL_PLANE_KEEPALIVE_TIMEOUT_SECS),
            lease_interval: Duration::from_secs(DEFAULT_LEASE_INTERVAL_SECS),
            clock_skew: Duration::from_secs(DEFAULT_CLOCK_SKEW_SECS),
        }
    }
}

impl ControlPlaneConfig {
    /// [`ControlPlaneConfig::clock_skew`] in whole seconds, as credential
    /// checks take it.
    pub(crate) fn skew_secs(&self) -> i64 {
        i64::try_from(self.clock_skew.as_secs()).unwrap_or(i64::MAX)
    }

    /// Deadline of one lease attempt: a third of the lease interval (5 s
    /// by default), at most the rpc timeout. A lease sent to a replica
    /// that froze keeps its connection open and answers nothing; waiting
    /// the whole rpc timeout there (10 s) before the next replica would
    /// leave a lease sent 15 s after the last only 5 s of its 30 s TTL.
    pub fn lease_attempt_timeout(&self) -> Duration {
        (self.lease_interval / 3)
            .min(self.rpc_timeout)
            .max(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_attempt_ends_within_a_third_of_the_interval() {
        let c = ControlPlaneConfig::default();
        assert_eq!(c.lease_attempt_timeout(), Duration::from_secs(5));
        let slow = ControlPlaneConfig {
            lease_interval: Duration::from_secs(60),
            ..ControlPlaneConfig::default()
        };
        assert_eq!(
            slow.lease_attempt_timeout(),
            slow.rpc_timeout,
            "never above the rpc timeout"
        );
        let fast = ControlPlaneConfig {
            lease_interval: Duration::from_secs(1),
            ..ControlPlaneConfig::default()
        };
        assert_eq!(
            fast.lease_attempt_timeout(),
            Duration::from_secs(1),
            "at least a second"
        );
    }
}

/// How the policy reaches the router and goes on to its members: the
/// control plane's `Watch` (task `policy_watch`) and the push to attached
/// members (task `policy_push`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Policy push streams open at once (fan-out bound). Default 256.
    pub push_concurrency: usize,
    /// Deadline of one policy push to one member (open, write, ack).
    /// Default 5 s.
    pub push_deadline: Duration,
    /// How long after taking a new state the router probes the members
    /// that named it a fallback (`AuthRequest.policy_push_slot`), and
    /// pushes the policy to those that still lack it. Default 5 s.
    pub push_fallback_delay: Duration,
    /// Cap on the jittered backoff between control-plane Watch attempts
    /// (meanwhile the directory poll brings the policy). Default 30 s.
    pub watch_backoff_max: Duration,
    /// Whether to hold the control plane's Watch at all (else the
    /// directory poll alone brings policy, revocations and keys).
    pub watch: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            push_concurrency: DEFAULT_POLICY_PUSH_CONCURRENCY,
            push_deadline: Duration::from_millis(DEFAULT_POLICY_PUSH_DEADLINE_MS),
            push_fallback_delay: Duration::from_millis(DEFAULT_POLICY_PUSH_FALLBACK_DELAY_MS),
            watch_backoff_max: Duration::from_millis(DEFAULT_POLICY_WATCH_BACKOFF_MAX_MS),
            watch: true,
        }
    }
}
