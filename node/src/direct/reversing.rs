//! The behaviour's side of connection reversal ([`super::reversal`]):
//! whether a relayed connection asks, what we answer a peer that asks,
//! the dial an agreed reversal makes, and its result in
//! `agentmesh_node_upgrade_attempts_total{result}` (`reversed`,
//! `reversal_failed`, `reversal_refused` on the side that asks,
//! `reversal_agreed`, `reversal_declined` on the side asked).

use std::collections::{HashMap, VecDeque};

use libp2p::PeerId;
use libp2p::core::Multiaddr;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, NotifyHandler, ToSwarm};
use tokio::time::Instant;

use super::targets::punch_target_allowed;
use super::{Behaviour, Event, THandlerInEvent, reversal};

/// Reversal dials under way, at most (each ends at the connect timeout).
pub(super) const MAX_REVERSAL_DIALS: usize = 1024;

/// Reversal state of the behaviour; bounded by [`MAX_REVERSAL_DIALS`] and
/// the open relayed connections.
#[derive(Default)]
pub(super) struct Reversals {
    /// Our reversal dials under way, by connection id.
    dialing: HashMap<ConnectionId, PeerId>,
    /// What to hand the swarm: dials, and answers to peers' questions.
    queued: VecDeque<ToSwarm<Event, THandlerInEvent<Behaviour>>>,
}

impl Reversals {
    /// The next dial or answer for the swarm.
    pub(super) fn next(&mut self) -> Option<ToSwarm<Event, THandlerInEvent<Behaviour>>> {
        self.queued.pop_front()
    }
}

fn reply(
    peer: PeerId,
    id: ConnectionId,
    addr: Option<Multiaddr>,
) -> ToSwarm<Event, THandlerInEvent<Behaviour>> {
    ToSwarm::NotifyHandler {
        peer_id: peer,
        handler: NotifyHandler::One(id),
        event: either::Either::Left(either::Either::Right(reversal::In::Reply(addr))),
    }
}

impl Behaviour {
    /// `peer` asked, on relayed connection `id`, that we accept its direct
    /// dial. Agreed when direct connections are on and our routers agree
    /// on an address of ours (our NAT's mapping is endpoint-independent,
    /// or one router told us): the answer is that address, and `peer` may
    /// connect directly within the punch window. Refused otherwise, and
    /// when `id` is no relayed connection of that peer.
    pub(super) fn reversal_asked(&mut self, peer: PeerId, id: ConnectionId, now: Instant) {
        let on_relayed = self.relayed.get(&peer).is_some_and(|s| s.contains(&id));
        let offer = self
            .candidate
            .filter(|_| self.enabled && on_relayed && !self.open.full())
            .map(|a| super::path_addr(a, self.quic));
        if offer.is_some() {
            // Its dial is this reversal's: taken like a punch's.
            self.gate.punch_started(peer, now);
            self.metrics.upgrade("reversal_agreed");
        } else {
            self.metrics.upgrade("reversal_declined");
        }
        tracing::debug!(%peer, ?offer, "asked to accept a reversed connection");
        self.reversals.queued.push_back(reply(peer, id, offer));
    }

    /// `peer` answered our question: dial the address it gave (checked as
    /// a punch's target), or count the refusal or failure and back off.
    pub(super) fn reversal_answered(
        &mut self,
        peer: PeerId,
        answer: Result<Option<Multiaddr>, String>,
        now: Instant,
    ) {
        let addr = match answer {
            Ok(Some(a)) => a,
            Ok(None) => {
                tracing::debug!(%peer, "reversal refused by the peer");
                self.metrics.upgrade("reversal_refused");
                self.back_off(peer, now);
                return;
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "reversal exchange failed");
                self.metrics.upgrade("reversal_failed");
                self.back_off(peer, now);
                return;
            }
        };
        if !punch_target_allowed(&addr, self.loopback_targets)
            || self.reversals.dialing.len() >= MAX_REVERSAL_DIALS
        {
            tracing::debug!(%peer, %addr, "reversal to an address we do not dial: refused");
            self.metrics.upgrade("bad_target");
            self.back_off(peer, now);
            return;
        }
        let opts = DialOpts::peer_id(peer)
            .addresses(vec![addr])
            .condition(PeerCondition::Always)
            .build();
        // Noted as a punch: its failure is no caller's, and its connection
        // runs the hello.
        self.note_punch(opts.connection_id());
        self.reversals.dialing.insert(opts.connection_id(), peer);
        self.reversals.queued.push_back(ToSwarm::Dial { opts });
    }

    /// Connection `id` came up or its dial failed: counted (and a failure
    /// logged with its cause) when it was a reversal's.
    pub(super) fn reversal_dialed(
        &mut self,
        id: &ConnectionId,
        result: Result<(), &libp2p::swarm::DialError>,
        now: Instant,
    ) {
        let Some(peer) = self.reversals.dialing.remove(id) else {
            return;
        };
        match result {
            Ok(()) => {
                tracing::debug!(%peer, "reversal: our dial connected");
                self.metrics.upgrade("reversed");
                self.backoff.remove(&peer);
                self.repunch.succeeded(&peer);
            }
            Err(error) => {
                tracing::debug!(%peer, %error, "reversal: our dial failed");
                self.metrics.upgrade("reversal_failed");
                self.back_off(peer, now);
            }
        }
    }

    /// Whether a question of ours to `peer` would be a second one under
    /// way (one reversal per peer at a time).
    pub(super) fn reversing(&self, peer: &PeerId) -> bool {
        self.reversals.dialing.values().any(|p| p == peer)
    }
}
