//! Bakes the git commit into `agentmesh_runtime::cli::VERSION`, which every
//! program prints for `--version`.
//!
//! The commit is `git rev-parse --short HEAD`, or the `AGENTMESH_GIT_COMMIT`
//! environment variable when set (container builds copy the sources without
//! `.git`), else "unknown". The script reruns when HEAD moves: on a commit
//! (the branch's ref file or packed-refs) or a checkout (the HEAD file).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=AGENTMESH_GIT_COMMIT");
    let commit = match std::env::var("AGENTMESH_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => {
            watch_head();
            git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=AGENTMESH_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=AGENTMESH_VERSION={version} (commit {commit})");
}

/// One line of `git` output, `None` outside a checkout or without git.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Asks cargo to rerun this script when HEAD changes. Only files that exist
/// are named: cargo reruns a script on every build when a named file is
/// missing. Only the checked-out branch's ref is watched, not every ref, so
/// commits on other branches (other worktrees of the same repository) do not
/// rebuild. In a worktree HEAD lives in the worktree's git dir and the
/// branch refs in the common dir.
fn watch_head() {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) else {
        return;
    };
    let common =
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]).map(PathBuf::from);
    let common = common.as_deref().unwrap_or(&git_dir);
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let loose = common.join(&head_ref);
        // A branch only in packed-refs gets its loose file at its next
        // commit: until then watch the folder that file will appear in.
        match (loose.is_file(), loose.parent()) {
            (true, _) => watched.push(loose),
            (false, Some(dir)) => watched.push(dir.to_path_buf()),
            (false, None) => {}
        }
    }
    for path in watched.iter().filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
