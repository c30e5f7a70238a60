//! The policy and revocation list this router holds: one owner, written
//! by whatever brings a new state from the control plane (the directory
//! poll, the watch), read by admission, publish, the circuit check and the
//! push to members.
//!
//! Both are signed by the control plane and verified here before they are
//! taken, each only when it supersedes the one held, so the poll and the
//! watch racing each other never put back an older state. The router
//! forwards both as they came; members verify them again themselves.
//!
//! No policy held means deny all: a control plane with no policy denies
//! every call, and so does a router that has not heard one yet.

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::enforce::{HeldPolicy, PolicyRejection};
use agentmesh_proto::pb::credential::{Revocation, SignedPolicy, SignedRevocations};
use agentmesh_proto::pb::mesh::PolicyPush;
use agentmesh_proto::revocations::{HeldRevocations, RevocationsRejection, SameGeneration};
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::policy_metrics::PolicyMetrics;

/// What changed when a state was offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Changed {
    /// A new policy version was taken.
    pub(crate) policy: bool,
    /// A newer revocation list (another generation) was taken.
    pub(crate) revocations: bool,
    /// The revocation list held is another copy (newer, or the same
    /// generation signed again): the trust must be given its entries.
    pub(crate) revocations_copy: bool,
}

impl Changed {
    /// Whether anything changed that members must be pushed.
    pub(crate) fn any(self) -> bool {
        self.policy || self.revocations
    }
}

/// What a member says it holds in its auth request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Reported {
    /// The policy's `(epoch, version)`, `(0, 0)` for none.
    pub(crate) policy: (u64, u64),
    /// The revocation list's `(epoch, generation)`, `(0, 0)` for none.
    pub(crate) revocations: (u64, u64),
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
    /// The revocation list held is not in the router's trust yet: the
    /// swarm loop did not install it in time (see `PolicyCtx::take`).
    revocations_unapplied: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Held {
    policy: Option<HeldPolicy>,
    revocations: Option<HeldRevocations>,
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
            revocations_unapplied: Default::default(),
        }
    }

    /// Notes that the revocation list held could not be installed in the
    /// router's trust (the next take installs it again).
    pub(crate) fn revocations_unapplied(&self) {
        self.revocations_unapplied
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether an earlier install failed (and forgets it: the caller tries
    /// again, and notes a new failure).
    pub(crate) fn take_revocations_unapplied(&self) -> bool {
        self.revocations_unapplied
            .swap(false, std::sync::atomic::Ordering::AcqRel)
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

    /// The held revocation list's `(epoch, generation)`, `(0, 0)` when none.
    #[cfg(test)]
    pub(crate) fn revocations_generation(&self) -> (u64, u64) {
        self.held
            .read()
            .revocations
            .as_ref()
            .map_or((0, 0), HeldRevocations::generation)
    }

    /// The entries of the revocation list held (what the router's trust
    /// enforces).
    pub(crate) fn revocation_entries(&self) -> Arc<Vec<Revocation>> {
        self.held
            .read()
            .revocations
            .as_ref()
            .map(|h| h.entries.clone())
            .unwrap_or_default()
    }

    /// Offers what the control plane sent: `signed` (if any) and
    /// `revocations` (if any) are verified against `trust` at `now` and
    /// each taken only if it supersedes the one held (a revocation list of
    /// the generation held, signed again later after a key rotation,
    /// replaces the copy forwarded without being a change). An identical
    /// copy changes nothing and is not counted; anything else not taken is
    /// counted by reason and the held one stays. `source` is a label of
    /// `agentmesh_router_policy_applied` (see `crate::policy_metrics::SOURCES`).
    pub(crate) fn offer(
        &self,
        signed: Option<&SignedPolicy>,
        revocations: Option<&SignedRevocations>,
        trust: &Trust,
        now: i64,
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
        if let Some(list) = revocations
            && held.revocations.as_ref().is_none_or(|h| h.signed != *list)
        {
            let before = held.revocations.as_ref().map(HeldRevocations::generation);
            match HeldRevocations::accept(
                list,
                trust,
                held.revocations.as_ref(),
                now,
                SameGeneration::TakeResigned,
            ) {
                Ok(h) => {
                    let (epoch, generation) = h.generation();
                    changed.revocations = before != Some((epoch, generation));
                    changed.revocations_copy = true;
                    if changed.revocations {
                        tracing::info!(
                            epoch,
                            generation,
                            entries = h.entries.len(),
                            source,
                            "revocation list taken"
                        );
                    }
                    self.metrics
                        .revocations_generation
                        .set(i64::try_from(generation).unwrap_or(i64::MAX));
                    held.revocations = Some(h);
                }
                // An earlier copy of the generation held (another control
                // plane signed it at another instant): nothing to say.
                Err(RevocationsRejection::Stale { epoch, generation })
                    if before == Some((epoch, generation)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, reason = e.reason(), source, "revocation list from the control plane ignored; the held one stays");
                    self.metrics
                        .revocations_ignored
                        .get_or_create(&[("reason", e.reason())])
                        .inc();
                }
            }
        }
        changed
    }

    /// Starts a push round of what is held now, taken at `taken_at` (push
    /// lag is measured from there): called by whoever offered a change,
    /// once it is enforced where the round reads it (a new revocation list
    /// installed in the router's trust, so the round leaves out the members
    /// it names instead of pushing to them as they are dropped).
    pub(crate) fn announce(&self, taken_at: Instant) {
        self.generation.send_modify(|g| {
            g.number += 1;
            g.taken_at = taken_at;
        });
    }

    fn ignored(&self, e: &PolicyRejection, source: &'static str) {
        tracing::warn!(error = %e, reason = e.reason(), source, "policy from the control plane ignored; the held one stays");
        self.metrics
            .ignored
            .get_or_create(&[("reason", e.reason())])
            .inc();
    }

    /// What a push carries: the held policy and revocation list (each if
    /// any), signed by the control plane, as they came.
    pub(crate) fn push_message(&self) -> PolicyPush {
        let held = self.held.read();
        PolicyPush {
            policy: held.policy.as_ref().map(|h| h.signed.clone()),
            revocations: held.revocations.as_ref().map(|h| h.signed.clone()),
        }
    }

    /// The push for an admission answer to a member that reported
    /// `member`: the policy `(epoch, version)` and revocation list
    /// `(epoch, generation)` it holds. `Some` only when the router holds a
    /// policy or a list the member lacks, carrying only those (see
    /// [`HeldPolicy::is_newer_than`], [`HeldRevocations::is_newer_than`]).
    /// Also returns the generation the push is (at least) as new as: read
    /// before the message, so a change racing it leaves the member marked
    /// with the older generation and the next round still pushes to it.
    pub(crate) fn push_for(&self, member: Reported) -> Option<(u64, PolicyPush)> {
        let generation = self.generation.borrow().number;
        let held = self.held.read();
        let policy = held
            .policy
            .as_ref()
            .filter(|h| h.is_newer_than(member.policy.0, member.policy.1))
            .map(|h| h.signed.clone());
        let revocations = held
            .revocations
            .as_ref()
            .filter(|h| h.is_newer_than(member.revocations.0, member.revocations.1))
            .map(|h| h.signed.clone());
        (policy.is_some() || revocations.is_some()).then_some((
            generation,
            PolicyPush {
                policy,
                revocations,
            },
        ))
    }

    /// Watches the generation: it changes on every new policy or list
    /// ([`Self::announce`]).
    pub(crate) fn generations(&self) -> watch::Receiver<Generation> {
        self.generation.subscribe()
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
