//! Applying a policy, and noticing one another process applied.
//!
//! An apply checks the text whole ([`Policy::parse`]: syntax, names, rules
//! against each other, the document's own tests) before anything is
//! written; a refused text leaves the database and the version in force as
//! they were. A text equal to the one in force stores nothing (so an apply
//! retried after a lost answer, or the same `--policy FILE` at every start,
//! is a no-op); a start-up file whose text was in force before and has been
//! replaced since stores nothing either (it is older than the database's
//! policy). A new version is held, counted and announced through
//! [`State::notify_directory_changed`] before the call returns.

use std::sync::Arc;

use agentmesh_policy::{Policy, PolicyError, Summary};
use agentmesh_proto::{pb::credential::SignedPolicy, unix_now};

use crate::{
    signed_policy::PolicyInForce,
    state::State,
    status::ServiceError,
    store::{AppliedPolicy, NewPolicy, PolicyRow, StoreError},
};

/// Who applies a policy and from where, as the version records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Who: the admin's own note, or the start-up flag.
    pub by: String,
    /// From where: the admin call's source address, or the file.
    pub from: String,
}

/// The version row an apply writes.
pub(super) fn new_policy(text: &str, origin: Origin, unless_replaced: bool) -> NewPolicy {
    NewPolicy {
        text: text.to_string(),
        applied_at: unix_now(),
        applied_by: origin.by,
        applied_from: origin.from,
        unless_replaced,
    }
}

/// Why a policy was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The document did not pass its checks; nothing was applied.
    #[error("{0}")]
    Refused(PolicyError),
    /// Storage failed; nothing was applied.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ApplyError> for ServiceError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Refused(p) => ServiceError::Invalid(p.to_string()),
            ApplyError::Store(s) => ServiceError::Store(s),
        }
    }
}

impl State {
    /// The policy in force.
    pub fn policy_in_force(&self) -> Arc<PolicyInForce> {
        self.policy.get()
    }

    /// Checks `text` and, if it passes, applies it as the next version
    /// unless it is the text in force. Returns what was done and the
    /// checked document's summary.
    pub async fn apply_policy(
        &self,
        text: &str,
        origin: Origin,
    ) -> Result<(AppliedPolicy, Summary), ApplyError> {
        self.apply_policy_as(text, origin, false).await
    }

    /// [`Self::apply_policy`] unless the text is one this database held
    /// and replaced since (`--policy FILE` at start: an older file never
    /// undoes a newer apply).
    pub(crate) async fn apply_policy_unless_replaced(
        &self,
        text: &str,
        origin: Origin,
    ) -> Result<(AppliedPolicy, Summary), ApplyError> {
        self.apply_policy_as(text, origin, true).await
    }

    async fn apply_policy_as(
        &self,
        text: &str,
        origin: Origin,
        unless_replaced: bool,
    ) -> Result<(AppliedPolicy, Summary), ApplyError> {
        let policy = self.checked_policy(text, &origin)?;
        let summary = policy.summary();
        let new = new_policy(text, origin, unless_replaced);
        let done = self.db.run(self.db.store().apply_policy(&new)).await?;
        self.took_effect(done, new, policy).await?;
        Ok((done, summary))
    }

    /// `text` checked whole, or refused (counted and logged).
    pub(super) fn checked_policy(&self, text: &str, origin: &Origin) -> Result<Policy, ApplyError> {
        Policy::parse(text).map_err(|e| {
            self.metrics.policy_applied("refused");
            tracing::warn!(by = %origin.by, from = %origin.from, problems = e.problems.len(), "policy refused: {e}");
            ApplyError::Refused(e)
        })
    }

    /// What follows an apply the store did: a new version held, counted
    /// and announced; a version another process holds taken up.
    pub(super) async fn took_effect(
        &self,
        done: AppliedPolicy,
        new: NewPolicy,
        policy: Policy,
    ) -> Result<(), StoreError> {
        let summary = policy.summary();
        match done {
            AppliedPolicy::Applied(version) => {
                let epoch = self.policy.get().epoch;
                let row = PolicyRow {
                    version,
                    text: new.text,
                    applied_at: new.applied_at,
                    applied_by: new.applied_by,
                    applied_from: new.applied_from,
                    replaced_at: None,
                };
                tracing::info!(
                    version,
                    by = %row.applied_by,
                    from = %row.applied_from,
                    groups = summary.groups,
                    owners = summary.owners,
                    grants = summary.grants,
                    tests = summary.tests,
                    "policy applied"
                );
                self.install_policy(PolicyInForce::checked(epoch, &row, policy));
                self.metrics.policy_applied("applied");
            }
            AppliedPolicy::Superseded { was, head } => {
                self.metrics.policy_applied("superseded");
                tracing::warn!(
                    was,
                    in_force = head,
                    from = %new.applied_from,
                    "policy not applied: this text is version {was}, replaced since; version \
                     {head} stays in force (a start-up file older than the database's policy \
                     never undoes a later apply; `policy apply` it to go back on purpose)"
                );
                if self.policy.get().version != head {
                    self.refresh_policy().await?;
                }
            }
            AppliedPolicy::Unchanged(version) => {
                self.metrics.policy_applied("unchanged");
                tracing::info!(
                    version,
                    "policy unchanged: the text is the version in force"
                );
                if self.policy.get().version != version {
                    // Another process applied this very text: take it up now.
                    self.refresh_policy().await?;
                }
            }
        }
        Ok(())
    }

    /// Holds `next` (unless a later version is held already) and announces
    /// it; returns whether it did.
    pub(crate) fn install_policy(&self, next: PolicyInForce) -> bool {
        let version = next.version;
        let installed = self.policy.install(next);
        if installed {
            self.metrics.set_policy_version(version);
            self.notify_directory_changed();
        }
        installed
    }

    /// Reads the epoch and version in force from the database and takes up
    /// a version this process does not hold (another process applied it, or
    /// the epoch was renewed). Returns whether the policy held changed. A
    /// stored version this binary cannot read is logged and not taken up.
    pub async fn refresh_policy(&self) -> Result<bool, StoreError> {
        let head = self.db.run(self.db.store().policy_head()).await?;
        let held = self.policy.get();
        let version = head.version.unwrap_or(0);
        if head.epoch == held.epoch && version == held.version {
            return Ok(false);
        }
        let next = match head.version {
            None => PolicyInForce::none(head.epoch),
            Some(v) => {
                let Some(row) = self.db.run(self.db.store().policy(v)).await? else {
                    return Ok(false);
                };
                match PolicyInForce::from_row(head.epoch, &row) {
                    Ok(p) => p,
                    Err(e) => {
                        if self.policy.note_unreadable(head.epoch, v) {
                            tracing::error!(
                                version = v,
                                "the policy version in force in the database does not pass this \
                                 binary's checks (applied by a newer binary?); still serving version {}: {e}",
                                held.version
                            );
                        }
                        return Ok(false);
                    }
                }
            }
        };
        let (version, before) = (next.version, held.version);
        let changed = self.install_policy(next);
        if changed {
            tracing::info!(
                version,
                before,
                "took up the policy version in force in the database"
            );
        }
        Ok(changed)
    }

    /// The signed policy the directory carries (signed with the key that
    /// signs now; made again when that key changes).
    pub fn signed_policy(&self, now: i64) -> Result<SignedPolicy, ServiceError> {
        let signer = self.keys.signer(now).ok_or(ServiceError::NoSigningKey)?;
        Ok(self.policy.get().signed(&signer, now))
    }
}
