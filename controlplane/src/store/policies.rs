//! Policy versions as both backends store them: one row per applied
//! version in `policies` (the text exactly as applied, when, by whom and
//! from where, and when a newer version replaced it), and the database's
//! policy epoch in `policy_epoch`.
//!
//! The version in force is the highest one; versions are numbered 1, 2, …
//! inside the transaction that writes them, under SQLite's writer lock or
//! a PostgreSQL advisory lock, so they never collide and never go back
//! (the one in force is never reaped, so the highest number survives every
//! reap).
//!
//! The epoch is a random u64 (stored as the BIGINT with the same bits),
//! made when a database is created (or first opened by a binary that knows
//! policies), and made anew when `store copy` restores a database, when a
//! SQLite backup is written, and by `store new-policy-epoch` after a
//! restore from a dump: verifiers accept any version of a new epoch issued
//! later than what they hold, so a restored history is never ignored for
//! holding lower versions than the members saw (see
//! `agentmesh_proto::policy::supersedes`).

/// A policy version to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPolicy {
    /// The document, exactly as applied (already checked by the caller).
    pub text: String,
    /// Unix seconds.
    pub applied_at: i64,
    /// Who applied it, as recorded (the admin's own note, or the start-up
    /// flag that applied it).
    pub applied_by: String,
    /// From where: the admin call's source address, or the file applied
    /// at start.
    pub applied_from: String,
    /// Apply only a text this database never held: one that a later
    /// version replaced is older than the policy in force and is left
    /// ([`AppliedPolicy::Superseded`]). The `--policy FILE` rule at start,
    /// so neither a restarted replica nor an old pod in a rolling update
    /// undoes a newer apply; `policy apply` sets it false (an operator
    /// may go back on purpose).
    pub unless_replaced: bool,
}

/// A stored policy version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRow {
    /// 1, 2, … within the database.
    pub version: u64,
    /// The document, exactly as applied.
    pub text: String,
    /// Unix seconds.
    pub applied_at: i64,
    /// Who applied it.
    pub applied_by: String,
    /// From where.
    pub applied_from: String,
    /// When a newer version replaced it, Unix seconds (`None` while in force).
    pub replaced_at: Option<i64>,
}

/// The epoch and the version in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyHead {
    /// The database's policy epoch.
    pub epoch: u64,
    /// The version in force; `None` when no policy was ever applied.
    pub version: Option<u64>,
}

/// What [`super::Store::apply_policy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppliedPolicy {
    /// Stored as this new version.
    Applied(u64),
    /// The text is the version in force already: nothing stored.
    Unchanged(u64),
    /// The text is that of version `was`, since replaced, and the call
    /// asked for [`NewPolicy::unless_replaced`]: nothing stored, `head`
    /// stays in force.
    Superseded {
        /// The newest earlier version with this text.
        was: u64,
        /// The version in force.
        head: u64,
    },
}

impl AppliedPolicy {
    /// The version in force after the call.
    pub fn version(self) -> u64 {
        match self {
            AppliedPolicy::Applied(v)
            | AppliedPolicy::Unchanged(v)
            | AppliedPolicy::Superseded { head: v, .. } => v,
        }
    }
}

/// A new random epoch, as stored (the BIGINT with the u64's bits).
pub(super) fn new_epoch() -> i64 {
    rand::random::<u64>() as i64
}

/// A stored epoch as the u64 it was made from.
pub(super) fn epoch_from(stored: i64) -> u64 {
    stored as u64
}

/// A stored version number (never negative: numbered from 1).
pub(super) fn version_from(stored: i64) -> Result<u64, super::StoreError> {
    u64::try_from(stored).map_err(|_| super::StoreError::Corrupt {
        table: "policies",
        what: format!("version = {stored}"),
    })
}

/// A version as stored.
pub(super) fn version_to(v: u64) -> Result<i64, super::StoreError> {
    i64::try_from(v).map_err(|_| super::StoreError::Query(format!("policy version {v} too large")))
}
