//! The member's access policy, one owner: the signed policy it holds (none
//! held = every call denied), the revocation list it enforces, and a
//! change signal that live calls watch.
//!
//! A policy arrives three ways, all through [`MemberPolicy::offer`]: in the
//! directory the node fetches (`GetDirectoryResponse.policy`), in a
//! router's admission (`Admitted.policy`, set when the router holds a newer
//! one than the request said we hold), and pushed by an attached router on
//! `/agentmesh/policy/1` (see `engine/policy_push.rs`). Every offer is
//! verified against the node's own [`Trust`] (the control plane's keys), so
//! a lying router can withhold a policy but never forge or roll one back;
//! one not taken is counted by reason (`agentmesh_node_policy_ignored_total`).
//!
//! Revocations: the control plane's whole list, signed like the policy,
//! arrives the same three ways through [`MemberPolicy::offer_revocations`]
//! and replaces ours only when it verifies against our trust (a key of the
//! set, within its grace) and supersedes the list held (a higher
//! generation of the same epoch, or another epoch issued later). So a
//! router can delay a revocation but never forge one (naming an honest
//! provider) nor roll one back (an older list without a revocation in
//! force); one not taken is counted by reason
//! (`agentmesh_node_revocations_ignored_total`). The directory fetch
//! (`--directory-interval-secs`) is the fallback that also catches a push
//! we missed; its interval is not shortened or lengthened by pushes,
//! because the same fetch also keeps the router directory.

pub(crate) mod metrics;

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{Trust, VerifiedClaims};
use agentmesh_proto::enforce::{HeldPolicy, OwnershipError, check_ownership, groups_of};
use agentmesh_proto::pb::credential::{Revocation, SignedPolicy, SignedRevocations};
use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush, ServiceRecord};
use agentmesh_proto::revocations::{HeldRevocations, RevocationsRejection, SameGeneration};
use libp2p::PeerId;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use self::metrics::PolicyMetrics;
use crate::labels::ReasonLabel;

/// The `source` of a policy from the directory fetch.
pub(crate) const DIRECTORY: &str = "directory";

/// What became of an offered policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Newer than the one held: it is in force now.
    Accepted,
    /// The very policy held already.
    Held,
    /// Not taken, with the reason (`PolicyRejection::reason`).
    Ignored(&'static str),
}

/// Why a caller may not use a live or new call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No grant of the service to any of the caller's groups.
    NotGranted,
    /// The caller (its PeerId or its token) is revoked.
    Revoked,
}

impl Denied {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Denied::NotGranted => "not_granted",
            Denied::Revoked => "revoked",
        }
    }
}

/// The member's policy state (see the module docs).
pub(crate) struct MemberPolicy {
    held: RwLock<Option<Arc<HeldPolicy>>>,
    deny_all: Arc<Policy>,
    /// The verified revocation list held (none until one arrives).
    revocations: Mutex<Option<HeldRevocations>>,
    /// One offer verified at a time, so two racing offers cannot both be
    /// judged against the same held version.
    offers: tokio::sync::Mutex<()>,
    /// Bumped on every change of the policy or the revocations.
    changed: watch::Sender<u64>,
    metrics: PolicyMetrics,
}

impl MemberPolicy {
    /// None held: every call denied until a policy arrives, nobody revoked
    /// until a signed list arrives.
    pub(crate) fn new(metrics: PolicyMetrics) -> Self {
        Self {
            held: RwLock::new(None),
            deny_all: Arc::new(Policy::deny_all()),
            revocations: Mutex::new(None),
            offers: tokio::sync::Mutex::new(()),
            changed: watch::channel(0).0,
            metrics,
        }
    }

    /// The policy held, if any.
    pub(crate) fn held(&self) -> Option<Arc<HeldPolicy>> {
        self.held.read().clone()
    }

    /// The policy in force: the one held, or deny-all.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.held()
            .map_or_else(|| self.deny_all.clone(), |h| h.policy.clone())
    }

    /// `(epoch, version)` held; `(0, 0)` for none (what an auth request says).
    pub(crate) fn epoch_version(&self) -> (u64, u64) {
        self.held().map_or((0, 0), |h| (h.epoch, h.version))
    }

    /// `(epoch, generation)` of the revocation list held; `(0, 0)` for none
    /// (what an auth request says).
    pub(crate) fn revocations_generation(&self) -> (u64, u64) {
        self.revocations
            .lock()
            .as_ref()
            .map_or((0, 0), HeldRevocations::generation)
    }

    /// Changes of the policy or the revocations, as a counter.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g += 1);
    }

    /// Verifies `signed` with `trust` and takes it if it supersedes the one
    /// held. Parsing (up to 1 MiB of TOML) runs off the runtime's threads.
    pub(crate) async fn offer(
        &self,
        signed: SignedPolicy,
        trust: Arc<Trust>,
        source: &'static str,
    ) -> Offer {
        let _one = self.offers.lock().await;
        let held = self.held();
        if held.as_ref().is_some_and(|h| h.signed == signed) {
            return Offer::Held;
        }
        let judged = tokio::task::spawn_blocking(move || {
            HeldPolicy::accept(&signed, &trust, held.as_deref())
        })
        .await;
        match judged {
            Ok(Ok(h)) => {
                tracing::info!(
                    source,
                    epoch = h.epoch,
                    version = h.version,
                    "access policy in force"
                );
                self.metrics.version.set(h.version as i64);
                self.metrics.epoch.set(h.epoch as i64);
                *self.held.write() = Some(Arc::new(h));
                self.bump();
                Offer::Accepted
            }
            Ok(Err(e)) => {
                let reason = e.reason();
                if source == DIRECTORY && reason == "stale" {
                    // A push brought a newer one than the (cached) directory
                    // has yet: normal, not a lie.
                    tracing::debug!(error = %e, "directory policy older than the one held");
                } else {
                    if let Some(suppressed) = self.metrics.log.pass(&source, "policy_ignored") {
                        tracing::warn!(source, reason, error = %e, suppressed, "policy ignored (logged at most once a minute per source)");
                    }
                    self.metrics
                        .ignored
                        .get_or_create(&ReasonLabel { reason })
                        .inc();
                }
                Offer::Ignored(reason)
            }
            Err(e) => {
                // The check panicked (a bug in the parser): the held one stays.
                tracing::error!(source, error = %e, "policy check failed");
                let reason = "unparsable";
                self.metrics
                    .ignored
                    .get_or_create(&ReasonLabel { reason })
                    .inc();
                Offer::Ignored(reason)
            }
        }
    }

    /// Verifies the control plane's signed list with `trust` at `now` and
    /// takes it if it supersedes the one held (the same generation, as
    /// re-signed after a key rotation, changes nothing). Taken, its entries
    /// replace the revocations in `trust`. Not taken, it is counted by
    /// reason, except an older list from the directory fetch (a cached
    /// answer behind a push: normal, not a lie).
    pub(crate) fn offer_revocations(
        &self,
        trust: &RwLock<Arc<Trust>>,
        signed: &SignedRevocations,
        now: i64,
        source: &'static str,
    ) -> Offer {
        let current = trust.read().clone();
        let mut held = self.revocations.lock();
        if held.as_ref().is_some_and(|h| h.signed == *signed) {
            return Offer::Held;
        }
        match HeldRevocations::accept(signed, &current, held.as_ref(), now, SameGeneration::Refuse)
        {
            Ok(h) => {
                let (epoch, generation) = h.generation();
                tracing::info!(
                    source,
                    epoch,
                    generation,
                    entries = h.entries.len(),
                    "revocation list in force"
                );
                install(trust, &h.entries);
                self.metrics.revocations.set(h.entries.len() as i64);
                self.metrics
                    .revocations_generation
                    .set(i64::try_from(generation).unwrap_or(i64::MAX));
                *held = Some(h);
                drop(held);
                self.bump();
                Offer::Accepted
            }
            Err(RevocationsRejection::Stale { epoch, generation })
                if held.as_ref().map(HeldRevocations::generation) == Some((epoch, generation)) =>
            {
                Offer::Held
            }
            Err(e) => {
                let reason = e.reason();
                if source == DIRECTORY && reason == "stale" {
                    tracing::debug!(error = %e, "directory revocation list older than the one held");
                } else {
                    tracing::warn!(source, reason, error = %e, "revocation list ignored; the held one stays");
                    self.metrics
                        .revocations_ignored
                        .get_or_create(&ReasonLabel { reason })
                        .inc();
                }
                Offer::Ignored(reason)
            }
        }
    }

    /// A push from an attached router (or an admission answer): its
    /// revocation list, then its policy, each verified and taken only if
    /// newer; the ack names what is held after it and why anything was
    /// not taken. Returns the metric result too.
    pub(crate) async fn on_push(
        &self,
        trust: &RwLock<Arc<Trust>>,
        push: PolicyPush,
        now: i64,
        source: &'static str,
    ) -> (PolicyAck, &'static str) {
        let list_ignored = match push.revocations.as_ref() {
            Some(list) => match self.offer_revocations(trust, list, now, source) {
                Offer::Ignored(why) => why,
                Offer::Accepted | Offer::Held => "",
            },
            None => "",
        };
        let (result, ignored) = match push.policy {
            Some(signed) => {
                let current = trust.read().clone();
                match self.offer(signed, current, source).await {
                    Offer::Accepted => ("accepted", ""),
                    Offer::Held => ("held", ""),
                    Offer::Ignored(why) => ("ignored", why),
                }
            }
            // A fallback router's probe: the ack says what we hold.
            None => ("probe", ""),
        };
        let (epoch, version) = self.epoch_version();
        let (revocations_epoch, revocations_generation) = self.revocations_generation();
        let ack = PolicyAck {
            epoch,
            version,
            ignored: ignored.to_string(),
            revocations_epoch,
            revocations_generation,
            revocations_ignored: list_ignored.to_string(),
        };
        (ack, result)
    }

    /// Whether the caller with `claims` may call `service` now, revocations
    /// included (`trust` is the node's current one).
    pub(crate) fn may_call(
        &self,
        trust: &Trust,
        claims: &VerifiedClaims,
        service: &str,
        now: i64,
    ) -> Result<(), Denied> {
        if trust.is_claims_revoked(claims, now) {
            return Err(Denied::Revoked);
        }
        let policy = self.policy();
        if policy.may_call(&groups_of(&policy, claims), service) {
            Ok(())
        } else {
            Err(Denied::NotGranted)
        }
    }

    /// Whether `record` (verified as signed by `provider`) proves that its
    /// provider owns what it names, under the policy in force; a refusal
    /// is counted by reason.
    pub(crate) fn check_record(
        &self,
        record: &ServiceRecord,
        provider: &PeerId,
        trust: &Trust,
        now: i64,
        skew_secs: i64,
    ) -> Result<(), OwnershipError> {
        check_ownership(record, provider, trust, &self.policy(), now, skew_secs)
            .map(|_| ())
            .inspect_err(|e| {
                self.metrics
                    .providers_skipped
                    .get_or_create(&ReasonLabel { reason: e.reason() })
                    .inc();
            })
    }
}

/// Puts `list` into the node's trust (under its write lock, so a key
/// update racing with it is not lost).
fn install(trust: &RwLock<Arc<Trust>>, list: &[Revocation]) {
    let mut w = trust.write();
    let mut t = (**w).clone();
    t.set_revocations(list);
    *w = Arc::new(t);
}

#[cfg(test)]
mod tests;
