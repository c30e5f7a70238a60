//! A router released after a go-away keeps its connection while calls
//! through it finish. The router waits for them (its drain ends once no
//! member and no circuit is left, or at `--drain-grace-secs`); closing our
//! connection at release would cut every circuit riding on it: a provider's
//! inbound calls through the old router, a caller's calls through it.
//!
//! At release the reservation is already given up and our records no longer
//! name the router, so no new circuit reaches us through it. Each tick, a
//! relayed connection through a lingering router closes as soon as its peer
//! has no call in flight (a call arriving meanwhile waits for that close and
//! dials afresh, as for an idle close); the router's own connection closes
//! once none is left, or `--shutdown-grace-secs` after the release (the
//! grace a node gives its calls when it stops) at the latest.

use std::time::Duration;

use libp2p::PeerId;
use tokio::time::Instant;

use super::Core;
use crate::peer_calls::Activity;

impl Core {
    /// Releases `router` after a go-away (shunned for `shun`): forgotten at
    /// once, its connection closed now if no relayed connection runs through
    /// it, else once those are done.
    pub(super) fn release_router(&mut self, router: PeerId, shun: Duration) {
        self.forget_router(router, shun);
        if self.conns.through(&router).is_empty() {
            let _ = self.swarm.disconnect_peer_id(router);
            return;
        }
        let until = Instant::now() + Duration::from_secs(self.shared.config.shutdown_grace_secs);
        tracing::debug!(%router, "released; its connection stays while calls through it finish");
        self.lingering.insert(router, until);
    }

    /// Closes what lingers and is no longer in use (see the module doc).
    pub(super) fn close_lingering(&mut self, now: Instant) {
        if self.lingering.is_empty() {
            return;
        }
        let routers: Vec<(PeerId, Instant)> =
            self.lingering.iter().map(|(r, t)| (*r, *t)).collect();
        for (router, until) in routers {
            // Attached again meanwhile (a go-away's shun can be short):
            // the connection is in use as a router's again.
            if self.slots.contains_key(&router) {
                self.lingering.remove(&router);
                continue;
            }
            let mut left = 0;
            for r in self.conns.through(&router) {
                left += 1;
                if self.idle_closing.contains(&r.id)
                    || (now < until && self.shared.peer_calls.idle(&r.peer) == Activity::Busy)
                {
                    continue;
                }
                tracing::debug!(peer = %r.peer, %router, "closing a relayed connection through a released router");
                self.swarm.close_connection(r.id);
                self.idle_closing.insert(r.id);
            }
            if left == 0 || now >= until {
                self.lingering.remove(&router);
                let _ = self.swarm.disconnect_peer_id(router);
            }
        }
    }
}
