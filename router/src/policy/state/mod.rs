//! The policy and revocation list this router holds: one owner, written
//! by whatever brings a new state from the control plane (the directory
//! poll, the watch), read by admission, publish, the circuit check and the
//! push to members.
//!
//! No policy held means deny all: a control plane with no policy denies
//! every call, and so does a router that has not heard one yet.

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::enforce::{HeldPolicy, PolicyRejection};
use agentmesh_proto::pb::credential::{Revocation, SignedPolicy};
use agentmesh_proto::pb::mesh::PolicyPush;
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::policy_metrics::PolicyMetrics;

/// What changed when a state was offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Changed {
    /// A new policy version was taken.
    pub(crate) policy: bool,
    /// The revocation list differs from the one held.
    pub(crate) revocations: bool,
}

impl Changed {
    /// Whether anything changed.
    pub(crate) fn any(self) -> bool {
        self.policy || self.revocations
    }
}

/// One state to push: its generation (bumped on every change) and when
/// the router took it (push lag is measured from there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) number: u64,
    pub(crate) taken_at: Instant,
}

/// The held policy and revocations (see the module doc).
pub(crate) struct PolicyState {
    held: RwLock<Held>,
    deny_all: Arc<Policy>,
    generation: watch::Sender<Generation>,
    metrics: PolicyMetrics,
}

#[derive(Default)]
struct Held {
    policy: Option<HeldPolicy>,
    revocations: Vec<Revocation>,
}

impl PolicyState {
    /// Nothing held: deny all.
    pub(crate) fn new(metrics: PolicyMetrics) -> Self {
        let (generation, _) = watch::channel(Generation {
            number: 0,
            taken_at: Instant::now(),
        });
        Self {
            held: RwLock::new(Held::default()),
            deny_all: Arc::new(Policy::deny_all()),
            generation,
            metrics,
        }
    }

    /// The metrics the policy counts in.
    pub(crate) fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    /// The compiled policy in force (deny all when none is held).
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.held
            .read()
            .policy
            .as_ref()
            .map_or_else(|| self.deny_all.clone(), |h| h.policy.clone())
    }

    /// The held policy's `(epoch, version)`, `(0, 0)` when none.
    pub(crate) fn version(&self) -> (u64, u64) {
        self.held
            .read()
            .policy
            .as_ref()
            .map_or((0, 0), |h| (h.epoch, h.version))
    }

    /// Offers what the control plane sent: `signed` (if any) is verified
    /// against `trust` and taken only if it supersedes the held one; an
    /// identical copy of the held one changes nothing and is not counted.
    /// A policy not taken is counted by reason and the held one stays.
    /// `revocations` replaces the held list when it differs. `source` is a
    /// label of `agentmesh_router_policy_applied` (see `crate::policy_metrics::SOURCES`).
    pub(crate) fn offer(
        &self,
        signed: Option<&SignedPolicy>,
        revocations: &[Revocation],
        trust: &Trust,
        source: &'static str,
    ) -> Changed {
        let mut held = self.held.write();
        let mut changed = Changed::default();
        if let Some(signed) = signed
            && held.policy.as_ref().is_none_or(|h| h.signed != *signed)
        {
            match HeldPolicy::accept(signed, trust, held.policy.as_ref()) {
                Ok(p) => {
                    tracing::info!(epoch = p.epoch, version = p.version, source, "policy taken");
                    self.metrics
                        .version
                        .set(i64::try_from(p.version).unwrap_or(i64::MAX));
                    self.metrics
                        .epoch
                        .set(i64::try_from(p.epoch).unwrap_or(i64::MAX));
                    self.metrics
                        .applied
                        .get_or_create(&[("source", source)])
                        .inc();
                    held.policy = Some(p);
                    changed.policy = true;
                }
                Err(e) => self.ignored(&e, source),
            }
        }
        if held.revocations != revocations {
            held.revocations = revocations.to_vec();
            changed.revocations = true;
        }
        drop(held);
        if changed.any() {
            self.generation.send_modify(|g| {
                g.number += 1;
                g.taken_at = Instant::now();
            });
        }
        changed
    }

    fn ignored(&self, e: &PolicyRejection, source: &'static str) {
        tracing::warn!(error = %e, reason = e.reason(), source, "policy from the control plane ignored; the held one stays");
        self.metrics
            .ignored
            .get_or_create(&[("reason", e.reason())])
            .inc();
    }

    /// What a push (or an admission answer) carries: the held policy (if
    /// any) and the revocation list.
    pub(crate) fn push_message(&self) -> PolicyPush {
        let held = self.held.read();
        PolicyPush {
            policy: held.policy.as_ref().map(|h| h.signed.clone()),
            revocations: held.revocations.clone(),
        }
    }

    /// The push for an admission answer to a member that reported
    /// `(epoch, version)`: `Some` only when the router holds a policy the
    /// member lacks (see [`HeldPolicy::is_newer_than`]).
    /// Also returns the generation the push is (at least) as new as: read
    /// before the message, so a change racing it leaves the member marked
    /// with the older generation and the next round still pushes to it.
    pub(crate) fn push_for(&self, epoch: u64, version: u64) -> Option<(u64, PolicyPush)> {
        let generation = self.generation.borrow().number;
        let newer = self
            .held
            .read()
            .policy
            .as_ref()
            .is_some_and(|h| h.is_newer_than(epoch, version));
        newer.then(|| (generation, self.push_message()))
    }

    /// Watches the generation: it changes on every new policy or list.
    pub(crate) fn generations(&self) -> watch::Receiver<Generation> {
        self.generation.subscribe()
    }
}

#[cfg(test)]
mod tests;
