//! Pushing the held state (policy + revocations) to every attached member
//! over `/agentmesh/policy/1` when it changes: one short stream each (no
//! stream held open per member, so a member costs nothing between
//! pushes), at most `--policy-push-concurrency` at once, each within
//! `--policy-push-deadline-ms`.
//!
//! Unlike go-away (`crate::goaway::pace`), a push makes no member move,
//! so there is no re-attach storm to pace against: the fan-out bound is
//! the pace. A newer state arriving mid-round supersedes the pushes not
//! yet started (counted `dropped`); the next round pushes the newer state
//! to everyone. A member attaching meanwhile gets the state in its
//! admission answer (`Admitted.policy`).

use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush};
use agentmesh_streams::Control;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::policy::{self as wire, PolicyPushError};
use futures::StreamExt as _;
use libp2p::PeerId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::state::{Generation, PolicyState};
use crate::admission::{Admissions, Purpose};

/// What pushing needs.
#[derive(Clone)]
pub(crate) struct Push {
    pub(crate) state: Arc<PolicyState>,
    pub(crate) admissions: Admissions,
    pub(crate) control: Control,
    pub(crate) concurrency: usize,
    pub(crate) deadline: Duration,
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
/// (`(0, 0)`: no policy, only revocations). Pure.
pub(crate) fn judge(answer: Result<PolicyAck, PolicyPushError>, pushed: (u64, u64)) -> Outcome {
    match answer {
        Ok(ack) if ack.ignored.is_empty() && (ack.epoch, ack.version) == pushed => Outcome::Acked,
        // A member that holds no policy acks revocations with (0, 0).
        Ok(ack) if ack.ignored.is_empty() && pushed == (0, 0) => Outcome::Acked,
        Ok(_) => Outcome::Ignored,
        Err(e) if e.is_timeout() => Outcome::Timeout,
        Err(_) => Outcome::Failed,
    }
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
            _ = round(&push, g, &mut generations) => {}
        }
    }
}

/// One round: the state of generation `g` to every attached member.
async fn round(push: &Push, g: Generation, generations: &mut watch::Receiver<Generation>) {
    let msg = Arc::new(push.state.push_message());
    let pushed = push.state.version();
    let members: Vec<PeerId> = push
        .admissions
        .read()
        .iter()
        .filter(|(_, a)| a.purpose == Purpose::Attach)
        .map(|(p, _)| *p)
        .collect();
    tracing::info!(
        members = members.len(),
        epoch = pushed.0,
        version = pushed.1,
        "pushing policy"
    );
    let metrics = push.state.metrics().clone();
    let superseded = generations.clone();
    futures::stream::iter(members)
        .map(|peer| {
            let (msg, control, superseded) =
                (msg.clone(), push.control.clone(), superseded.clone());
            let metrics = metrics.clone();
            async move {
                let outcome = if superseded.has_changed().unwrap_or(true) {
                    Outcome::Dropped
                } else {
                    metrics.push_in_flight.inc();
                    let o = judge(push_one(control, peer, &msg, push.deadline).await, pushed);
                    metrics.push_in_flight.dec();
                    o
                };
                if outcome == Outcome::Acked {
                    metrics.push_lag.observe(g.taken_at.elapsed().as_secs_f64());
                }
                if matches!(outcome, Outcome::Ignored | Outcome::Failed) {
                    tracing::debug!(%peer, outcome = outcome.as_str(), "policy push not taken");
                }
                metrics
                    .push
                    .get_or_create(&[("outcome", outcome.as_str())])
                    .inc();
            }
        })
        .buffer_unordered(push.concurrency.max(1))
        .collect::<()>()
        .await;
}

async fn push_one(
    control: Control,
    peer: PeerId,
    msg: &PolicyPush,
    deadline: Duration,
) -> Result<PolicyAck, PolicyPushError> {
    wire::push(control, peer, msg, deadline).await
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
        })
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
