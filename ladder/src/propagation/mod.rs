//! Policy propagation in the hold (`--policy-change-at`, `--revoke-token-at`,
//! local mode): what the ladder starts the control plane with, its flags,
//! and the record of each event. The event itself runs in `hold::policy`;
//! the workers' side (live calls, each member's policy changes) in
//! `worker::propagation`.
//!
//! **The change.** With `--policy-change-at` the control plane starts with
//! [`START_POLICY`] instead of allow-all: every member may provide every
//! service and call [`member::ECHO`](crate::member::ECHO), plus one extra
//! grant, of [`HELD_SERVICE`], which the providers also expose and on which
//! `--policy-live-calls` members hold a call open. At the event the ladder
//! applies [`CHANGED_POLICY`] (the same without that grant) over the admin
//! gRPC `ApplyPolicy`; every member must come to hold the new version and
//! every held call must be closed by its provider, while the fleet's echo
//! calls (still granted) go on.
//!
//! **The revocation.** With `--revoke-token-at` one step member in
//! `--revoke-token-every` enrolls with a token of its own; at the event the
//! ladder revokes that token (`RevokeToken`) while each of those members
//! holds an echo call open: every one must be dropped by its routers and
//! lose its call, and every other member must take up the revocation.
//!
//! **How time is measured.** The coordinator and the workers run on one
//! host, so both read the same wall clock: the coordinator notes the Unix
//! time (ms) just before it sends the admin call; each worker notes, for
//! each member, the Unix time at which the member's node took the change
//! (`NodeHandle::policy_changes` wakes it: the instant the member holds the
//! version it acknowledges to its router), at which a held call's stream
//! ended (seen by the caller), and at which a revoked member held no router
//! any more. Each is reported as the difference, per member.

pub mod config;
pub mod record;

pub use config::{PropagationConfig, PropagationWorkerConfig};
pub use record::{PropagationRecord, Quantiles};

/// The service the change removes the grant of: exposed by every provider
/// (on the same echo backend) only when `--policy-change-at` is given.
pub const HELD_SERVICE: &str = "echo-held";

/// The policy the control plane starts with under `--policy-change-at`.
pub const START_POLICY: &str = r#"# agentmesh-ladder --policy-change-at: the policy at start.
format = 1

[groups]
members = { role = "member" }

[[owners]]
services = ["*"]
groups = ["members"]

[[grants]]
from = ["members"]
to = ["echo"]

# The grant the change removes.
[[grants]]
from = ["members"]
to = ["echo-held"]

[[tests]]
from = {}
call = "echo-held"
expect = "allow"
"#;

/// [`START_POLICY`] without the grant of [`HELD_SERVICE`].
pub const CHANGED_POLICY: &str = r#"# agentmesh-ladder --policy-change-at: the policy applied at the event.
format = 1

[groups]
members = { role = "member" }

[[owners]]
services = ["*"]
groups = ["members"]

[[grants]]
from = ["members"]
to = ["echo"]

[[tests]]
from = {}
call = "echo-held"
expect = "deny"

[[tests]]
from = {}
call = "echo"
expect = "allow"
"#;

/// Unix time now, milliseconds: the clock the coordinator and the workers share.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
