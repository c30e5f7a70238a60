//! [`ReuseLog`]: which destinations the member's TCP transport last
//! dialled from a fresh port instead of its listening port
//! (`crate::transport::reuse`). The transport writes it; the engine reads
//! it before taking a router's observed address as our mapping.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// Destinations remembered as dialled from a fresh port, at most.
const MAX_LOGGED: usize = 64;

/// Destinations whose last dial left from a fresh port instead of the
/// listening one (see the module doc). Written by the transport only;
/// the engine reads it. Bounded to [`MAX_LOGGED`], oldest forgotten.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReuseLog {
    fresh: Arc<Mutex<VecDeque<SocketAddr>>>,
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
}
