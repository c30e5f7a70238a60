//! Connection requests from call tasks ([`Command::Connect`]): be
//! connected to a peer, dialing unless already; first closing relayed
//! connections through routers the peer left (or ones being closed for
//! idleness) and waiting until they are gone, or dialing anew when the
//! peer is reached only through routers it no longer lists. Waiters are
//! bounded ([`MAX_WAITERS`]); each is answered when its connection comes
//! up, its dial fails, or (the asker having given up) dropped.
//!
//! [`Command::Connect`]: crate::shared::Command::Connect

use std::collections::HashMap;

use libp2p::swarm::ConnectionId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId};
use tokio::sync::oneshot;

use super::Core;

/// Most connection waiters held at once (call tasks waiting for a dial).
pub(crate) const MAX_WAITERS: usize = 4096;

/// A reply to a connection request.
pub(crate) type Reply = oneshot::Sender<Result<(), String>>;

/// A connect that waits for stale relayed connections to close first.
struct FreshWait {
    peer: PeerId,
    closing: Vec<ConnectionId>,
    addrs: Vec<Multiaddr>,
    reply: Reply,
}

/// Connection requests waiting for the swarm.
#[derive(Default)]
pub(crate) struct Waits {
    /// Waiting for a connection to the peer to come up.
    dials: HashMap<PeerId, Vec<Reply>>,
    /// Waiting for stale connections to close (at most [`MAX_WAITERS`]).
    fresh: Vec<FreshWait>,
}

impl Waits {
    /// Waiters for a dial, all peers.
    fn dialing(&self) -> usize {
        self.dials.values().map(Vec::len).sum()
    }
}

impl Core {
    pub(super) fn on_connect(
        &mut self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        keep_via: Option<Vec<PeerId>>,
        listed: Option<Vec<PeerId>>,
        reply: Reply,
    ) {
        // Connections being closed for idleness must be gone
        // before the call opens its stream.
        let mut stale = self.conns.open_among(&peer, &self.idle_closing);
        if let Some(keep) = keep_via {
            stale.extend(self.conns.stale(&peer, &keep));
            stale.sort();
            stale.dedup();
        }
        if !stale.is_empty() {
            self.waits.fresh.retain(|w| !w.reply.is_closed());
            if self.waits.fresh.len() >= MAX_WAITERS {
                let _ = reply.send(Err("too many connections pending".into()));
                return;
            }
            tracing::debug!(%peer, stale = stale.len(), "closing relayed connections through routers the peer left (or idle)");
            for id in &stale {
                self.swarm.close_connection(*id);
            }
            self.waits.fresh.push(FreshWait {
                peer,
                closing: stale,
                addrs,
                reply,
            });
            return;
        }
        // Reached only through routers the peer no longer lists
        // (it left them or is leaving them): a new connection
        // through a listed one, the old ones left to their calls.
        let anew = listed.as_ref().is_some_and(|routers| {
            self.swarm.is_connected(&peer) && !self.conns.usable(&peer, routers)
        });
        if anew {
            tracing::debug!(%peer, "connected only through routers the peer no longer lists: dialing anew");
        }
        self.connect_now(peer, addrs, reply, anew);
    }

    /// Replies once connected to `peer`, dialing `addrs` unless already
    /// (or, `anew`, once a new connection is up).
    pub(super) fn connect_now(
        &mut self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        reply: Reply,
        anew: bool,
    ) {
        if self.swarm.is_connected(&peer) && !anew {
            let _ = reply.send(Ok(()));
            return;
        }
        if self.waits.dialing() >= MAX_WAITERS {
            let _ = reply.send(Err("too many connections pending".into()));
            return;
        }
        if anew && let Some(w) = self.waits.dials.get_mut(&peer) {
            // A new connection is already being dialed for other
            // calls: wait for the same one.
            w.retain(|s| !s.is_closed());
            if !w.is_empty() {
                w.push(reply);
                return;
            }
        }
        let condition = if anew {
            PeerCondition::Always
        } else {
            PeerCondition::DisconnectedAndNotDialing
        };
        let opts = DialOpts::peer_id(peer)
            .addresses(addrs)
            .condition(condition)
            .build();
        match self.swarm.dial(opts) {
            Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {
                let w = self.waits.dials.entry(peer).or_default();
                w.retain(|s| !s.is_closed());
                w.push(reply);
            }
            Err(e) => {
                let _ = reply.send(Err(format!("dial {peer}: {e}")));
            }
        }
    }

    /// After a connection to `peer` closed: connects waiting for it go on.
    pub(super) fn resume_fresh(&mut self, peer: PeerId) {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waits.fresh)
            .into_iter()
            .partition(|w| w.peer == peer && !self.conns.any_open(&peer, &w.closing));
        self.waits.fresh = waiting;
        for w in ready {
            self.connect_now(w.peer, w.addrs, w.reply, false);
        }
    }

    /// Answers everyone waiting for a connection to `peer`.
    pub(super) fn resolve_waiters(&mut self, peer: &PeerId, result: Result<(), String>) {
        if let Some(ws) = self.waits.dials.remove(peer) {
            for w in ws {
                let _ = w.send(result.clone());
            }
        }
    }
}
