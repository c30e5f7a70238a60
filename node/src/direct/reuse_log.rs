//! [`ReuseLog`]: what the direct-connection behaviour and the member's
//! TCP transport (`crate::transport::reuse`) tell each other about dials
//! from the listening port. Two halves, one writer each:
//!
//! - which destinations the transport last dialled from a fresh port
//!   instead of its listening port: the transport writes it; the engine
//!   reads it before taking a router's observed address as our mapping;
//! - which destinations a punch is about to dial: the behaviour marks them
//!   when it lets a punch's dial through, and the transport takes the mark
//!   when it makes the dial. A punch's dial whose tuple is taken never
//!   falls back to a fresh port, in either role: from a fresh port it makes
//!   a new NAT mapping the peer's punch does not know (it fails), or, where
//!   the peer can be reached unsolicited, a second direct connection beside
//!   the one that holds the tuple.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Destinations remembered as dialled from a fresh port, at most.
const MAX_LOGGED: usize = 64;

/// Punch destinations marked and not yet dialled, at most (a punch dials
/// at most `MAX_PUNCH_ADDRS` addresses at once; marks the
/// transport never takes, a QUIC address say, age out here).
const MAX_PUNCH_MARKS: usize = 64;

/// See the module doc. Bounded to [`MAX_LOGGED`] and [`MAX_PUNCH_MARKS`],
/// oldest forgotten.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReuseLog {
    fresh: Arc<Mutex<VecDeque<SocketAddr>>>,
    punches: Arc<Mutex<VecDeque<SocketAddr>>>,
}

impl ReuseLog {
    /// Whether the last dial to `to` left from a fresh port.
    pub(crate) fn dialled_from_fresh_port(&self, to: &SocketAddr) -> bool {
        self.fresh.lock().contains(to)
    }

    pub(crate) fn note(&self, to: SocketAddr, fresh: bool) {
        let mut q = self.fresh.lock();
        q.retain(|a| a != &to);
        if fresh {
            if q.len() >= MAX_LOGGED {
                q.pop_front();
            }
            q.push_back(to);
        }
    }

    /// A punch's dial to `to` is about to be made (the behaviour's half).
    pub(crate) fn mark_punch(&self, to: SocketAddr) {
        let mut q = self.punches.lock();
        if q.len() >= MAX_PUNCH_MARKS {
            q.pop_front();
        }
        q.push_back(to);
    }

    /// Whether the dial to `to` being made is a punch's, taking its mark
    /// (the transport's half).
    pub(crate) fn take_punch(&self, to: &SocketAddr) -> bool {
        let mut q = self.punches.lock();
        let at = q.iter().position(|a| a == to);
        at.and_then(|i| q.remove(i)).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_punch_mark_is_taken_once_and_the_oldest_forgotten_past_the_bound() {
        let log = ReuseLog::default();
        let a: SocketAddr = "192.0.2.1:7000".parse().expect("addr");
        log.mark_punch(a);
        assert!(log.take_punch(&a));
        assert!(!log.take_punch(&a), "a mark is taken once");
        for port in 0..=MAX_PUNCH_MARKS as u16 {
            log.mark_punch(SocketAddr::new(a.ip(), 8000 + port));
        }
        assert!(
            !log.take_punch(&SocketAddr::new(a.ip(), 8000)),
            "the oldest mark was forgotten"
        );
        assert!(log.take_punch(&SocketAddr::new(a.ip(), 8001)));
    }
}
