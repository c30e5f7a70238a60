//! Policy pushes (`/agentmesh/policy/1`) and the policy an admission
//! carries. A push is read only from a router that admitted us (attach):
//! any other peer's stream is dropped unread and counted `not_attached`,
//! so a stranger or another member cannot even make us parse a frame. At
//! most `--max-policy-pushes-in-flight` pushes are read at once (more:
//! `overflow`). One
//! frame, capped at `MAX_POLICY_FRAME_BYTES`, within the call timeout; a
//! malformed or late frame closes that stream only. The ack names the
//! version held after the push, whatever became of it.
//!
//! The policy and the revocation list are judged by
//! [`crate::policy::MemberPolicy`] with the node's own trust: the router is
//! trusted to deliver, never to vouch.
//!
//! **One router pushes us, the others stand by.** Each attach request
//! names this router our primary or a fallback
//! (`AuthRequest.policy_push_slot`): the first router we authenticate to
//! while we hold no primary becomes it, every other one is a fallback,
//! and when the primary's slot is gone the next router we authenticate to
//! (a replacement, or a re-presentation) takes its place. A primary pushes
//! at once; a fallback probes us after its delay and sends the policy only
//! if we still lack it, so a primary that died or withheld costs us that
//! delay, never the version.

use std::sync::Arc;

use agentmesh_proto::pb::mesh::{AuthRequest, PolicyPush, PolicyPushSlot};
use agentmesh_proto::unix_now;
use agentmesh_wire::auth::{AuthError, AuthOutcome};
use agentmesh_wire::policy as policy_wire;
use libp2p::{PeerId, Stream};

use super::{Engine, Op};
use crate::node::Node;

/// Push exchanges in progress, and which router pushes us first.
#[derive(Debug)]
pub(crate) struct Pushes {
    pending: usize,
    /// At once at most (`--max-policy-pushes-in-flight`); more are dropped unread.
    max: usize,
    /// The router we last named our primary.
    primary: Option<PeerId>,
}

/// What becomes of an arriving push stream.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Read,
    NotAttached,
    Overflow,
}

impl Pushes {
    /// None in progress, at most `max` at once (0 acts as 1).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            pending: 0,
            max: max.max(1),
            primary: None,
        }
    }

    /// The slot to name in an attach request to `router`: primary when we
    /// have none that we still hold (`holds` says whether a router's slot
    /// is still ours) or it is `router` itself, else fallback.
    pub(crate) fn slot_for(
        &mut self,
        router: PeerId,
        holds: impl Fn(&PeerId) -> bool,
    ) -> PolicyPushSlot {
        match self.primary {
            Some(p) if p != router && holds(&p) => PolicyPushSlot::Fallback,
            _ => {
                self.primary = Some(router);
                PolicyPushSlot::Primary
            }
        }
    }

    fn arrive(&mut self, attached: bool) -> Verdict {
        if !attached {
            Verdict::NotAttached
        } else if self.pending >= self.max {
            Verdict::Overflow
        } else {
            self.pending += 1;
            Verdict::Read
        }
    }

    fn finished(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }
}

/// Says in `req` which policy and revocation list we hold, so a router
/// holding a newer one sends it with the admission, and (attach) which
/// push slot the router is.
pub(crate) fn stamp(node: &Node, mut req: AuthRequest, slot: PolicyPushSlot) -> AuthRequest {
    let (epoch, version) = node.policy.epoch_version();
    req.policy_epoch = epoch;
    req.policy_version = version;
    let (epoch, generation) = node.policy.revocations_generation();
    req.revocations_epoch = epoch;
    req.revocations_generation = generation;
    req.policy_push_slot = slot as i32;
    req
}

/// An admission that carries a policy or a revocation list (each signed by
/// the control plane, verified here like a push): judged in the auth
/// exchange's own task, off the engine's loop, before the engine learns
/// of the admission, so a member that (re)attaches holds the router's
/// version by the time it counts as admitted (and so before it is ready).
pub(crate) async fn take_admitted_policy(
    node: &Arc<Node>,
    result: &Result<AuthOutcome, AuthError>,
) {
    if let Ok(AuthOutcome::Admitted {
        policy: Some(push), ..
    }) = result
    {
        let push: PolicyPush = (**push).clone();
        node.policy
            .on_push(&node.trust, push, unix_now(), "admission")
            .await;
    }
}

impl Engine {
    /// A policy push stream arrived from `peer`.
    pub(super) fn on_policy_stream(&mut self, peer: PeerId, mut stream: Stream) {
        let attached = self.slots.get(&peer).is_some_and(|s| s.phase.is_admitted());
        let m = &self.node.metrics.policy;
        match self.pushes.arrive(attached) {
            Verdict::Read => {}
            Verdict::NotAttached => {
                if let Some(suppressed) = self
                    .node
                    .metrics
                    .log
                    .pass(&peer, "policy_push_not_attached")
                {
                    tracing::warn!(%peer, suppressed, "policy push refused: not from a router we are attached to (logged at most once a minute per peer)");
                }
                m.push("not_attached");
                return;
            }
            Verdict::Overflow => {
                if let Some(suppressed) = self.node.metrics.log.pass(&peer, "policy_push_overflow")
                {
                    tracing::warn!(
                        %peer,
                        max = self.pushes.max,
                        suppressed,
                        "policy push dropped unread: --max-policy-pushes-in-flight already in progress (logged at most once a minute per peer)"
                    );
                }
                m.push("overflow");
                return;
            }
        }
        let node = self.node.clone();
        let deadline = node.config.call_timeout();
        self.ops.push(Box::pin(async move {
            let result = match policy_wire::receive(&mut stream, deadline).await {
                Err(e) => {
                    if let Some(suppressed) = node.metrics.log.pass(&peer, "policy_push_malformed") {
                        tracing::warn!(%peer, error = %e, suppressed, "bad policy push: stream closed (logged at most once a minute per peer)");
                    }
                    "malformed"
                }
                Ok(push) => {
                    let (ack, result) = node
                        .policy
                        .on_push(&node.trust, push, unix_now(), "push")
                        .await;
                    if let Err(e) = policy_wire::acknowledge(&mut stream, &ack, deadline).await {
                        tracing::debug!(%peer, error = %e, "policy ack not sent");
                    }
                    result
                }
            };
            Op::PolicyPushed { result }
        }));
    }

    pub(super) fn on_policy_pushed(&mut self, result: &'static str) {
        self.pushes.finished();
        self.node.metrics.policy.push(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_primary_at_a_time_and_the_next_router_replaces_a_lost_one() {
        let mut p = Pushes::new(1);
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut held = vec![a, b];
        assert_eq!(p.slot_for(a, |r| held.contains(r)), PolicyPushSlot::Primary);
        assert_eq!(
            p.slot_for(b, |r| held.contains(r)),
            PolicyPushSlot::Fallback
        );
        assert_eq!(
            p.slot_for(a, |r| held.contains(r)),
            PolicyPushSlot::Primary,
            "a re-presentation to the primary stays primary"
        );
        held.retain(|r| *r != a);
        held.push(c);
        assert_eq!(
            p.slot_for(c, |r| held.contains(r)),
            PolicyPushSlot::Primary,
            "the primary's slot is gone: the replacement takes it"
        );
        assert_eq!(
            p.slot_for(b, |r| held.contains(r)),
            PolicyPushSlot::Fallback
        );
    }

    #[test]
    fn only_attached_routers_are_read_and_at_most_a_bound_at_once() {
        let max = crate::config::DEFAULT_MAX_POLICY_PUSHES_IN_FLIGHT;
        let mut p = Pushes::new(max);
        assert_eq!(p.arrive(false), Verdict::NotAttached);
        for _ in 0..max {
            assert_eq!(p.arrive(true), Verdict::Read);
        }
        assert_eq!(p.arrive(true), Verdict::Overflow);
        assert_eq!(p.arrive(false), Verdict::NotAttached);
        p.finished();
        assert_eq!(p.arrive(true), Verdict::Read);
    }
}
