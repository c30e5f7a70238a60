//! The swarm loop's open connections as admission sees them, and the sweeps
//! over them: the auth deadline (inbound connections whose peer is not
//! admitted in time are closed), trimming's "close every unauthenticated
//! connection" and the connection gauges by state. A connection marked
//! closing is never picked again while its close completes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

use super::AdmissionTable;
use crate::shrink::ShrinkSparse;

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
        }
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
