//! The commit a checkout's binaries should name in `--version`, read
//! independently of the build script, so the programs' binary tests can
//! check what `--version` prints against the checkout itself.

use std::path::Path;
use std::process::Command;

/// The short commit a binary built from the checkout at `dir` should name:
/// `AGENTMESH_GIT_COMMIT` when set (the build's override), else what
/// `git rev-parse --short HEAD` says there, else `unknown`. Runs `git`:
/// for tests, never on a program's path.
pub fn checkout_commit(dir: &Path) -> String {
    if let Ok(c) = std::env::var("AGENTMESH_GIT_COMMIT")
        && !c.trim().is_empty()
    {
        return c.trim().to_string();
    }
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}
