//! Go-away (`/agentmesh/goaway/1`): the router tells members to move.
//!
//! - this module: the reasons, the alternatives a go-away names and the
//!   message itself;
//! - `sender`: opening one stream per member (GoAway out, GoAwayAck in) with
//!   a per-stream timeout and a bounded fan-out, counted by result;
//! - `overload`: the loop that trims above the high watermark.

pub(crate) mod overload;
pub(crate) mod sender;

use agentmesh_proto::pb::mesh::{Alternative, GoAway, GoAwayReason};

use crate::state::Shared;

/// Alternatives named in one go-away at most.
pub(crate) const MAX_ALTERNATIVES: usize = 8;

/// Why the router sends a member away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// The router is shutting down.
    Draining,
    /// The router is above its high watermark.
    Overloaded,
}

/// Every reason, to pre-create metric labels.
pub(crate) const REASONS: [Reason; 2] = [Reason::Draining, Reason::Overloaded];

/// Every result of sending one go-away (the `result` label):
/// `acked` (the member answered GoAwayAck), `timeout` (no ack within the
/// stream timeout), `unsupported` (the member does not speak the protocol),
/// `error` (the stream failed), `on_auth` (sent in place of an admission).
pub(crate) const RESULTS: [&str; 5] = ["acked", "timeout", "unsupported", "error", "on_auth"];

impl Reason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::Overloaded => "overloaded",
        }
    }

    fn wire(self) -> GoAwayReason {
        match self {
            Self::Draining => GoAwayReason::Draining,
            Self::Overloaded => GoAwayReason::Overloaded,
        }
    }
}

/// Routers to suggest instead of this one: from the last directory, not
/// draining, not this router, with addresses, and below their low watermark
/// (routers that reported no load yet are taken as empty); least loaded
/// first, at most [`MAX_ALTERNATIVES`].
pub(crate) fn alternatives(shared: &Shared) -> Vec<Alternative> {
    let dir = shared.directory.read();
    let mut alts: Vec<(f64, Alternative)> = dir
        .iter()
        .filter(|r| !r.draining && r.peer != shared.peer_id && !r.addrs.is_empty())
        .filter(|r| {
            r.load
                .as_ref()
                .is_none_or(|l| l.low_watermark == 0 || l.attached_members < l.low_watermark)
        })
        .map(|r| {
            let ratio = r.load.as_ref().map_or(0.0, |l| {
                f64::from(l.attached_members) / f64::from(l.high_watermark.max(1))
            });
            (
                ratio,
                Alternative {
                    peer_id: r.peer.to_bytes(),
                    addrs: r.addrs.iter().map(|a| a.to_string()).collect(),
                    load: r.load,
                },
            )
        })
        .collect();
    tracing::debug!(
        directory = dir.len(),
        candidates = alts.len(),
        "go-away alternatives"
    );
    alts.sort_by(|a, b| a.0.total_cmp(&b.0));
    alts.into_iter()
        .take(MAX_ALTERNATIVES)
        .map(|(_, a)| a)
        .collect()
}

/// Why an auth that verified did not end in an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAdmitted {
    /// The peer must go away instead (drain, high watermark).
    GoAway(Reason),
    /// The peer has no live connection any more: it left while its
    /// credential was being verified (a key fetch may take up to the stream
    /// timeout). Recording it would leave a ghost member counted against
    /// the watermark, the lease load and the drain until its credential
    /// expires, since the swarm already forgot the peer.
    Disconnected,
}

/// Admits `peer` unless it is no longer connected, or it is a new member
/// while the router drains or holds at least the high watermark of
/// members; then returns why not (and records nothing). Re-presentations
/// of an admitted member, transit peers and routers are always admitted
/// while connected. Checked and recorded under one lock, so concurrent
/// logins cannot overshoot.
pub(crate) fn admit_or_refuse(
    shared: &Shared,
    peer: libp2p::PeerId,
    admission: crate::admission::Admission,
) -> Result<(), NotAdmitted> {
    use crate::admission::Purpose;
    // Asked before the admission lock (the manager takes its own lock and
    // reads admissions without holding it). A peer that drops right after
    // is removed by the swarm loop (on its close, or its next sweep).
    if !shared.resources.is_connected(&peer) {
        return Err(NotAdmitted::Disconnected);
    }
    let mut table = shared.admission.write();
    let new_member = admission.purpose == Purpose::Attach
        && table
            .get(&peer)
            .is_none_or(|a| a.purpose != Purpose::Attach);
    if new_member {
        if shared.drain.is_requested() {
            return Err(NotAdmitted::GoAway(Reason::Draining));
        }
        if table.counts().attached >= shared.sizing.high_watermark {
            return Err(NotAdmitted::GoAway(Reason::Overloaded));
        }
    }
    table.admit(peer, admission);
    Ok(())
}

/// The go-away message for `reason`.
pub(crate) fn message(shared: &Shared, reason: Reason) -> GoAway {
    GoAway {
        reason: reason.wire() as i32,
        retry_after_secs: u32::try_from(shared.config.goaway_retry_after.as_secs())
            .unwrap_or(u32::MAX),
        alternatives: alternatives(shared),
    }
}

/// Warns when an explicit `--high-watermark` is more than the memory budget
/// holds even with every member idle (connection and ping streams only):
/// then the memory budget, not the watermark, decides when members are
/// refused (see docs/scalability.md). A sized watermark always fits.
pub(crate) fn check_watermarks(
    sizing: &crate::config::Sizing,
    budgets: &crate::resources::budget::Budgets,
) -> bool {
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

/// Counts one go-away by reason and result.
pub(crate) fn count(shared: &Shared, reason: Reason, result: &'static str) {
    shared
        .metrics
        .goaway_sent
        .get_or_create(&[("reason", reason.as_str()), ("result", result)])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_watermark_above_what_the_budget_holds_warns() {
        let budget = 768 << 20;
        let sized = crate::Config::default();
        let b = crate::resources::budgets(&sized, &sized.sizing(budget), budget);
        assert!(!check_watermarks(&sized.sizing(budget), &b), "sized fits");
        let explicit = crate::Config {
            high_watermark: Some(20_000),
            ..Default::default()
        };
        let s = explicit.sizing(budget);
        assert_eq!(s.members_that_fit, 10_922);
        assert!(
            check_watermarks(&s, &b),
            "20,000 idle members need more than 768 MiB"
        );
        let fits = crate::Config {
            high_watermark: Some(10_000),
            ..Default::default()
        };
        assert!(!check_watermarks(&fits.sizing(budget), &b));
    }
}
