//! Removing what a testbed made: its own namespaces when it ends, and the
//! leftovers of killed runs of the same family when a new one starts.
//!
//! A leftover is a namespace (or log directory) whose name parses as ours
//! ([`Prefix`]) and whose creating process no longer exists. Namespaces of
//! live processes (another run, or this process's other testbeds) are never
//! touched, nor anything whose name is not exactly ours.

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cmd;
use crate::error::Error;
use crate::names::Prefix;

/// Where `ip netns` keeps its named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Start of a testbed's log directory name in the temp dir; the prefix follows.
pub(crate) const LOG_DIR_START: &str = "agentmesh-netns-";

/// A file in a log directory that keeps it from being swept (written when
/// a test panicked, so its logs stay for whoever reads the failure).
pub(crate) const KEEP_MARKER: &str = "KEEP";

/// What [`sweep`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Namespaces removed.
    pub namespaces: Vec<String>,
    /// Log directories removed.
    pub log_dirs: Vec<PathBuf>,
}

/// Whether process `pid` exists (a zombie counts: its parent still runs).
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether `prefix` belongs to a run that is gone.
fn dead(prefix: &Prefix) -> bool {
    prefix.pid() != std::process::id() && !alive(prefix.pid())
}

/// Namespaces of our family whose process is gone.
pub fn leftover_namespaces() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| Prefix::of_namespace(n).is_some_and(|p| dead(&p)))
        .collect();
    out.sort();
    out
}

/// Log directories of our family whose process is gone and that were not kept.
fn leftover_log_dirs() -> Vec<PathBuf> {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(LOG_DIR_START))
                .and_then(Prefix::parse)
                .is_some_and(|p| dead(&p))
        })
        .map(|e| e.path())
        .filter(|p| !p.join(KEEP_MARKER).exists())
        .collect()
}

/// Removes every leftover of killed runs of our family (see the module
/// docs); returns what it removed. Blocking: it runs `ip` a few times per
/// leftover.
pub fn sweep() -> Result<Swept, Error> {
    let mut swept = Swept::default();
    for ns in leftover_namespaces() {
        tracing::info!(namespace = %ns, "removing a namespace left by a run that is gone");
        remove_namespace(&ns)?;
        swept.namespaces.push(ns);
    }
    for dir in leftover_log_dirs() {
        if std::fs::remove_dir_all(&dir).is_ok() {
            swept.log_dirs.push(dir);
        }
    }
    Ok(swept)
}

/// Kills every process in namespace `ns` and deletes it; its links go with
/// it. A namespace already gone (another sweep was first) is not an error.
pub(crate) fn remove_namespace(ns: &str) -> Result<(), Error> {
    let path = Path::new(NETNS_DIR).join(ns);
    if !path.exists() {
        return Ok(());
    }
    if let Ok(pids) = cmd::run_blocking("ip", &["netns", "pids", ns], None) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // ESRCH: it exited meanwhile.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    match cmd::run_blocking("ip", &["netns", "delete", ns], None) {
        Ok(_) => Ok(()),
        Err(_) if !path.exists() => Ok(()),
        Err(e) => Err(e),
    }
}
