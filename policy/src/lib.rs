//! Who may provide and who may call what.
//!
//! A policy is a TOML document an operator keeps in git:
//!
//! ```toml
//! format = 1
//!
//! [groups]                      # name -> selector over role and labels
//! payments = { labels = { team = "payments" } }
//! web = { role = "member", labels = { team = "web" } }
//!
//! [[owners]]                    # who may provide which services
//! services = ["payments/*"]
//! groups = ["payments"]
//!
//! [[grants]]                    # who may call which services (allow only)
//! from = ["web"]
//! to = ["payments/api"]
//!
//! [[tests]]                     # must all pass, or the policy is refused
//! from = { labels = { team = "web" } }
//! call = "payments/api"
//! expect = "allow"
//! ```
//!
//! Deny by default: a service no owner rule covers has no legitimate
//! provider, a call no grant covers is refused. Rules only allow, and they
//! combine as a union, so their order never matters. Role and labels are
//! the credential's (taken from the enrollment token by the control
//! plane), so a member cannot choose its groups.
//!
//! This crate does no I/O and knows nothing of credentials or the wire:
//! [`Policy::parse`] checks a document whole (every problem listed with
//! its line and column, nothing applied on any), and [`Policy::groups_of`],
//! [`Policy::may_provide`], [`Policy::may_call`] and [`Policy::may_reach`]
//! answer the enforcement points' questions.

mod compile;
mod error;
mod format;
mod groups;
mod pattern;
mod policy;
#[cfg(test)]
mod tests;

pub use compile::{ALLOW_ALL, MAX_GROUPS, MAX_POLICY_BYTES, MAX_RULES, MAX_TESTS};
pub use error::{PolicyError, Problem};
pub use groups::Groups;
pub use pattern::{MAX_SERVICE_BYTES, Pattern, check_name};
pub use policy::{Identity, Policy, Role, Summary};
