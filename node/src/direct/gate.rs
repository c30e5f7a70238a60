//! What the direct behaviour knows of each direct connection to a member
//! beyond its being open: whether its peer has authenticated on it (the
//! hello, `hello.rs`) and with which verified claims, the deadline of one
//! that has not, why we are closing one, and which peers are in a punch
//! with us right now.
//!
//! This is the one owner of the verified claims of direct peers: the
//! engine writes them once it has verified a hello, and reads them back
//! to judge each connection again on every new policy or revocation list
//! (`engine/direct_auth.rs`). Everything here is bounded by the open
//! direct connections, except [`Gate::punching`], which is bounded by
//! [`MAX_PUNCHING`] and pruned by age.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use agentmesh_proto::credential::VerifiedClaims;
use agentmesh_proto::pb::credential::Credential;
use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

use super::hello::Heard;

/// How long after dcutr's exchange with a peer began (the relayed
/// connection handed to it) or its punch dial an inbound direct connection
/// from that peer is taken as that punch's:
/// dcutr's three attempts at once, each a round trip on the relayed
/// connection plus the simultaneous open and the handshakes, fit easily.
pub(crate) const PUNCH_WINDOW: Duration = Duration::from_secs(10);
/// Peers remembered as punching, at most.
pub(crate) const MAX_PUNCHING: usize = 4096;

/// Per-connection state of direct connections (see the module doc).
#[derive(Default)]
pub(crate) struct Gate {
    /// Direct connections whose peer has not authenticated, with the
    /// deadline for it.
    pending: HashMap<ConnectionId, (PeerId, Instant)>,
    /// Direct connections whose peer authenticated, with its claims.
    verified: HashMap<ConnectionId, (PeerId, VerifiedClaims)>,
    /// Connections we are closing, and the reason counted when they close.
    closing: HashMap<ConnectionId, &'static str>,
    /// Closes not yet handed to the swarm.
    closes: VecDeque<(PeerId, ConnectionId)>,
    /// Hellos read, not yet handed to the engine.
    heard: VecDeque<(PeerId, ConnectionId, Heard)>,
    /// Peers in a punch with us (dcutr's exchange began, or its dial), and
    /// since when.
    punching: HashMap<PeerId, Instant>,
    /// Our credential, sent in every hello.
    ours: Option<Credential>,
    /// `--direct-auth-timeout-ms`.
    timeout: Duration,
}

impl Gate {
    /// A gate whose connections must authenticate within `timeout`.
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout: timeout.max(Duration::from_millis(1)),
            ..Self::default()
        }
    }

    /// The credential to send in hellos from now on.
    pub(crate) fn set_credential(&mut self, ours: Credential) {
        self.ours = Some(ours);
    }

    /// The credential a new connection's hello sends.
    pub(crate) fn credential(&self) -> Option<Credential> {
        self.ours.clone()
    }

    /// A direct connection to a member came up at `now`: its peer must
    /// authenticate by `now` + the timeout.
    pub(crate) fn opened(&mut self, id: ConnectionId, peer: PeerId, now: Instant) {
        self.pending.insert(id, (peer, now + self.timeout));
    }

    /// A hello arrived on `id` (handed to the engine by [`Gate::next_heard`]).
    pub(crate) fn heard(&mut self, peer: PeerId, id: ConnectionId, heard: Heard) {
        if self.pending.contains_key(&id) {
            self.heard.push_back((peer, id, heard));
        }
    }

    /// The next hello for the engine to verify.
    pub(crate) fn next_heard(&mut self) -> Option<(PeerId, ConnectionId, Heard)> {
        self.heard.pop_front()
    }

    /// The peer of `id` authenticated with `claims`. False when `id` is
    /// no longer waiting for it (closed, closing, or already authenticated).
    pub(crate) fn authenticated(&mut self, id: ConnectionId, claims: VerifiedClaims) -> bool {
        let Some((peer, _)) = self.pending.remove(&id) else {
            return false;
        };
        self.verified.insert(id, (peer, claims));
        true
    }

    /// The authenticated connections with their peer's claims.
    pub(crate) fn verified(&self) -> impl Iterator<Item = (ConnectionId, &VerifiedClaims)> {
        self.verified.iter().map(|(id, (_, c))| (*id, c))
    }

    /// Closes `id` for `reason` (counted when it has closed). False when
    /// it is not a direct connection we know, or already closing.
    pub(crate) fn close(&mut self, id: ConnectionId, reason: &'static str) -> bool {
        let peer = match (self.pending.remove(&id), self.verified.remove(&id)) {
            (Some((peer, _)), _) | (None, Some((peer, _))) => peer,
            (None, None) => return false,
        };
        self.closing.insert(id, reason);
        self.closes.push_back((peer, id));
        true
    }

    /// Closes, as `unauthenticated`, every connection whose deadline is
    /// past at `now`; returns how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let late: Vec<ConnectionId> = self
            .pending
            .iter()
            .filter(|(_, (_, by))| *by <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &late {
            self.close(*id, "unauthenticated");
        }
        late.len()
    }

    /// The next close for the swarm to make.
    pub(crate) fn next_close(&mut self) -> Option<(PeerId, ConnectionId)> {
        self.closes.pop_front()
    }

    /// `id` closed: forgotten. Returns the reason we closed it for, if we did.
    pub(crate) fn closed(&mut self, id: &ConnectionId) -> Option<&'static str> {
        self.pending.remove(id);
        self.verified.remove(id);
        self.heard.retain(|(_, c, _)| c != id);
        self.closing.remove(id)
    }

    /// A punch with `peer` is under way at `now` (dcutr's exchange began on
    /// a relayed connection to it, or dcutr dials it, or we agreed to its
    /// reversal on its relayed connection: `reversing.rs`).
    pub(crate) fn punch_started(&mut self, peer: PeerId, now: Instant) {
        if self.punching.len() >= MAX_PUNCHING && !self.punching.contains_key(&peer) {
            self.punching
                .retain(|_, at| now.saturating_duration_since(*at) < PUNCH_WINDOW);
            if self.punching.len() >= MAX_PUNCHING {
                // Full of live punches: this one's inbound connection will
                // be refused (counted `not_punching`) and the call stays
                // relayed; nothing else is lost.
                return;
            }
        }
        self.punching.insert(peer, now);
    }

    /// Whether `peer` is in a punch with us at `now`: we started one
    /// within [`PUNCH_WINDOW`].
    pub(crate) fn is_punching(&self, peer: &PeerId, now: Instant) -> bool {
        self.punching
            .get(peer)
            .is_some_and(|at| now.saturating_duration_since(*at) < PUNCH_WINDOW)
    }
}
