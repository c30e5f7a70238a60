//! The member's access policy, one owner: the signed policy it holds (none
//! held = every call denied), the revocation list it enforces, and a
//! change signal that live calls watch.
//!
//! A policy arrives three ways, all through [`MemberPolicy::offer`]: in the
//! directory the node fetches (`GetDirectoryResponse.policy`), in a
//! router's admission (`Admitted.policy`, set when the router holds a newer
//! one than the request said we hold), and pushed by an attached router on
//! `/agentmesh/policy/1` (see `core/policy_push.rs`). Every offer is
//! verified against the node's own [`Trust`] (the control plane's keys), so
//! a lying router can withhold a policy but never forge or roll one back;
//! one not taken is counted by reason (`agentmesh_node_policy_ignored_total`).
//!
//! Revocations: the directory's list is the control plane's whole list and
//! replaces ours; a push's revocations are added to it (they only take
//! rights away, so a router is trusted with them as it is with relaying),
//! and the next directory fetch makes the list exact again. The directory
//! fetch (`--directory-interval-secs`) is the fallback that also catches a
//! push we missed; its interval is not shortened or lengthened by pushes,
//! because the same fetch also keeps the router directory.

pub(crate) mod metrics;

use std::sync::Arc;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::{Trust, VerifiedClaims};
use agentmesh_proto::enforce::{HeldPolicy, OwnershipError, check_ownership, groups_of};
use agentmesh_proto::pb::credential::{Revocation, SignedPolicy};
use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush, ServiceRecord};
use libp2p::PeerId;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use self::metrics::PolicyMetrics;
use crate::labels::ReasonLabel;

#[cfg(test)]
pub(crate) use crate::config::DEFAULT_MAX_REVOCATION_ENTRIES;

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
    revocations: Mutex<Vec<Revocation>>,
    /// One offer verified at a time, so two racing offers cannot both be
    /// judged against the same held version.
    offers: tokio::sync::Mutex<()>,
    /// Bumped on every change of the policy or the revocations.
    changed: watch::Sender<u64>,
    /// Revocations held at most after a push (`--max-revocation-entries`).
    max_revocations: usize,
    metrics: PolicyMetrics,
}

impl MemberPolicy {
    /// None held: every call denied until a policy arrives; a push's
    /// revocations are kept up to `max_revocations` entries.
    pub(crate) fn new(metrics: PolicyMetrics, max_revocations: usize) -> Self {
        Self {
            held: RwLock::new(None),
            deny_all: Arc::new(Policy::deny_all()),
            revocations: Mutex::new(Vec::new()),
            offers: tokio::sync::Mutex::new(()),
            changed: watch::channel(0).0,
            max_revocations: max_revocations.max(1),
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

    /// The control plane's whole list (from the directory): replaces ours.
    pub(crate) fn set_revocations(&self, trust: &RwLock<Arc<Trust>>, list: Vec<Revocation>) {
        let mut held = self.revocations.lock();
        if *held == list {
            return;
        }
        *held = list;
        self.metrics.revocations.set(held.len() as i64);
        install(trust, &held);
        drop(held);
        self.bump();
    }

    /// Revocations a router pushed: added to ours (never removing one);
    /// those already over at `now` are dropped.
    pub(crate) fn add_revocations(
        &self,
        trust: &RwLock<Arc<Trust>>,
        more: &[Revocation],
        now: i64,
    ) {
        let mut held = self.revocations.lock();
        let (changed, dropped) = merge(&mut held, more, now, self.max_revocations);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                max = self.max_revocations,
                "revocations past --max-revocation-entries dropped (those ending soonest); the next directory fetch restores the list"
            );
            self.metrics.revocations_dropped.inc_by(dropped as u64);
        }
        self.metrics.revocations.set(held.len() as i64);
        if !changed {
            return;
        }
        install(trust, &held);
        drop(held);
        self.bump();
    }

    /// A push from an attached router: its revocations, then its policy;
    /// the ack names what is held after it. Returns the metric result too.
    pub(crate) async fn on_push(
        &self,
        trust: &RwLock<Arc<Trust>>,
        push: PolicyPush,
        now: i64,
    ) -> (PolicyAck, &'static str) {
        self.add_revocations(trust, &push.revocations, now);
        let (result, ignored) = match push.policy {
            Some(signed) => {
                let current = trust.read().clone();
                match self.offer(signed, current, "push").await {
                    Offer::Accepted => ("accepted", ""),
                    Offer::Held => ("held", ""),
                    Offer::Ignored(why) => ("ignored", why),
                }
            }
            // A fallback router's probe: the ack says what we hold.
            None => ("probe", ""),
        };
        let (epoch, version) = self.epoch_version();
        let ack = PolicyAck {
            epoch,
            version,
            ignored: ignored.to_string(),
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

/// Adds `more` to `held` (same peer and token: the later end wins), drops
/// entries over at `now`, keeps at most `max` (those ending last). Returns
/// whether `held` changed and how many entries the bound dropped.
fn merge(held: &mut Vec<Revocation>, more: &[Revocation], now: i64, max: usize) -> (bool, usize) {
    let before = held.clone();
    let mut index: std::collections::HashMap<(Vec<u8>, String), usize> = held
        .iter()
        .enumerate()
        .map(|(i, h)| ((h.peer_id.clone(), h.token_id.clone()), i))
        .collect();
    for r in more {
        if r.until_unix_secs < now || (r.peer_id.is_empty() && r.token_id.is_empty()) {
            continue;
        }
        match index.get(&(r.peer_id.clone(), r.token_id.clone())) {
            Some(&i) => held[i].until_unix_secs = held[i].until_unix_secs.max(r.until_unix_secs),
            None => {
                index.insert((r.peer_id.clone(), r.token_id.clone()), held.len());
                held.push(r.clone());
            }
        }
    }
    held.retain(|h| h.until_unix_secs >= now);
    let mut dropped = 0;
    if held.len() > max {
        held.sort_by_key(|h| std::cmp::Reverse(h.until_unix_secs));
        dropped = held.len() - max;
        held.truncate(max);
    }
    (*held != before, dropped)
}

#[cfg(test)]
mod tests;
