//! The direct connections to members that are open, and the punches under
//! way, by peer: what keeps one punch to one connection. One owner: the
//! direct behaviour.
//!
//! A punch under way is remembered from its start until its result, or
//! until the relayed connection it runs on closes (dcutr then never
//! reports one: a peer that restarted comes back on a new relayed
//! connection and must be punched at once), at most
//! [`gate::PUNCH_WINDOW`]: a second relayed connection to that peer
//! meanwhile is not punched as well. A direct connection that came up
//! since the punch began means the punch succeeded whatever our own dial
//! does: dcutr's next attempt after our dial failed would make the peer
//! dial again, a second connection, so it is not made. A punch that
//! failed before dcutr dialed ([`Unlanded::NoExchange`]) says nothing of
//! the path and is not backed off.

use std::collections::HashMap;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

use super::gate;

/// Peers with a punch under way, at most (past it a new punch is not
/// remembered: another relayed connection to that peer may punch too).
const MAX_UNDER_WAY: usize = 4096;

/// See the module doc.
#[derive(Debug)]
pub(super) struct Open {
    /// Open direct connections at most (`--direct-max-connections`).
    max: usize,
    /// Open direct connections to members: their peer, when they came up.
    /// Bounded by the open connections.
    by_id: HashMap<ConnectionId, (PeerId, Instant)>,
    /// The same by peer: how many, and when the newest came up.
    by_peer: HashMap<PeerId, (usize, Instant)>,
    /// Punches we started, by peer; until their result or the close of
    /// the relayed connection they run on.
    under_way: HashMap<PeerId, UnderWay>,
}

/// One punch under way.
#[derive(Debug, Clone, Copy)]
struct UnderWay {
    began: Instant,
    /// The relayed connection its exchange runs on.
    on: ConnectionId,
    /// dcutr dialed the peer in it: its exchange got through.
    dialed: bool,
}

/// How a punch ended without a direct connection of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unlanded {
    /// Its exchange got through and the dials failed: the path.
    DialsFailed,
    /// It ended before any dial: the peer declined the exchange (it is
    /// backing off, full, or has direct connections off) or the relayed
    /// connection failed under it. Says nothing of the path.
    NoExchange,
}

impl Default for Open {
    fn default() -> Self {
        Self::with_max(crate::config::DEFAULT_DIRECT_MAX_CONNECTIONS)
    }
}

impl Open {
    /// At most `max` open direct connections (0 acts as 1).
    pub(super) fn with_max(max: usize) -> Self {
        Self {
            max: max.max(1),
            by_id: HashMap::new(),
            by_peer: HashMap::new(),
            under_way: HashMap::new(),
        }
    }

    /// Whether `max` direct connections are open: no punch, reversal or
    /// inbound direct connection is taken until one closes.
    pub(super) fn full(&self) -> bool {
        self.by_id.len() >= self.max
    }

    /// Direct connection `id` to `peer` came up at `now`; false if known.
    pub(super) fn opened(&mut self, id: ConnectionId, peer: PeerId, now: Instant) -> bool {
        if self.by_id.insert(id, (peer, now)).is_some() {
            return false;
        }
        let e = self.by_peer.entry(peer).or_insert((0, now));
        *e = (e.0 + 1, now);
        true
    }

    /// Direct connection `id` closed: its peer, if it was one of ours.
    pub(super) fn closed(&mut self, id: &ConnectionId) -> Option<PeerId> {
        let (peer, _) = self.by_id.remove(id)?;
        let Some((n, _)) = self.by_peer.get(&peer).copied() else {
            return Some(peer);
        };
        let newest = self
            .by_id
            .values()
            .filter(|(p, _)| *p == peer)
            .map(|(_, at)| *at)
            .max();
        match newest {
            Some(at) if n > 1 => {
                self.by_peer.insert(peer, (n - 1, at));
            }
            _ => {
                self.by_peer.remove(&peer);
            }
        }
        Some(peer)
    }

    /// Open direct connections.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no direct connection to `peer` is open.
    #[cfg(test)]
    pub(super) fn none_to(&self, peer: &PeerId) -> bool {
        !self.by_peer.contains_key(peer)
    }

    /// A punch with `peer` began at `now` on relayed connection `relayed`.
    pub(super) fn punch_began(&mut self, peer: PeerId, relayed: ConnectionId, now: Instant) {
        if self.under_way.len() >= MAX_UNDER_WAY {
            self.under_way
                .retain(|_, u| now.saturating_duration_since(u.began) < gate::PUNCH_WINDOW);
        }
        if self.under_way.len() < MAX_UNDER_WAY {
            self.under_way.insert(
                peer,
                UnderWay {
                    began: now,
                    on: relayed,
                    dialed: false,
                },
            );
        }
    }

    /// dcutr dialed `peer` for the punch under way with it: the exchange
    /// on the relayed connection got through.
    pub(super) fn punch_dialed(&mut self, peer: &PeerId) {
        if let Some(u) = self.under_way.get_mut(peer) {
            u.dialed = true;
        }
    }

    /// How the punch under way with `peer` failed, judged when dcutr
    /// reports the failure (before [`Self::punch_ended`]). A punch not
    /// remembered counts as the path's failure.
    pub(super) fn unlanded(&self, peer: &PeerId) -> Unlanded {
        match self.under_way.get(peer) {
            Some(u) if !u.dialed => Unlanded::NoExchange,
            _ => Unlanded::DialsFailed,
        }
    }

    /// Relayed connection `id` to `peer` closed: a punch running on it
    /// will have no result; true if one was cut short, that is without a
    /// direct connection to `peer` since it began. One side of a punch
    /// whose own dial lost (its tuple taken by the peer's, which came up)
    /// hears nothing from dcutr: that punch got through all the same.
    pub(super) fn relayed_closed(&mut self, peer: &PeerId, id: ConnectionId) -> bool {
        let Some(u) = self.under_way.get(peer).copied() else {
            return false;
        };
        if u.on != id {
            return false;
        }
        self.under_way.remove(peer);
        !self.direct_to_since(peer, u.began)
    }

    /// The punch with `peer` has its result (or was given up): when it
    /// began, if it was remembered.
    pub(super) fn punch_ended(&mut self, peer: &PeerId) -> Option<Instant> {
        self.under_way.remove(peer).map(|u| u.began)
    }

    /// Whether a punch began on relayed connection `id` within
    /// [`gate::PUNCH_WINDOW`] before `now` and has no result yet: closing
    /// that connection would cut it short.
    /// Not once a direct connection to its peer came up since it began:
    /// the relayed connection is no longer needed for it.
    pub(super) fn punch_runs_on(&self, id: ConnectionId, now: Instant) -> bool {
        self.under_way.iter().any(|(peer, u)| {
            u.on == id
                && now.saturating_duration_since(u.began) < gate::PUNCH_WINDOW
                && !self.direct_to_since(peer, u.began)
        })
    }

    /// Whether a punch with `peer` began within [`gate::PUNCH_WINDOW`]
    /// before `now` and has no result yet.
    pub(super) fn punch_under_way(&self, peer: &PeerId, now: Instant) -> bool {
        self.under_way
            .get(peer)
            .is_some_and(|u| now.saturating_duration_since(u.began) < gate::PUNCH_WINDOW)
    }

    /// Whether a direct connection to `peer` came up (and is open) since
    /// the punch with it under way began. One from before does not count:
    /// a peer making a new relayed connection while one is open has likely
    /// lost that path (its host moved, say) before we noticed.
    pub(super) fn direct_since_punch_began(&self, peer: &PeerId) -> bool {
        self.under_way
            .get(peer)
            .is_some_and(|u| self.direct_to_since(peer, u.began))
    }

    /// Whether a punch's dial to `peer` would make a second direct
    /// connection: one came up (and is open) during the punch under way
    /// with it, or, with none under way, within [`gate::PUNCH_WINDOW`] of
    /// `now`. The window covers the side whose punch already ended with
    /// that connection while the peer, which had not seen it yet, tries
    /// again on the same relayed connection (dcutr's retry). A punch under
    /// way that began after the connection came up (a new relayed
    /// connection: its peer has likely lost that path) is not held back,
    /// however young the connection.
    pub(super) fn young_direct_to(&self, peer: &PeerId, now: Instant) -> bool {
        match self.under_way.get(peer) {
            Some(u) => self.direct_to_since(peer, u.began),
            None => now
                .checked_sub(gate::PUNCH_WINDOW)
                .is_some_and(|since| self.direct_to_since(peer, since)),
        }
    }

    /// Whether a direct connection to `peer` that came up at or after
    /// `began` is open.
    fn direct_to_since(&self, peer: &PeerId, began: Instant) -> bool {
        self.by_peer
            .get(peer)
            .is_some_and(|(_, newest)| *newest >= began)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn connections_are_counted_by_peer_and_the_newest_kept() {
        let mut o = Open::default();
        let (p, q) = (PeerId::random(), PeerId::random());
        let t0 = Instant::now();
        let id = ConnectionId::new_unchecked;
        assert!(o.opened(id(1), p, t0));
        assert!(!o.opened(id(1), p, t0), "known");
        assert!(o.opened(id(2), p, t0 + Duration::from_secs(5)));
        assert!(o.opened(id(3), q, t0));
        assert_eq!(o.len(), 3);
        // A punch that began between the two: the newer one counts.
        o.punch_began(p, id(9), t0 + Duration::from_secs(1));
        assert!(o.direct_since_punch_began(&p));
        // The newer closes: only one from before the punch is left.
        assert_eq!(o.closed(&id(2)), Some(p));
        assert!(!o.direct_since_punch_began(&p));
        assert_eq!(o.closed(&id(1)), Some(p));
        assert!(o.none_to(&p));
        assert_eq!(o.closed(&id(1)), None);
        assert_eq!(o.len(), 1);
    }

    #[test]
    fn full_at_the_cap_and_not_after_a_close() {
        let mut o = Open::with_max(2);
        let id = ConnectionId::new_unchecked;
        let now = Instant::now();
        o.opened(id(1), PeerId::random(), now);
        assert!(!o.full());
        o.opened(id(2), PeerId::random(), now);
        assert!(o.full());
        o.closed(&id(1));
        assert!(!o.full());
        assert!(!Open::with_max(0).full(), "0 acts as 1");
    }

    #[test]
    fn a_punch_is_under_way_until_its_result_or_the_window() {
        let mut o = Open::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        assert!(!o.punch_under_way(&p, t0));
        let id = ConnectionId::new_unchecked;
        o.punch_began(p, id(1), t0);
        assert!(o.punch_under_way(&p, t0 + Duration::from_secs(1)));
        assert!(!o.punch_under_way(&p, t0 + gate::PUNCH_WINDOW));
        assert_eq!(o.punch_ended(&p), Some(t0));
        assert!(!o.punch_under_way(&p, t0));
        assert_eq!(o.punch_ended(&p), None);
        // Its relayed connection closing ends it; another one's does not.
        o.punch_began(p, id(1), t0);
        assert!(o.punch_runs_on(id(1), t0));
        assert!(!o.punch_runs_on(id(2), t0));
        assert!(!o.punch_runs_on(id(1), t0 + gate::PUNCH_WINDOW));
        assert!(!o.relayed_closed(&p, id(2)));
        assert!(o.punch_under_way(&p, t0));
        assert!(o.relayed_closed(&p, id(1)));
        assert!(!o.punch_under_way(&p, t0));
        assert!(!o.punch_runs_on(id(1), t0));
    }

    #[test]
    fn a_punch_whose_peer_connected_us_is_not_cut_short_by_its_relayed_close() {
        let mut o = Open::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        let id = ConnectionId::new_unchecked;
        // A direct connection from before the punch does not count.
        o.opened(id(5), p, t0);
        o.punch_began(p, id(1), t0 + Duration::from_millis(1));
        assert!(o.punch_runs_on(id(1), t0 + Duration::from_millis(2)));
        // The peer's dial came up; ours never reported.
        o.opened(id(6), p, t0 + Duration::from_millis(3));
        assert!(
            !o.punch_runs_on(id(1), t0 + Duration::from_millis(4)),
            "the relayed connection may close"
        );
        assert!(!o.relayed_closed(&p, id(1)), "not abandoned");
        assert!(!o.punch_under_way(&p, t0), "over either way");
        // Without that connection the same close is a cut-short punch.
        o.closed(&id(6));
        o.punch_began(p, id(2), t0 + Duration::from_millis(5));
        assert!(o.relayed_closed(&p, id(2)));
    }

    /// With no punch under way (ours ended with the connection), a direct
    /// connection holds back punch dials to its peer for a punch window;
    /// with one under way, only a connection that came up during it does:
    /// a new punch (a new relayed connection) beside a young connection
    /// goes ahead, since its peer has likely lost that path.
    #[test]
    fn a_direct_connection_is_young_for_a_punch_window() {
        let mut o = Open::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        let id = ConnectionId::new_unchecked;
        let secs = Duration::from_secs;
        assert!(!o.young_direct_to(&p, t0 + gate::PUNCH_WINDOW), "none open");
        o.opened(id(1), p, t0);
        assert!(o.young_direct_to(&p, t0 + gate::PUNCH_WINDOW / 2));
        let later = t0 + gate::PUNCH_WINDOW + secs(1);
        assert!(!o.young_direct_to(&p, later), "old");
        // A punch under way since before it came up sees it, old or not.
        o.punch_began(p, id(9), t0);
        assert!(o.young_direct_to(&p, later));
        o.punch_ended(&p);
        // A new punch after it came up does not, young as it is.
        o.punch_began(p, id(10), t0 + secs(9));
        assert!(!o.young_direct_to(&p, t0 + secs(9)));
    }
}
