//! Trimming at the high watermark: every second, if the high watermark of
//! members is reached (and the low one is below it), close unauthenticated
//! connections, send go-away OVERLOADED to the members [`plan::plan`] picks
//! in paced waves (the drain's pacing, [`crate::goaway::pace`]: every one
//! told within `trim_close_grace`), wait `trim_close_grace` more for them
//! to move (make-before-break on their side) and close whoever is still
//! here.
//! One trim at a time; none while draining (the drain sends everyone away).
//!
//! - this file: the loop;
//! - `plan`: which members to shed, and why (pure).

pub(crate) mod plan;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_streams::Control;
use libp2p::PeerId;
use tokio_util::sync::CancellationToken;

use crate::admission::AdmissionTable;
use crate::admission::Admissions;
use crate::config::{Sizing, WatermarkConfig};
use crate::directory::RouterSet;
use crate::drain::DrainState;
use crate::goaway::pace::{self, Pacer};
use crate::goaway::{GoAways, Reason};
use crate::metrics::Metrics;
use crate::swarm::Commands;
use plan::{Candidate, TrimReason};

/// How often the watermark is checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Pre-creates every reason of `agentmesh_router_trimmed_total`.
pub(crate) fn precreate_labels(metrics: &Metrics) {
    for reason in plan::REASONS {
        let _ = metrics
            .goaway
            .trimmed
            .get_or_create(&[("reason", reason.as_str())]);
    }
}

/// Admitted peers as trimming sees them (`me` is this router).
///
/// A member reports its other routers once, when it is admitted; one of
/// them may have died since (a router killed and not replaced). Only the
/// routers this router knows now (`live`: the directory's routers and the
/// routers admitted here, which a dead router leaves within its lease and
/// our directory poll) count, so a member whose other router is gone is
/// not shed ahead of the others as if it had somewhere to stay.
pub(crate) fn candidates(
    table: &AdmissionTable,
    me: PeerId,
    live: &HashSet<PeerId>,
) -> Vec<Candidate> {
    table
        .iter()
        .map(|(peer, a)| Candidate {
            peer: *peer,
            purpose: a.purpose,
            other_routers: a
                .attached_routers
                .iter()
                .filter(|r| **r != me && live.contains(*r))
                .count(),
        })
        .collect()
}

/// What the trim loop works with.
pub(crate) struct Trim {
    /// Trimming's own section: how long a trimmed member keeps its connection.
    pub(crate) config: WatermarkConfig,
    pub(crate) sizing: Sizing,
    pub(crate) me: PeerId,
    pub(crate) admissions: Admissions,
    /// The routers known now (see [`candidates`]).
    pub(crate) routers: RouterSet,
    pub(crate) drain: Arc<DrainState>,
    pub(crate) goaways: GoAways,
    pub(crate) metrics: Metrics,
    pub(crate) control: Control,
    pub(crate) commands: Commands,
}

/// Runs the trim loop until `cancel` fires.
pub(crate) async fn run(t: Trim, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if t.drain.is_requested() {
            continue;
        }
        let (high, low) = (t.sizing.high_watermark, t.sizing.low_watermark);
        let candidates = candidates(&t.admissions.read(), t.me, &t.routers.read());
        let plan = plan::plan(&candidates, high, low);
        if plan.is_empty() {
            continue;
        }
        let closed = t.commands.close_unauthenticated().await;
        let m = &t.metrics;
        m.goaway
            .trimmed
            .get_or_create(&[("reason", TrimReason::Unauthenticated.as_str())])
            .inc_by(closed as u64);
        for (_, reason) in &plan {
            m.goaway
                .trimmed
                .get_or_create(&[("reason", reason.as_str())])
                .inc();
        }
        tracing::warn!(
            high,
            low,
            members = plan.len(),
            unauthenticated = closed,
            "high watermark reached: trimming"
        );
        let peers: Vec<PeerId> = plan.into_iter().map(|(p, _)| p).collect();
        let pacer = Pacer {
            goaways: &t.goaways,
            control: &t.control,
            admissions: &t.admissions,
            reason: Reason::Overloaded,
        };
        let told_by = tokio::time::Instant::now() + t.config.trim_close_grace;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = pace::send_paced(pacer, peers.clone(), told_by) => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(t.config.trim_close_grace) => {}
        }
        // Whoever has not moved yet is closed now. The swarm loop drops the
        // admission and marks the connections closing in one step, so the
        // peer stops counting at once (the next check does not pick it
        // again) and is never counted as missing the auth deadline.
        t.commands.disconnect(peers).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Purpose;
    use crate::test_support::admission;

    /// The capacity case of the ladder: a router killed and left down is
    /// still in what its members reported on admission; trimming must not
    /// count it as somewhere they can stay.
    #[test]
    fn only_routers_known_now_count_as_somewhere_else_to_stay() {
        let (me, live, dead) = (PeerId::random(), PeerId::random(), PeerId::random());
        let (on_dead, on_live, on_both) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut table = AdmissionTable::default();
        for (peer, reported) in [
            (on_dead, vec![me, dead]),
            (on_live, vec![me, live]),
            (on_both, vec![dead, live]),
        ] {
            let mut a = admission(Purpose::Attach);
            a.attached_routers = reported;
            table.admit(peer, a);
        }
        let known: HashSet<PeerId> = [live, me].into();
        let mut got: Vec<(PeerId, usize)> = candidates(&table, me, &known)
            .into_iter()
            .map(|c| (c.peer, c.other_routers))
            .collect();
        got.sort();
        let mut want = vec![(on_dead, 0), (on_live, 1), (on_both, 1)];
        want.sort();
        assert_eq!(got, want);
        // The plan sheds the member whose only other router is dead last.
        let c = candidates(&table, me, &known);
        let order: Vec<PeerId> = plan::plan(&c, 3, 1).into_iter().map(|(p, _)| p).collect();
        assert_eq!(order.len(), 2);
        assert!(!order.contains(&on_dead), "{order:?}");
    }
}
