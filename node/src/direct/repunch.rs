//! Punching again when our observed address changes (a NAT rebinding, a
//! new network): the address dcutr offers peers follows the routers'
//! observation, and a peer we fell back from, or whose punch failed, is
//! punched again at once rather than after its backoff.
//!
//! **Candidates.** dcutr keeps every external address candidate it was
//! ever fed (an LRU of 20) and offers them all, and each of its relayed
//! connection handlers copies the list when it is made. So when the
//! address our routers agree on changes, the wrapper replaces its dcutr
//! behaviour with a fresh one fed only the new address (`Behaviour::observe`);
//! relayed connections made from then on offer only it. (Our relayed
//! connections ran over our router connections, which a rebinding kills:
//! the next call's circuit is a new relayed connection.) The fresh dcutr
//! is told only of the connections it saw established
//! ([`Repunch::inner_knows`]; dcutr panics on the close of a direct
//! connection it never saw).
//!
//! **Re-punches.** After a change, the first relayed connection to each
//! peer we punched before the change is punched even when that peer is in
//! its punch backoff (a failed punch, or a fallback from a dead direct
//! path: both were about the old address), counted
//! `upgrade_attempts_total{result="repunched"}`. Bounded: one per peer per
//! change, and at most [`MAX_EARLY_REPUNCHES`] in a row without a direct
//! connection coming up (a flapping address then waits out the ordinary
//! jittered backoff, which keeps doubling: failures are not reset by a
//! change). The peers remembered are bounded by [`MAX_PEERS`].

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

/// Early re-punches of one peer in a row without a success, at most.
pub(crate) const MAX_EARLY_REPUNCHES: u32 = 3;
/// Peers whose last punch is remembered, at most.
pub(crate) const MAX_PEERS: usize = 4096;

/// One peer's punches.
#[derive(Debug, Clone, Copy)]
struct Punched {
    /// The last punch (or reversal) started.
    last: Instant,
    /// Re-punches past the backoff since the last success.
    early: u32,
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Repunch {
    /// The last address offered to peers (kept while no address is known,
    /// so a return to the same one is no change).
    offered: Option<SocketAddr>,
    /// When it last changed from one address to another.
    changed_at: Option<Instant>,
    punched: HashMap<PeerId, Punched>,
    /// Direct connections the current dcutr behaviour saw established.
    inner_direct: HashSet<ConnectionId>,
}

impl Repunch {
    /// `addr` is the address we offer from `now`. True when it replaces
    /// another one offered before: the dcutr behaviour must be replaced.
    pub(crate) fn offer(&mut self, addr: SocketAddr, now: Instant) -> bool {
        let changed = self.offered.is_some_and(|a| a != addr);
        self.offered = Some(addr);
        if changed {
            self.changed_at = Some(now);
            self.inner_direct.clear();
        }
        changed
    }

    /// Whether the next punch to `peer` is a re-punch: we punched it
    /// before our address last changed and not since.
    pub(crate) fn due(&self, peer: &PeerId) -> bool {
        match (self.changed_at, self.punched.get(peer)) {
            (Some(changed), Some(p)) => p.last < changed,
            _ => false,
        }
    }

    /// Whether a re-punch of `peer` may skip its backoff.
    pub(crate) fn may_skip_backoff(&self, peer: &PeerId) -> bool {
        self.due(peer)
            && self
                .punched
                .get(peer)
                .is_some_and(|p| p.early < MAX_EARLY_REPUNCHES)
    }

    /// A punch or reversal to `peer` starts at `now`; `early` when it
    /// skipped the backoff.
    pub(crate) fn started(&mut self, peer: PeerId, now: Instant, early: bool) {
        if self.punched.len() >= MAX_PEERS && !self.punched.contains_key(&peer) {
            // Forget the oldest half: those re-punch on their backoff.
            let mut lasts: Vec<Instant> = self.punched.values().map(|p| p.last).collect();
            lasts.sort();
            let cut = lasts[lasts.len() / 2];
            self.punched.retain(|_, p| p.last > cut);
        }
        let p = self.punched.entry(peer).or_insert(Punched {
            last: now,
            early: 0,
        });
        p.last = now;
        if early {
            p.early = p.early.saturating_add(1);
        }
    }

    /// A direct connection to `peer` came up: its early re-punches start
    /// over.
    pub(crate) fn succeeded(&mut self, peer: &PeerId) {
        if let Some(p) = self.punched.get_mut(peer) {
            p.early = 0;
        }
    }

    /// The current dcutr behaviour saw direct connection `id` established.
    pub(crate) fn inner_saw(&mut self, id: ConnectionId) {
        self.inner_direct.insert(id);
    }

    /// Whether the current dcutr behaviour knows direct connection `id`
    /// (forgotten: the close is its last event).
    pub(crate) fn inner_knows(&mut self, id: &ConnectionId) -> bool {
        self.inner_direct.remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_new_address_makes_each_earlier_peer_due_once_and_early_repunches_are_bounded() {
        let mut r = Repunch::default();
        let t0 = Instant::now();
        let a: SocketAddr = "198.51.100.1:4500".parse().expect("sa");
        let b: SocketAddr = "198.51.100.1:61234".parse().expect("sa");
        assert!(!r.offer(a, t0), "the first address is no change");
        assert!(!r.offer(a, t0), "nor the same again");
        let peer = PeerId::random();
        r.started(peer, t0, false);
        assert!(!r.due(&peer));
        let t1 = t0 + Duration::from_secs(5);
        assert!(r.offer(b, t1));
        assert!(r.due(&peer) && r.may_skip_backoff(&peer));
        // A peer never punched is no re-punch.
        assert!(!r.due(&PeerId::random()));
        // Once re-punched it is not due again until the next change.
        r.started(peer, t1 + Duration::from_secs(1), true);
        assert!(!r.due(&peer));
        // Changes back and forth: at most MAX_EARLY_REPUNCHES early ones
        // in a row without a success.
        let (mut cur, mut t) = (b, t1);
        for _ in 1..MAX_EARLY_REPUNCHES {
            t += Duration::from_secs(10);
            cur = if cur == a { b } else { a };
            assert!(r.offer(cur, t));
            assert!(r.may_skip_backoff(&peer));
            r.started(peer, t + Duration::from_secs(1), true);
        }
        t += Duration::from_secs(10);
        assert!(r.offer(if cur == a { b } else { a }, t));
        assert!(r.due(&peer) && !r.may_skip_backoff(&peer));
        r.succeeded(&peer);
        assert!(r.may_skip_backoff(&peer));
    }

    #[test]
    fn the_connections_the_current_dcutr_knows_are_forgotten_on_a_change() {
        let mut r = Repunch::default();
        let t0 = Instant::now();
        r.offer("198.51.100.1:4500".parse().expect("sa"), t0);
        r.inner_saw(ConnectionId::new_unchecked(1));
        r.inner_saw(ConnectionId::new_unchecked(2));
        assert!(r.inner_knows(&ConnectionId::new_unchecked(1)));
        assert!(!r.inner_knows(&ConnectionId::new_unchecked(1)), "once");
        assert!(r.offer("198.51.100.1:4501".parse().expect("sa"), t0));
        assert!(!r.inner_knows(&ConnectionId::new_unchecked(2)));
    }

    #[test]
    fn the_peers_remembered_are_bounded() {
        let mut r = Repunch::default();
        let t0 = Instant::now();
        for i in 0..MAX_PEERS as u64 + 10 {
            r.started(PeerId::random(), t0 + Duration::from_millis(i), false);
        }
        assert!(r.punched.len() <= MAX_PEERS);
    }
}
