//! Where the memory budget comes from: `--memory-limit-bytes`, else the
//! cgroup limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), else the
//! flag default. Never the host's RAM. Blocking file reads: call from
//! `spawn_blocking`.

use std::path::Path;

/// cgroup v2 limit file.
const CGROUP_V2: &str = "/sys/fs/cgroup/memory.max";
/// cgroup v1 limit file.
const CGROUP_V1: &str = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
/// cgroup v1 reports "no limit" as a huge number; anything above this is none.
const V1_UNLIMITED_ABOVE: u64 = 1 << 60;

/// Which source set the memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitSource {
    /// `--memory-limit-bytes`.
    Flag,
    /// The cgroup's limit.
    Cgroup,
    /// `--memory-default-limit-bytes`.
    Default,
}

impl LimitSource {
    /// A label for logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Flag => "flag",
            Self::Cgroup => "cgroup",
            Self::Default => "default",
        }
    }
}

/// The memory limit and where it came from.
pub(crate) fn limit(flag: Option<u64>, default: u64) -> (u64, LimitSource) {
    limit_from(flag, default, Path::new(CGROUP_V2), Path::new(CGROUP_V1))
}

fn limit_from(flag: Option<u64>, default: u64, v2: &Path, v1: &Path) -> (u64, LimitSource) {
    if let Some(b) = flag {
        return (b, LimitSource::Flag);
    }
    if let Some(b) = read_limit(v2).or_else(|| read_limit(v1)) {
        return (b, LimitSource::Cgroup);
    }
    (default, LimitSource::Default)
}

/// A cgroup limit file's value, `None` if absent, "max" or effectively unlimited.
fn read_limit(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_limit(&text)
}

fn parse_limit(text: &str) -> Option<u64> {
    let v = text.trim();
    if v == "max" {
        return None;
    }
    v.parse::<u64>().ok().filter(|b| *b < V1_UNLIMITED_ABOVE)
}

/// The share of `limit` the budget may use.
pub(crate) fn budget(limit: u64, percent: u8) -> u64 {
    let pct = u64::from(percent.min(100));
    (u128::from(limit) * u128::from(pct) / 100) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wins_then_cgroup_then_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v2 = dir.path().join("memory.max");
        let v1 = dir.path().join("limit_in_bytes");
        assert_eq!(limit_from(Some(5), 9, &v2, &v1), (5, LimitSource::Flag));
        assert_eq!(limit_from(None, 9, &v2, &v1), (9, LimitSource::Default));
        std::fs::write(&v1, "9223372036854771712\n").expect("write");
        assert_eq!(limit_from(None, 9, &v2, &v1), (9, LimitSource::Default));
        std::fs::write(&v1, "1048576\n").expect("write");
        assert_eq!(
            limit_from(None, 9, &v2, &v1),
            (1048576, LimitSource::Cgroup)
        );
        std::fs::write(&v2, "max\n").expect("write");
        assert_eq!(
            limit_from(None, 9, &v2, &v1),
            (1048576, LimitSource::Cgroup)
        );
        std::fs::write(&v2, "2097152\n").expect("write");
        assert_eq!(
            limit_from(None, 9, &v2, &v1),
            (2097152, LimitSource::Cgroup)
        );
    }

    #[test]
    fn budget_is_a_share() {
        assert_eq!(budget(1000, 75), 750);
        assert_eq!(budget(u64::MAX, 100), u64::MAX);
        assert_eq!(budget(1000, 200), 1000);
    }
}
