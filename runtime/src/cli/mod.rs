//! What the programs' command lines share (cargo feature `cli`).
//!
//! Each program keeps its clap structs in its own library (`cli` module)
//! and converts them once into its `Config`. What two or more of them take
//! alike lives here, so the flag, its help and its default are written once:
//!
//! - [`ControlPlaneArgs`]: `--control-plane`, `--control-plane-ca`,
//!   `--token-file` (router and node).
//! - [`ListenerArgs`]: `--metrics-addr`, `--pprof-addr` (router and node).
//! - [`LogArgs`]: `--log-format` (every program).
//! - [`StreamLimitArgs`] (feature `cli-streams`): the streams crate's bounds
//!   (router and node).
//! - [`VERSION`]: what `--version` prints, with the git commit.
//! - [`help_problems`]: the check each program's tests run on its command,
//!   so that no flag goes without a one-line help naming its unit and
//!   default; [`checkout_commit`]: what its `--version` test expects.

mod args;
mod help;
#[cfg(feature = "cli-streams")]
mod streams;
mod version;

pub use args::{ControlPlaneArgs, DEFAULT_CONTROL_PLANE, ListenerArgs, LogArgs, TokenFileError};
pub use help::{flag_table, flags_missing_from, help_problems};
#[cfg(feature = "cli-streams")]
pub use streams::StreamLimitArgs;
pub use version::checkout_commit;

/// The version every program prints for `--version`: the workspace version
/// and the git commit it was built from (`unknown` outside a git checkout;
/// `AGENTMESH_GIT_COMMIT` overrides it), e.g. `0.1.0 (commit 1a2b3c4)`.
pub const VERSION: &str = env!("AGENTMESH_VERSION");

/// The git commit alone (short hash, or `unknown`).
pub const GIT_COMMIT: &str = env!("AGENTMESH_GIT_COMMIT");

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_the_package_version_and_a_commit() {
        assert!(
            super::VERSION.starts_with(env!("CARGO_PKG_VERSION")),
            "{}",
            super::VERSION
        );
        assert!(
            super::VERSION.ends_with(&format!("(commit {})", super::GIT_COMMIT)),
            "{}",
            super::VERSION
        );
        assert!(!super::GIT_COMMIT.is_empty());
    }
}
