//! Resident memory and CPU time of a child process (or of a server and
//! its children), from `/proc/PID/{status,stat,smaps_rollup}`.

/// A process's resident set size in bytes (`VmRSS`), if readable.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "VmRSS:",
    )
}

/// A process's peak resident set size so far in bytes (`VmHWM`), if readable.
///
/// Why: what a burst of traffic made a process hold at its worst, which
/// the RSS read after the burst (allocators keep freed pages) can hide or
/// overstate.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "VmHWM:",
    )
}

/// Resident memory split by what backs it, bytes.
///
/// Why: code and data pages of the binary (file-backed) are paged in by
/// whatever ran and count in RSS, but they are shared and the kernel can
/// drop them; memory the process holds is the anonymous part. Telling
/// them apart says whether RSS after a peak is the heap or only pages of
/// code the peak touched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RssSplit {
    /// `RssAnon`: heap, stacks and other private anonymous pages.
    pub anon: u64,
    /// `RssFile` + `RssShmem`: pages backed by files (the binary) or shared memory.
    pub file: u64,
}

/// A process's RSS in bytes and its [`RssSplit`] (Linux ≥ 4.5) from one
/// read of `/proc/PID/status`; `None` if unreadable.
pub fn rss_with_split(pid: u32) -> Option<(u64, Option<RssSplit>)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((status_bytes(&status, "VmRSS:")?, parse_rss_split(&status)))
}

fn parse_rss_split(status: &str) -> Option<RssSplit> {
    Some(RssSplit {
        anon: status_bytes(status, "RssAnon:")?,
        file: status_bytes(status, "RssFile:")? + status_bytes(status, "RssShmem:").unwrap_or(0),
    })
}

/// A `Key:   123 kB` line of `/proc/PID/status`, in bytes.
fn status_bytes(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A process's user + system CPU time in seconds, if readable.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks_per_sec())
}

/// Open file descriptors of a process, if readable.
pub fn open_fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count())
}

/// The soft limit on open files of this process (`Max open files` in `/proc/self/limits`).
pub fn nofile_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// What a server made of a parent and its children (PostgreSQL's
/// postmaster and its backends) uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TreeUsage {
    /// CPU seconds of the parent, of its children that have exited (the
    /// kernel adds them to the parent once reaped) and of those alive.
    pub cpu_secs: f64,
    /// Proportional set size summed over the parent and its live children,
    /// bytes: shared memory (PostgreSQL's shared buffers) counted once in
    /// all, where RSS would count it in every backend.
    pub pss_bytes: u64,
    /// Processes counted (the parent and its live children).
    pub processes: u32,
}

/// [`TreeUsage`] of `pid` and its direct children, if `pid` is readable.
pub fn tree_usage(pid: u32) -> Option<TreeUsage> {
    let (own, reaped) = stat_cpu(pid)?;
    let mut u = TreeUsage {
        cpu_secs: own + reaped,
        pss_bytes: pss_bytes(pid).unwrap_or(0),
        processes: 1,
    };
    for child in children(pid) {
        // A child may exit between the listing and the read: skip it (its
        // CPU reaches the parent's reaped time).
        if let Some((cpu, _)) = stat_cpu(child) {
            u.cpu_secs += cpu;
            u.pss_bytes += pss_bytes(child).unwrap_or(0);
            u.processes += 1;
        }
    }
    Some(u)
}

/// Live children of `pid`, from each process's parent in `/proc/*/stat`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&c| parent_of(c) == Some(pid))
        .collect()
}

/// The fields of `/proc/PID/stat` after the command name.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// (own user + system, reaped children's user + system) CPU seconds.
fn stat_cpu(pid: u32) -> Option<(f64, f64)> {
    let f = stat_fields(pid)?;
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let hz = clock_ticks_per_sec();
    Some(((n(11)? + n(12)?) / hz, (n(13)? + n(14)?) / hz))
}

/// `Pss:` of `/proc/PID/smaps_rollup` (Linux ≥ 4.14), bytes.
fn pss_bytes(pid: u32) -> Option<u64> {
    status_bytes(
        &std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?,
        "Pss:",
    )
}

fn clock_ticks_per_sec() -> f64 {
    // USER_HZ is 100 on every Linux ABI the ladder runs on.
    100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).expect("rss") > 0);
        assert!(cpu_secs(pid).expect("cpu") >= 0.0);
        assert!(open_fds(pid).expect("fds") > 0);
        assert!(nofile_limit().expect("limit") > 0);
        let (rss, split) = rss_with_split(pid).expect("status");
        let split = split.expect("split");
        assert!(rss > 0);
        assert!(split.anon > 0 && split.file > 0, "{split:?}");
    }

    #[test]
    fn a_tree_counts_its_children_and_their_cpu() {
        // A child that burns CPU, then exits and is reaped: its time moves
        // to this process's reaped time, and the tree keeps it.
        let me = std::process::id();
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 30",
            ])
            .spawn()
            .expect("spawn sh");
        let alive = loop {
            let u = tree_usage(me).expect("tree");
            if u.processes >= 2 && u.cpu_secs > 0.0 {
                break u;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(alive.pss_bytes > 0, "{alive:?}");
        assert!(children(me).contains(&child.id()));
        child.kill().expect("kill");
        child.wait().expect("reaped");
        let after = tree_usage(me).expect("tree");
        assert!(!children(me).contains(&child.id()));
        assert!(
            after.cpu_secs + 0.02 >= alive.cpu_secs,
            "reaped CPU stays counted: {after:?} after {alive:?}"
        );
    }

    #[test]
    fn split_adds_shared_memory_to_file_pages() {
        let status = "Name:\tx\nVmRSS:\t   30 kB\nRssAnon:\t   10 kB\nRssFile:\t   15 kB\nRssShmem:\t    5 kB\n";
        assert_eq!(status_bytes(status, "VmRSS:"), Some(30 * 1024));
        assert_eq!(
            parse_rss_split(status),
            Some(RssSplit {
                anon: 10 * 1024,
                file: 20 * 1024
            })
        );
        assert_eq!(parse_rss_split("VmRSS:\t 1 kB\n"), None);
    }
}
