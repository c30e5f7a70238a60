//! Closing relayed connections to peers without calls: after
//! `--relayed-idle-secs` on the calling side, twice that on the provider
//! side (see [`crate::peer_calls`]), but never while a punch runs on the
//! connection (for at most the punch window). A connect arriving while such a close
//! is under way waits for it to finish, so the call never opens its stream
//! on the closing connection.

use std::time::Duration;

use tokio::time::Instant;

use super::Engine;
use crate::metrics::DirectionLabel;
use crate::peer_calls::Activity;

/// Idle peers are forgotten this long after the window (bounds the map).
const FORGET_AFTER: Duration = Duration::from_secs(60);

impl Engine {
    /// Closes relayed connections whose peer has had no call for the window.
    pub(super) fn close_idle_relayed(&mut self, now: Instant) {
        let window = self.node.config.connections.relayed_idle;
        if window.is_zero() {
            return;
        }
        for r in self.conns.relayed() {
            // A punch running on it would be cut short (dcutr reports no
            // result then, and the next call would go relayed again).
            if self.idle_closing.contains(&r.id)
                || self.swarm.behaviour().direct.punch_runs_on(r.id)
            {
                continue;
            }
            let idle_since = match self.node.peer_calls.idle(&r.peer) {
                Activity::Busy => continue,
                Activity::IdleSince(t) => t.max(r.since),
                Activity::Unknown => r.since,
            };
            // The provider side waits longer: the caller closes first, and
            // a caller about to reuse its circuit rarely sees it close.
            let wait = if r.outbound { window } else { window * 2 };
            if now.saturating_duration_since(idle_since) < wait {
                continue;
            }
            let direction = if r.outbound { "outbound" } else { "inbound" };
            tracing::debug!(peer = %r.peer, direction, "closing an idle relayed connection");
            self.node
                .metrics
                .calls
                .relayed_idle_closed
                .get_or_create(&DirectionLabel { direction })
                .inc();
            self.swarm.close_connection(r.id);
            self.idle_closing.insert(r.id);
        }
        self.node.peer_calls.prune(now, window * 2 + FORGET_AFTER);
    }
}
