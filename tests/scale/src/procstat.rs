//! Resident memory and CPU time of a child process, from `/proc/PID/{status,stat}`.

/// A process's resident set size in bytes (`VmRSS`), if readable.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "VmRSS:",
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
