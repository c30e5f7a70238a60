//! The swarm loop's open connections as admission sees them, and the sweeps
//! over them: the auth deadline (inbound connections whose peer is not
//! admitted in time are closed), the newcomer's eviction (below), trimming's
//! "close every unauthenticated connection" and the connection gauges by
//! state. A connection marked closing is never picked again while its close
//! completes.
//!
//! The newcomer's eviction: before authentication nothing tells an
//! attacker holding all of one source's unauthenticated connections apart
//! from a member dialing from the same address (one NAT). So the resource
//! manager lets one connection past a source's cap, and once it is up,
//! the source's *oldest* unauthenticated connection is closed
//! ([`Connections::evict_for_newcomer`]). An attacker renewing its
//! connections keeps losing its oldest; a member gets in and has until it
//! has become the source's oldest to authenticate, which takes the whole
//! cap's worth of newer arrivals.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

use super::AdmissionTable;
use crate::shrink::ShrinkSparse;
use agentmesh_fair::SourceKey;

/// Connection states (the `state` label of the connection gauges).
pub(crate) const STATES: &[&str] = &["unauthenticated", "admitted"];
/// Connection directions (the `direction` label).
pub(crate) const DIRECTIONS: &[&str] = &["inbound", "outbound"];

/// One open connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub(crate) peer: PeerId,
    pub(crate) inbound: bool,
    pub(crate) since: Instant,
    pub(crate) closing: bool,
    /// Where an inbound direct connection comes from (none: outbound, or
    /// relayed).
    pub(crate) source: Option<SourceKey>,
}

/// Open connections by id.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    by_id: HashMap<ConnectionId, ConnInfo>,
}

impl Connections {
    /// Records a new connection.
    pub(crate) fn insert(&mut self, id: ConnectionId, info: ConnInfo) {
        self.by_id.insert(id, info);
    }

    /// Forgets a closed connection.
    pub(crate) fn remove(&mut self, id: &ConnectionId) {
        self.by_id.remove(id);
        self.by_id.shrink_sparse();
    }

    /// The source connection `id` counts under, if it is an inbound direct one.
    pub(crate) fn source_of(&self, id: &ConnectionId) -> Option<SourceKey> {
        self.by_id.get(id).and_then(|c| c.source)
    }

    /// Open connections.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Every connection with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ConnectionId, &ConnInfo)> {
        self.by_id.iter()
    }

    /// Marks connection `id` closing; returns its peer if it was open.
    pub(crate) fn mark_closing(&mut self, id: &ConnectionId) -> Option<PeerId> {
        let c = self.by_id.get_mut(id)?;
        c.closing = true;
        Some(c.peer)
    }

    /// Marks every connection of `peers` closing.
    pub(crate) fn mark_peers_closing(&mut self, peers: &HashSet<PeerId>) {
        for c in self.by_id.values_mut() {
            if peers.contains(&c.peer) {
                c.closing = true;
            }
        }
    }

    /// Inbound connections, not closing, open at least `deadline`, whose
    /// peer is not admitted at `now`: past the auth deadline.
    pub(crate) fn past_auth_deadline(
        &self,
        table: &AdmissionTable,
        now: i64,
        deadline: Duration,
    ) -> Vec<ConnectionId> {
        self.by_id
            .iter()
            .filter(|(_, c)| {
                c.inbound
                    && !c.closing
                    && c.since.elapsed() >= deadline
                    && !table.is_admitted(&c.peer, now)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The connection to close for the newcomer `id` (just up, its peer
    /// not admitted): when `id`'s source now holds more than `cap`
    /// unauthenticated inbound connections (not closing), the oldest of
    /// them other than `id`; otherwise none.
    pub(crate) fn evict_for_newcomer(
        &self,
        id: &ConnectionId,
        table: &AdmissionTable,
        now: i64,
        cap: u32,
    ) -> Option<ConnectionId> {
        let source = self.by_id.get(id)?.source?;
        let mut held = 0u32;
        let mut oldest: Option<(&ConnectionId, &ConnInfo)> = None;
        for (cid, c) in &self.by_id {
            if !c.inbound
                || c.closing
                || c.source != Some(source)
                || table.is_admitted(&c.peer, now)
            {
                continue;
            }
            held = held.saturating_add(1);
            if cid != id && oldest.is_none_or(|(_, o)| c.since < o.since) {
                oldest = Some((cid, c));
            }
        }
        (held > cap)
            .then_some(oldest.map(|(cid, _)| *cid))
            .flatten()
    }

    /// Inbound connections, not closing, whose peer is not admitted at `now`.
    pub(crate) fn unauthenticated(&self, table: &AdmissionTable, now: i64) -> Vec<ConnectionId> {
        self.by_id
            .iter()
            .filter(|(_, c)| c.inbound && !c.closing && !table.is_admitted(&c.peer, now))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Connections by (state, direction), every pair present.
    pub(crate) fn by_state(
        &self,
        table: &AdmissionTable,
        now: i64,
    ) -> HashMap<(&'static str, &'static str), i64> {
        let mut by: HashMap<(&'static str, &'static str), i64> = HashMap::new();
        for s in STATES {
            for d in DIRECTIONS {
                by.insert((s, d), 0);
            }
        }
        for c in self.by_id.values() {
            let state = if table.is_admitted(&c.peer, now) {
                STATES[1]
            } else {
                STATES[0]
            };
            let dir = if c.inbound {
                DIRECTIONS[0]
            } else {
                DIRECTIONS[1]
            };
            *by.entry((state, dir)).or_default() += 1;
        }
        by
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(peer: PeerId, inbound: bool) -> ConnInfo {
        ConnInfo {
            peer,
            inbound,
            since: Instant::now(),
            closing: false,
            source: None,
        }
    }

    fn from(peer: PeerId, source: &str, since: Instant) -> ConnInfo {
        ConnInfo {
            peer,
            inbound: true,
            since,
            closing: false,
            source: Some(SourceKey::new(source.parse().expect("ip"), 64)),
        }
    }

    #[test]
    fn a_newcomer_past_its_sources_cap_evicts_that_sources_oldest_stranger() {
        let mut t = AdmissionTable::default();
        let member = PeerId::random();
        t.admit(
            member,
            super::super::Admission {
                purpose: super::super::Purpose::Attach,
                until: 100,
                node_id: "n".into(),
                attached_routers: vec![],
                groups: None,
                push: Default::default(),
            },
        );
        let base = Instant::now();
        let at = |s: u64| base + Duration::from_secs(s);
        let id = ConnectionId::new_unchecked;
        let mut c = Connections::default();
        // An admitted member from the source, older than everyone: never
        // counted, never evicted.
        c.insert(id(1), from(member, "127.0.0.66", at(0)));
        c.insert(id(2), from(PeerId::random(), "127.0.0.66", at(1)));
        c.insert(id(3), from(PeerId::random(), "127.0.0.66", at(2)));
        // Another source's older stranger is not this source's.
        c.insert(id(4), from(PeerId::random(), "127.0.0.67", at(0)));
        assert_eq!(c.evict_for_newcomer(&id(3), &t, 50, 2), None, "at the cap");
        c.insert(id(5), from(PeerId::random(), "127.0.0.66", at(3)));
        assert_eq!(
            c.evict_for_newcomer(&id(5), &t, 50, 2),
            Some(id(2)),
            "past the cap: the oldest stranger of the source"
        );
        c.mark_closing(&id(2));
        assert_eq!(
            c.evict_for_newcomer(&id(5), &t, 50, 2),
            None,
            "one closing is no longer counted"
        );
        // A newcomer that is itself the oldest evicts the next oldest.
        let mut d = Connections::default();
        d.insert(id(7), from(PeerId::random(), "10.0.0.1", at(0)));
        d.insert(id(8), from(PeerId::random(), "10.0.0.1", at(5)));
        assert_eq!(d.evict_for_newcomer(&id(7), &t, 50, 1), Some(id(8)));
        // Outbound and relayed connections have no source: never evicted.
        let mut e = Connections::default();
        e.insert(id(9), conn(PeerId::random(), true));
        e.insert(id(10), conn(PeerId::random(), true));
        assert_eq!(e.evict_for_newcomer(&id(10), &t, 50, 0), None);
    }

    #[test]
    fn only_inbound_unadmitted_open_connections_are_swept() {
        let mut t = AdmissionTable::default();
        let (admitted, stranger, dialed) = (PeerId::random(), PeerId::random(), PeerId::random());
        t.admit(
            admitted,
            super::super::Admission {
                purpose: super::super::Purpose::Attach,
                until: 100,
                node_id: "n".into(),
                attached_routers: vec![],
                groups: None,
                push: Default::default(),
            },
        );
        let mut c = Connections::default();
        let ids: Vec<ConnectionId> = (1..=4).map(ConnectionId::new_unchecked).collect();
        c.insert(ids[0], conn(admitted, true));
        c.insert(ids[1], conn(stranger, true));
        c.insert(ids[2], conn(dialed, false));
        c.insert(ids[3], conn(stranger, true));
        assert_eq!(c.mark_closing(&ids[3]), Some(stranger));
        assert_eq!(c.past_auth_deadline(&t, 50, Duration::ZERO), vec![ids[1]]);
        assert_eq!(c.unauthenticated(&t, 50), vec![ids[1]]);
        assert!(
            c.past_auth_deadline(&t, 50, Duration::from_secs(3600))
                .is_empty(),
            "not yet past the deadline"
        );
        let by = c.by_state(&t, 50);
        assert_eq!(by[&("admitted", "inbound")], 1);
        assert_eq!(by[&("unauthenticated", "inbound")], 2);
        assert_eq!(by[&("unauthenticated", "outbound")], 1);
        assert_eq!(by[&("admitted", "outbound")], 0);
    }
}
