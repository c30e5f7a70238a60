//! Who may provide and call what, as the control plane keeps and serves it.
//!
//! The document and its checks are `agentmesh-policy`'s; this module
//! applies them: a policy is checked whole before anything is stored (a
//! refused one changes nothing and the version in force stays), stored as
//! the next version ([`crate::store`] numbers it under a lock), held in
//! memory ([`crate::signed_policy`]), signed with the current signing key
//! and carried in every `GetDirectory` answer. Every change goes through
//! [`State::notify_directory_changed`], so the next directory carries it.
//!
//! - [`apply`]: applying a text, and noticing a version another process
//!   applied (replicas on one PostgreSQL database);
//! - [`startup`]: the rules at start (deny-all on a fresh database, a
//!   refusal on a database with members and no policy, `--policy FILE`,
//!   `--policy-allow-all`);
//! - [`rpc`]: `ApplyPolicy` and `GetPolicy` (admin);
//! - [`page`]: `GET /policy` and the policy part of `/info`;
//! - [`watch`]: the loop that notices other processes' versions and key
//!   rotations;
//! - [`diff`]: line differences between two versions, for `policy diff`;
//! - [`cli`]: `agentmesh-control-plane policy check|apply|show|diff`.

pub mod apply;
pub mod cli;
pub mod diff;
pub mod page;
pub mod rpc;
pub mod startup;
pub mod watch;

pub use apply::{ApplyError, Origin};
pub use startup::{PolicyStartError, StartPolicy};

use agentmesh_policy::PolicyError;

/// Every problem of a refused document, one a line, as compilers write
/// them (`FILE:LINE:COLUMN: message`; `FILE: message` for a problem of the
/// whole document).
pub fn problems_at(file: &str, e: &PolicyError) -> String {
    e.problems
        .iter()
        .map(|p| {
            if p.line == 0 {
                format!("{file}: {}", p.message)
            } else {
                format!("{file}:{}:{}: {}", p.line, p.column, p.message)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An epoch as operators see it: 16 hex digits.
pub fn epoch_hex(epoch: u64) -> String {
    format!("{epoch:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_the_file_line_and_column() {
        let e = agentmesh_policy::Policy::parse("[groups]\na = { role = \"admin\" }\n")
            .expect_err("refused");
        let text = problems_at("p.toml", &e);
        assert!(text.starts_with("p.toml:2:"), "{text}");
        assert!(text.contains("\"admin\""), "{text}");
        let big = " ".repeat(agentmesh_policy::MAX_POLICY_BYTES + 1);
        let e = agentmesh_policy::Policy::parse(&big).expect_err("too big");
        assert!(problems_at("p.toml", &e).starts_with("p.toml: "));
        assert_eq!(epoch_hex(255), "00000000000000ff");
    }
    /// Every TOML example in docs/policy.md passes the checks an apply runs.
    #[test]
    fn every_example_in_the_policy_docs_passes_its_checks() {
        let doc = include_str!("../../../docs/policy.md");
        let mut examples = 0;
        for block in doc.split("```toml\n").skip(1) {
            let text = block.split("```").next().unwrap_or_default();
            if let Err(e) = agentmesh_policy::Policy::parse(text) {
                panic!(
                    "docs/policy.md example refused:\n{text}\n{}",
                    problems_at("example", &e)
                );
            }
            examples += 1;
        }
        assert!(examples >= 4, "{examples} examples");
    }
}
