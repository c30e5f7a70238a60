//! Names of everything a testbed creates. Each carries the run's prefix:
//! the family `amt`, the creating process id (5 base-36 digits) and a
//! per-process sequence number (2 base-36 digits), e.g. `amt02k9x01`.
//! Namespaces are `PREFIX-HOST`; links are `PREFIX` + a role letter + the
//! host's index, within the kernel's 15-byte interface names.
//!
//! The prefix is how a later run tells a killed run's leftovers (the pid is
//! dead) from another live run's namespaces (the pid is alive), which it
//! never touches.

use std::sync::atomic::{AtomicU16, Ordering};

use crate::error::Error;

/// The family every testbed name starts with.
pub const FAMILY: &str = "amt";

/// Longest interface name the kernel accepts, bytes (`IFNAMSIZ` - 1).
pub const IFNAME_MAX: usize = 15;

/// Longest host name, bytes (namespace names are file names under `/run/netns`).
pub const HOST_NAME_MAX: usize = 32;

/// Base-36 digits of the pid: 36^5 > 4,194,304, Linux's largest `pid_max`.
const PID_DIGITS: usize = 5;
/// Base-36 digits of the sequence number: 1,296 testbeds at once per process.
const SEQ_DIGITS: usize = 2;
/// Sequence numbers wrap at this (36^SEQ_DIGITS).
const SEQ_MODULUS: u16 = 36 * 36;
/// Length of a prefix, bytes.
pub const PREFIX_LEN: usize = FAMILY.len() + PID_DIGITS + SEQ_DIGITS;

const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

/// The next sequence number of this process.
static NEXT_SEQ: AtomicU16 = AtomicU16::new(0);

/// The prefix of one testbed's names: which process made it, and which of
/// that process's testbeds it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    pid: u32,
    seq: u16,
}

impl Prefix {
    /// The prefix of process `pid`'s testbed number `seq` (taken modulo 1,296).
    pub fn new(pid: u32, seq: u16) -> Self {
        Self {
            pid,
            seq: seq % SEQ_MODULUS,
        }
    }

    /// A fresh prefix for a testbed of this process.
    pub fn next() -> Self {
        Self::new(
            std::process::id(),
            NEXT_SEQ.fetch_add(1, Ordering::Relaxed) % SEQ_MODULUS,
        )
    }

    /// The process that made the testbed.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The prefix as it starts every name.
    pub fn as_string(&self) -> String {
        let mut s = String::with_capacity(PREFIX_LEN);
        s.push_str(FAMILY);
        push_base36(&mut s, u64::from(self.pid), PID_DIGITS);
        push_base36(&mut s, u64::from(self.seq), SEQ_DIGITS);
        s
    }

    /// The namespace of host `host` (checked by [`check_host_name`]).
    pub fn namespace(&self, host: &str) -> Result<String, Error> {
        check_host_name(host)?;
        Ok(format!("{}-{host}", self.as_string()))
    }

    /// A link name: the prefix, one role letter and the host's index.
    pub fn link(&self, role: char, index: u32) -> Result<String, Error> {
        let name = format!("{}{role}{index}", self.as_string());
        if name.len() > IFNAME_MAX || !role.is_ascii_lowercase() {
            return Err(Error::Name {
                name,
                why: format!(
                    "an interface name is at most {IFNAME_MAX} bytes and its role a lowercase letter"
                ),
            });
        }
        Ok(name)
    }

    /// The prefix of a namespace name made by [`Prefix::namespace`], if it
    /// is one (anything else, however similar, is not ours).
    pub fn of_namespace(name: &str) -> Option<Self> {
        let (head, host) = name.split_at_checked(PREFIX_LEN)?;
        let host = host.strip_prefix('-')?;
        check_host_name(host).ok()?;
        Self::parse(head)
    }

    /// A prefix written by [`Prefix::as_string`], exactly.
    pub fn parse(s: &str) -> Option<Self> {
        if s.len() != PREFIX_LEN {
            return None;
        }
        let digits = s.strip_prefix(FAMILY)?;
        let (pid, seq) = digits.split_at_checked(PID_DIGITS)?;
        let pid = u32::try_from(parse_base36(pid)?).ok()?;
        let seq = u16::try_from(parse_base36(seq)?).ok()?;
        (seq < SEQ_MODULUS).then_some(Self { pid, seq })
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_string())
    }
}

/// A host name is 1 to 32 bytes of lowercase letters, digits and `-`.
pub fn check_host_name(host: &str) -> Result<(), Error> {
    let ok = !host.is_empty()
        && host.len() <= HOST_NAME_MAX
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Name {
            name: host.to_string(),
            why: format!("a host name is 1 to {HOST_NAME_MAX} of [a-z0-9-]"),
        })
    }
}

fn push_base36(s: &mut String, mut v: u64, width: usize) {
    let mut buf = vec![b'0'; width];
    for slot in buf.iter_mut().rev() {
        *slot = DIGITS[(v % 36) as usize];
        v /= 36;
    }
    s.push_str(std::str::from_utf8(&buf).expect("ascii digits"));
}

fn parse_base36(s: &str) -> Option<u64> {
    s.bytes().try_fold(0u64, |acc, b| {
        let d = DIGITS.iter().position(|&x| x == b)?;
        Some(acc * 36 + d as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_name_parses_back_to_its_prefix() {
        for (pid, seq) in [(1, 0), (4_194_304, 1295), (12345, 7)] {
            let p = Prefix::new(pid, seq);
            assert_eq!(p.as_string().len(), PREFIX_LEN);
            let ns = p.namespace("cp-1").expect("name");
            assert_eq!(Prefix::of_namespace(&ns), Some(p), "{ns}");
        }
    }

    #[test]
    fn names_that_are_not_ours_do_not_parse() {
        let p = Prefix::new(77, 3);
        let ours = p.namespace("h").expect("name");
        for other in [
            "amt".to_string(),
            "docker-1".to_string(),
            format!("{}", p),                         // no host part
            format!("{p}_h"),                         // wrong separator
            format!("{p}-H"),                         // not a host name
            format!("xmt{}", &ours[3..]),             // another family
            format!("{}Z{}", &ours[..4], &ours[5..]), // not base 36
        ] {
            assert_eq!(Prefix::of_namespace(&other), None, "{other}");
        }
    }

    #[test]
    fn links_fit_the_kernel_limit_up_to_four_digit_indices() {
        let p = Prefix::new(4_194_304, 1295);
        assert_eq!(p.link('h', 9999).expect("fits").len(), IFNAME_MAX);
        assert!(p.link('h', 10_000).is_err());
        assert!(p.link('H', 1).is_err());
    }

    #[test]
    fn host_names_are_checked() {
        assert!(check_host_name("router-2").is_ok());
        for bad in ["", "a/b", "A", &"x".repeat(HOST_NAME_MAX + 1)] {
            assert!(check_host_name(bad).is_err(), "{bad}");
        }
    }
}
