//! `--cpu-quota CORES`: the whole local run under a CPU cap, so any
//! machine can reproduce a slower one.
//!
//! The ladder creates a cgroup of its own, `agentmesh-ladder.<pid>`, beside
//! the one it runs in (cgroup v2: under the unified root, with the `cpu`
//! controller enabled for its children; v1: in the `cpu` hierarchy), sets
//! its quota to `CORES × period` per period of [`PERIOD_US`], and moves
//! itself into it before starting anything: the control plane, routers and
//! fleet workers it starts then inherit it. At the end it moves itself back
//! and removes the cgroup, reading the throttling counters first. Cgroups of
//! that name left by a crashed run (its pid no longer alive) are removed
//! when the next run starts; one still holding processes is named in a
//! warning and left alone.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{LadderError, Result};

/// The CFS period the quota is set for, microseconds.
pub const PERIOD_US: u64 = 100_000;
/// Smallest quota the kernel accepts, microseconds.
const MIN_QUOTA_US: u64 = 1_000;
/// Name prefix of the ladder's cgroups.
const PREFIX: &str = "agentmesh-ladder.";

/// Which cgroup interface the machine offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// cgroup v1, the `cpu` controller's hierarchy (`cpu.cfs_quota_us`).
    V1,
    /// cgroup v2, the unified hierarchy (`cpu.max`).
    V2,
}

/// What the cap did, for the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuCapRecord {
    /// The cap, cores.
    pub cores: f64,
    /// `v1` or `v2`.
    pub version: Option<Version>,
    /// The cgroup's directory.
    pub path: String,
    /// CFS periods that ran.
    pub periods: u64,
    /// Periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Time its tasks were throttled, seconds.
    pub throttled_secs: f64,
}

/// Where the `cpu` controller can be used: the directory under which the
/// ladder's cgroup goes, and the interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    /// The parent of the ladder's cgroup.
    pub parent: PathBuf,
}

/// The quota for `cores` per [`PERIOD_US`], microseconds.
pub fn quota_us(cores: f64) -> u64 {
    ((cores * PERIOD_US as f64).round() as u64).max(MIN_QUOTA_US)
}

/// Finds the `cpu` controller from `/proc/self/mountinfo` and
/// `/proc/self/cgroup` (passed in, for tests): v2 if the unified hierarchy
/// offers `cpu` (its `cgroup.controllers`, read by `controllers`), else the
/// v1 `cpu` hierarchy, the ladder's cgroup beside its current one.
pub fn find(
    mountinfo: &str,
    self_cgroup: &str,
    controllers: impl Fn(&Path) -> Option<String>,
) -> Option<Hierarchy> {
    let mounts: Vec<(PathBuf, &str, Vec<&str>)> = mountinfo
        .lines()
        .filter_map(|l| {
            // "... mount_point options - fstype source super_options"
            let (left, right) = l.split_once(" - ")?;
            let point = PathBuf::from(left.split_whitespace().nth(4)?);
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let opts = r.nth(1).unwrap_or("").split(',').collect();
            Some((point, fstype, opts))
        })
        .collect();
    for (point, fstype, _) in &mounts {
        if *fstype == "cgroup2"
            && controllers(point).is_some_and(|c| c.split_whitespace().any(|x| x == "cpu"))
        {
            return Some(Hierarchy {
                version: Version::V2,
                parent: point.clone(),
            });
        }
    }
    let (point, _, _) = mounts
        .iter()
        .find(|(_, fstype, opts)| *fstype == "cgroup" && opts.contains(&"cpu"))?;
    // "N:cpu,cpuacct:/path" (the controllers of that hierarchy, comma-separated).
    let current = self_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        ctrls.split(',').any(|c| c == "cpu").then_some(path)
    })?;
    let parent = point.join(current.trim_start_matches('/'));
    Some(Hierarchy {
        version: Version::V1,
        parent,
    })
}

/// The cgroup a run caps itself in; see the module docs.
#[derive(Debug)]
pub struct CpuCap {
    hierarchy: Hierarchy,
    dir: PathBuf,
    /// Where the ladder ran before (its `cgroup.procs` takes it back).
    home: PathBuf,
    cores: f64,
    removed: bool,
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value)
        .map_err(|e| LadderError::io(format!("writing {value:?} to {}", path.display()), e))
}

/// Removes the ladder's cgroups under `parent` whose run is gone (their
/// pid is not alive); returns the names removed. Ones still holding
/// processes cannot be removed and are warned about.
pub fn remove_leftovers(parent: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = fs::read_dir(parent) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match fs::remove_dir(e.path()) {
            Ok(()) => removed.push(name),
            Err(err) => eprintln!(
                "ladder: warning: cgroup {} of a run that is gone (pid {pid}) still holds \
                 processes, left alone: {err}",
                e.path().display()
            ),
        }
    }
    removed
}

impl CpuCap {
    /// Creates the cgroup capped at `cores` and moves this process into it.
    pub fn create(cores: f64) -> Result<Self> {
        if !(cores.is_finite() && cores > 0.0) {
            return Err(LadderError::Args(format!(
                "--cpu-quota must be a positive number of cores, not {cores}"
            )));
        }
        let read =
            |p: &str| fs::read_to_string(p).map_err(|e| LadderError::io(format!("reading {p}"), e));
        let hierarchy = find(
            &read("/proc/self/mountinfo")?,
            &read("/proc/self/cgroup")?,
            |p| fs::read_to_string(p.join("cgroup.controllers")).ok(),
        )
        .ok_or_else(|| {
            LadderError::Args(
                "--cpu-quota: no cgroup hierarchy with the cpu controller on this machine \
                 (neither cgroup v2 offering cpu nor a v1 cpu mount)"
                    .into(),
            )
        })?;
        for name in remove_leftovers(&hierarchy.parent) {
            eprintln!("ladder: removed cgroup {name} left by a run that is gone");
        }
        // v1: back to where it ran; v2: to the root (v2 forbids processes
        // in an inner cgroup that enables controllers for its children).
        let home = hierarchy.parent.clone();
        let dir = hierarchy
            .parent
            .join(format!("{PREFIX}{}", std::process::id()));
        if hierarchy.version == Version::V2 {
            let subtree = hierarchy.parent.join("cgroup.subtree_control");
            let enabled = fs::read_to_string(&subtree).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "cpu") {
                write(&subtree, "+cpu")?;
            }
        }
        fs::create_dir(&dir).map_err(|e| {
            LadderError::io(
                format!(
                    "--cpu-quota: creating cgroup {} (needs root)",
                    dir.display()
                ),
                e,
            )
        })?;
        let mut cap = Self {
            hierarchy,
            dir,
            home,
            cores,
            removed: false,
        };
        let quota = quota_us(cores);
        let set = match cap.hierarchy.version {
            Version::V2 => write(&cap.dir.join("cpu.max"), &format!("{quota} {PERIOD_US}")),
            Version::V1 => write(&cap.dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())
                .and_then(|()| write(&cap.dir.join("cpu.cfs_quota_us"), &quota.to_string())),
        };
        set.and_then(|()| {
            write(
                &cap.dir.join("cgroup.procs"),
                &std::process::id().to_string(),
            )
        })
        .inspect_err(|_| cap.remove())?;
        eprintln!(
            "ladder: the run is capped at {cores} cores (cgroup {:?} {}, quota {quota} µs per {PERIOD_US} µs)",
            cap.hierarchy.version,
            cap.dir.display()
        );
        Ok(cap)
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the throttling counters, moves this process back and removes
    /// the cgroup (children have ended by then; a cgroup still holding
    /// processes is left, with a warning).
    pub fn finish(mut self) -> CpuCapRecord {
        let record = self.record();
        self.remove();
        record
    }

    /// The cap and its throttling counters now.
    pub fn record(&self) -> CpuCapRecord {
        let stat = fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let throttled_secs = match self.hierarchy.version {
            Version::V2 => field("throttled_usec ") as f64 / 1e6,
            Version::V1 => field("throttled_time ") as f64 / 1e9,
        };
        CpuCapRecord {
            cores: self.cores,
            version: Some(self.hierarchy.version),
            path: self.dir.display().to_string(),
            periods: field("nr_periods "),
            throttled_periods: field("nr_throttled "),
            throttled_secs,
        }
    }

    fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        let _ = fs::write(
            self.home.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        // Children may take a moment to be reaped out of it.
        for _ in 0..50 {
            match fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        eprintln!(
            "ladder: warning: cgroup {} still holds processes; the next run removes it",
            self.dir.display()
        );
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 30 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V1_SELF: &str = "2:cpuacct:/\n1:cpu:/jobs/ci\n0::/\n";

    #[test]
    fn finds_v1_beside_the_current_cgroup_when_v2_offers_no_cpu() {
        let h = find(V1_MOUNTS, V1_SELF, |_| Some(String::new())).expect("found");
        assert_eq!(h.version, Version::V1);
        assert_eq!(h.parent, PathBuf::from("/sys/fs/cgroup/cpu/jobs/ci"));
        // A combined cpu,cpuacct hierarchy counts as cpu.
        let mounts = "31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let h = find(mounts, "3:cpu,cpuacct:/\n", |_| None).expect("found");
        assert_eq!(h.parent, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn prefers_v2_when_it_offers_cpu_and_finds_nothing_without_either() {
        let mounts = "40 30 0:35 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
        let h = find(mounts, "0::/user.slice\n", |p| {
            (p == Path::new("/sys/fs/cgroup")).then(|| "cpuset cpu io memory pids\n".to_string())
        })
        .expect("found");
        assert_eq!(
            h,
            Hierarchy {
                version: Version::V2,
                parent: PathBuf::from("/sys/fs/cgroup")
            }
        );
        assert_eq!(find(mounts, "0::/\n", |_| Some("memory pids".into())), None);
    }

    #[test]
    fn the_quota_is_cores_per_period_and_never_below_the_kernels_minimum() {
        assert_eq!(quota_us(1.4), 140_000);
        assert_eq!(quota_us(2.0), 200_000);
        assert_eq!(quota_us(0.001), MIN_QUOTA_US);
    }

    #[test]
    fn leftovers_of_runs_that_are_gone_are_removed_and_others_kept() {
        let parent = tempfile::tempdir().expect("tempdir");
        // pid 0 is never a process of ours; u32::MAX is never alive.
        let gone = parent.path().join(format!("{PREFIX}{}", u32::MAX));
        let alive = parent
            .path()
            .join(format!("{PREFIX}{}", std::process::id()));
        let other = parent.path().join("someone-else.1");
        for d in [&gone, &alive, &other] {
            fs::create_dir(d).expect("mkdir");
        }
        let removed = remove_leftovers(parent.path());
        assert_eq!(removed, vec![format!("{PREFIX}{}", u32::MAX)]);
        assert!(!gone.exists() && alive.exists() && other.exists());
    }

    /// A real cap, where this machine allows one (root, a cpu controller):
    /// created with the quota, this process inside, removed afterwards.
    #[test]
    fn a_real_cgroup_is_created_capped_and_removed() {
        let cap = match CpuCap::create(0.5) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIPPED: cannot create a cgroup here: {e}");
                return;
            }
        };
        let dir = cap.dir().to_path_buf();
        let procs = fs::read_to_string(dir.join("cgroup.procs")).expect("procs");
        assert!(
            procs.lines().any(|l| l == std::process::id().to_string()),
            "this process is in it: {procs}"
        );
        let record = cap.finish();
        assert_eq!(record.cores, 0.5);
        assert!(!dir.exists(), "removed");
    }
}
