//! Pushing the held state (policy + revocations) to every attached member
//! over `/agentmesh/policy/1` when it changes: one short stream each (no
//! stream held open per member, so a member costs nothing between
//! pushes), at most `--policy-push-concurrency` at once, each within
//! `--policy-push-deadline-ms`.
//!
//! **One router pushes each member, not K.** A member names one of its
//! routers its primary and the others fallbacks (`AuthRequest.policy_push_slot`):
//! - a primary, and a member that names nothing (one that predates the
//!   field), is pushed the whole state at once;
//! - a fallback is **probed** `--policy-push-fallback-delay-ms` after the
//!   router took the state: a push without the policy (the signed
//!   revocation list only, which it takes if newer), answered with the
//!   version it holds. Only if that is older than the router's does the
//!   router push the policy on a second stream (`fallback`): the primary
//!   died, withheld it, or is stale;
//! - a member whose admission answer already carried this state (it
//!   attached after the change) is skipped.
//!
//! So in the normal case a member receives each version's body once, and
//! the fallbacks' probes come after the primaries' pushes instead of
//! competing with them. A member that lies hurts only itself (fallback
//! everywhere: it waits for the probes) or costs its routers what an old
//! member costs (primary everywhere); routers enforce the policy on what
//! they relay whatever the member holds. Each decision is counted in
//! `agentmesh_router_policy_push_decisions_total{decision}`.
//!
//! Unlike go-away (`crate::goaway::pace`), a push makes no member move,
//! so there is no re-attach storm to pace against: the fan-out bound is
//! the pace. A newer state arriving mid-round supersedes the pushes not
//! yet started (counted `dropped`) and the probes not yet due; the next
//! round pushes the newer state to everyone.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush};
use agentmesh_streams::Control;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::policy::{self as wire, PolicyPushError};
use futures::StreamExt as _;
use libp2p::PeerId;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::state::{Generation, PolicyState};
use crate::admission::{Admissions, Purpose, PushSlot};
use crate::policy_metrics::PolicyMetrics;

/// What pushing needs.
#[derive(Clone)]
pub(crate) struct Push {
    pub(crate) state: Arc<PolicyState>,
    pub(crate) admissions: Admissions,
    /// The router's trust: members it lists as revoked are not pushed.
    pub(crate) link: Arc<crate::cp::Link>,
    pub(crate) control: Control,
    pub(crate) concurrency: usize,
    pub(crate) deadline: Duration,
    /// When the fallbacks are probed, after the router took the state.
    pub(crate) fallback_delay: Duration,
}

/// How one push ended (the `outcome` label, see `crate::policy_metrics::PUSH_OUTCOMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acked,
    Ignored,
    Failed,
    Timeout,
    Dropped,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Acked => "acked",
            Self::Ignored => "ignored",
            Self::Failed => "failed",
            Self::Timeout => "timeout",
            Self::Dropped => "dropped",
        }
    }
}

/// What a member's answer says, against the `(epoch, version)` pushed
/// (`(0, 0)`: no policy, only revocations): acked when it took (or held)
/// both the policy and the revocation list. Pure.
pub(crate) fn judge(answer: Result<PolicyAck, PolicyPushError>, pushed: (u64, u64)) -> Outcome {
    match answer {
        Ok(ack) if !ack.revocations_ignored.is_empty() => Outcome::Ignored,
        Ok(ack) if ack.ignored.is_empty() && (ack.epoch, ack.version) == pushed => Outcome::Acked,
        // A member that holds no policy acks revocations with (0, 0).
        Ok(ack) if ack.ignored.is_empty() && pushed == (0, 0) => Outcome::Acked,
        Ok(_) => Outcome::Ignored,
        Err(e) if e.is_timeout() => Outcome::Timeout,
        Err(_) => Outcome::Failed,
    }
}

/// Whether a probe's ack says the member already holds what the router
/// holds (`held`): the same epoch and at least the version. A router with
/// no policy has nothing more to send. Pure.
pub(crate) fn probe_says_held(ack: &PolicyAck, held: (u64, u64)) -> bool {
    held == (0, 0) || (ack.epoch == held.0 && ack.version >= held.1)
}

/// Who a round pushes at once, who it probes later, and how many it skips
/// (their admission answer carried generation `g`). Pure.
fn split<'a>(
    members: impl Iterator<Item = (&'a PeerId, PushSlot, Option<u64>)>,
    g: u64,
) -> (Vec<PeerId>, Vec<PeerId>, u64) {
    let (mut now, mut later, mut skipped) = (Vec::new(), Vec::new(), 0);
    for (peer, slot, holds) in members {
        if holds == Some(g) {
            skipped += 1;
        } else if slot == PushSlot::Fallback {
            later.push(*peer);
        } else {
            now.push(*peer);
        }
    }
    (now, later, skipped)
}

/// Pushes every new state until `cancel` fires.
pub(crate) async fn run(push: Push, cancel: CancellationToken) {
    let mut generations = push.state.generations();
    generations.mark_unchanged();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = generations.changed() => if changed.is_err() { return },
        }
        let g = *generations.borrow_and_update();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = round(&push, g, &generations) => {}
        }
    }
}

/// The attached members as `split` reads them, less those the held
/// revocations name: the swarm loop's next sweep drops them, and a push
/// to a member being dropped only holds one of the round's
/// `--policy-push-concurrency` places until its connection goes.
pub(crate) fn attached(
    link: &crate::cp::Link,
    admissions: &Admissions,
    g: u64,
) -> (Vec<PeerId>, Vec<PeerId>, u64) {
    // The trust first, then the table: the sweep's order.
    let trust = link.trust.read();
    let now = agentmesh_proto::unix_now();
    let admissions = admissions.read();
    split(
        admissions
            .iter()
            .filter(|(_, a)| a.purpose == Purpose::Attach)
            .filter(|(p, a)| !crate::admission::is_revoked(p, a, &trust, now))
            .map(|(p, a)| (p, a.push.slot, a.push.holds_generation)),
        g,
    )
}

/// One round: the state of generation `g` to every attached member, the
/// primaries at once and the fallbacks probed after the delay.
async fn round(push: &Push, g: Generation, generations: &watch::Receiver<Generation>) {
    let msg = Arc::new(push.state.push_message());
    let held = push.state.version();
    let (now, _, skipped) = attached(&push.link, &push.admissions, g.number);
    tracing::info!(
        members = now.len(),
        skipped,
        epoch = held.0,
        version = held.1,
        "pushing policy"
    );
    let metrics = push.state.metrics().clone();
    metrics.decision("skipped").inc_by(skipped);
    // Both halves share the fan-out bound.
    let permits = Arc::new(Semaphore::new(push.concurrency.max(1)));
    let round = Round {
        push,
        g,
        msg,
        held,
        metrics,
        permits,
        superseded: generations.clone(),
    };
    let primaries = futures::stream::iter(now)
        .map(|peer| round.primary(peer))
        .buffer_unordered(push.concurrency.max(1))
        .collect::<()>();
    tokio::join!(primaries, round.fallbacks());
}

/// What one round's pushes share.
struct Round<'a> {
    push: &'a Push,
    g: Generation,
    msg: Arc<PolicyPush>,
    held: (u64, u64),
    metrics: PolicyMetrics,
    permits: Arc<Semaphore>,
    superseded: watch::Receiver<Generation>,
}

impl Round<'_> {
    /// The whole state to one member (a primary, an old member, or a
    /// fallback whose probe said it lacks the version), counted by
    /// outcome (`Dropped` when superseded before it ran).
    async fn full(&self, peer: PeerId) -> Outcome {
        let Ok(_permit) = self.permits.acquire().await else {
            return Outcome::Dropped;
        };
        let outcome = if self.superseded.has_changed().unwrap_or(true) {
            Outcome::Dropped
        } else {
            self.metrics.push_in_flight.inc();
            let answer = wire::push(
                self.push.control.clone(),
                peer,
                &self.msg,
                self.push.deadline,
            )
            .await;
            self.metrics.push_in_flight.dec();
            judge(answer, self.held)
        };
        if outcome == Outcome::Acked {
            self.metrics
                .push_lag
                .observe(self.g.taken_at.elapsed().as_secs_f64());
        }
        if matches!(outcome, Outcome::Ignored | Outcome::Failed) {
            tracing::debug!(%peer, outcome = outcome.as_str(), "policy push not taken");
        }
        self.metrics
            .push
            .get_or_create(&[("outcome", outcome.as_str())])
            .inc();
        outcome
    }

    async fn primary(&self, peer: PeerId) {
        if self.full(peer).await != Outcome::Dropped {
            self.metrics.decision("pushed").inc();
        }
    }

    /// After the delay (unless a newer state came first), every member
    /// that names this router a fallback and does not hold `g` yet.
    async fn fallbacks(&self) {
        let mut superseded = self.superseded.clone();
        let due = self.g.taken_at + self.push.fallback_delay;
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            // A newer state (or the sender gone): its round probes instead.
            _ = superseded.changed() => return,
        }
        let (_, later, _) = attached(&self.push.link, &self.push.admissions, self.g.number);
        if later.is_empty() {
            return;
        }
        tracing::info!(members = later.len(), "probing fallback members");
        futures::stream::iter(later)
            .map(|peer| self.fallback(peer))
            .buffer_unordered(self.push.concurrency.max(1))
            .collect::<()>()
            .await;
    }

    /// Probes one fallback member; pushes the whole state only if it lacks
    /// the version.
    async fn fallback(&self, peer: PeerId) {
        let answer = {
            let Ok(_permit) = self.permits.acquire().await else {
                return;
            };
            if self.superseded.has_changed().unwrap_or(true) {
                return;
            }
            self.metrics.decision("probed").inc();
            let probe = PolicyPush {
                policy: None,
                revocations: self.msg.revocations.clone(),
            };
            self.metrics.push_in_flight.inc();
            let a = wire::push(self.push.control.clone(), peer, &probe, self.push.deadline).await;
            self.metrics.push_in_flight.dec();
            a
        };
        match answer {
            Ok(ack) if probe_says_held(&ack, self.held) => {
                self.metrics.decision("probe_held").inc();
            }
            Ok(ack) => {
                tracing::debug!(%peer, epoch = ack.epoch, version = ack.version, "fallback member lacks the version: pushing it");
                if self.full(peer).await != Outcome::Dropped {
                    self.metrics.decision("fallback").inc();
                }
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "policy probe failed");
                self.metrics.decision("probe_failed").inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_wire::open::OpenError;

    fn ack(epoch: u64, version: u64, ignored: &str) -> Result<PolicyAck, PolicyPushError> {
        Ok(PolicyAck {
            epoch,
            version,
            ignored: ignored.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_probe_is_answered_held_only_by_the_same_epoch_at_least_as_new() {
        let a = |epoch, version| PolicyAck {
            epoch,
            version,
            ..Default::default()
        };
        assert!(probe_says_held(&a(1, 4), (1, 4)));
        assert!(probe_says_held(&a(1, 5), (1, 4)), "newer than this router");
        assert!(!probe_says_held(&a(1, 3), (1, 4)));
        assert!(!probe_says_held(&a(2, 9), (1, 4)), "another epoch: send it");
        assert!(!probe_says_held(&a(0, 0), (1, 4)), "holds none");
        assert!(probe_says_held(&a(0, 0), (0, 0)), "nothing to send");
    }

    #[test]
    fn primaries_and_old_members_now_fallbacks_later_holders_skipped() {
        let p: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let members = [
            (&p[0], PushSlot::Primary, None),
            (&p[1], PushSlot::Unspecified, Some(6)),
            (&p[2], PushSlot::Fallback, Some(6)),
            (&p[3], PushSlot::Fallback, Some(7)),
        ];
        let (now, later, skipped) = split(members.into_iter(), 7);
        assert_eq!(now, vec![p[0], p[1]]);
        assert_eq!(later, vec![p[2]]);
        assert_eq!(skipped, 1, "its admission answer carried generation 7");
    }

    #[test]
    fn an_ack_counts_only_for_the_version_pushed() {
        assert_eq!(judge(ack(1, 4, ""), (1, 4)), Outcome::Acked);
        assert_eq!(
            judge(ack(1, 3, ""), (1, 4)),
            Outcome::Ignored,
            "kept an older one"
        );
        assert_eq!(judge(ack(1, 4, "bad_signature"), (1, 4)), Outcome::Ignored);
        let list_refused = Ok(PolicyAck {
            epoch: 1,
            version: 4,
            revocations_ignored: "unknown_key".into(),
            ..Default::default()
        });
        assert_eq!(
            judge(list_refused, (1, 4)),
            Outcome::Ignored,
            "the policy held, the list refused"
        );
        assert_eq!(
            judge(ack(0, 0, ""), (0, 0)),
            Outcome::Acked,
            "revocations only"
        );
        assert_eq!(
            judge(
                Err(PolicyPushError::Timeout(Duration::from_secs(1))),
                (1, 4)
            ),
            Outcome::Timeout
        );
        assert_eq!(
            judge(
                Err(PolicyPushError::Open(OpenError::Unsupported("no".into()))),
                (1, 4)
            ),
            Outcome::Failed
        );
    }
}
