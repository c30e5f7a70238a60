//! Free loopback ports for child programs, chosen below the kernel's ephemeral range.
//!
//! A port taken from the ephemeral range (what binding port 0 returns) can be
//! handed by the kernel to an outgoing connection between the moment we
//! release it and the moment the child binds it; with thousands of members
//! dialing on loopback that race is real (the reference project lost 392
//! members to it). So ports come from below `ip_local_port_range`, checked
//! free by binding them, and are never reused within a run.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

use rand::Rng;

use crate::error::{LadderError, Result};

/// Lowest port handed out.
const MIN_PORT: u16 = 15_000;
/// Attempts before giving up on finding a free port.
const MAX_ATTEMPTS: usize = 2_000;

static TAKEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// The first port of the kernel's ephemeral range (32768 when unreadable).
pub fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32_768)
}

/// A free TCP port on 127.0.0.1 below the ephemeral range, not handed out before in this process.
pub fn free_port() -> Result<u16> {
    let high = ephemeral_start().max(MIN_PORT + 100);
    let mut rng = rand::thread_rng();
    let mut taken = TAKEN.lock().expect("port set lock is never poisoned");
    let taken = taken.get_or_insert_with(HashSet::new);
    for _ in 0..MAX_ATTEMPTS {
        let port = rng.gen_range(MIN_PORT..high);
        if taken.contains(&port) {
            continue;
        }
        if TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok() {
            taken.insert(port);
            return Ok(port);
        }
    }
    Err(LadderError::Process(format!(
        "no free loopback port in {MIN_PORT}..{high} after {MAX_ATTEMPTS} attempts"
    )))
}

/// A free loopback socket address (see [`free_port`]).
pub fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let a = free_port().expect("port");
        let b = free_port().expect("port");
        assert_ne!(a, b);
        assert!(a < ephemeral_start().max(MIN_PORT + 100));
        assert!(a >= MIN_PORT);
    }
}
