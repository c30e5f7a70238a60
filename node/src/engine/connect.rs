//! Connection requests from call tasks ([`Command::Connect`]): be
//! connected to a peer, dialing unless already; first closing relayed
//! connections through routers the peer left (or ones being closed for
//! idleness) and waiting until they are gone, or dialing anew when the
//! peer is reached only through routers it no longer lists. Waiters are
//! bounded ([`MAX_WAITERS`]); each is answered when its connection comes
//! up, its dial fails, or (the asker having given up) dropped.
//!
//! [`Command::Connect`]: crate::command::Command::Connect

use std::collections::HashMap;

use libp2p::swarm::ConnectionId;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId};
use tokio::sync::oneshot;

use super::Engine;
use crate::command::{CircuitRefusal, ConnectError};

/// Most connection waiters held at once (call tasks waiting for a dial).
pub(crate) const MAX_WAITERS: usize = 4096;

/// A reply to a connection request.
pub(crate) type Reply = oneshot::Sender<Result<(), ConnectError>>;

/// What a failed dial tells its waiters: a timeout when every address's
/// dial ran past the connect timeout (`after`; the transport reports it as
/// an `io::Error` of kind `TimedOut`), else libp2p's words and how a relay
/// refused the circuit when one did (found anywhere in the nested
/// transport errors: the relay client reports it as a
/// `hop::ConnectError` inside the relayed dial's error).
pub(crate) fn dial_failure(
    peer: &PeerId,
    error: &libp2p::swarm::DialError,
    after: std::time::Duration,
) -> ConnectError {
    if let libp2p::swarm::DialError::Transport(errors) = error
        && !errors.is_empty()
        && errors.iter().all(|(_, e)| match e {
            libp2p::core::transport::TransportError::Other(e) => timed_out(e),
            libp2p::core::transport::TransportError::MultiaddrNotSupported(_) => false,
        })
    {
        return ConnectError::TimedOut { peer: *peer, after };
    }
    let circuit = match error {
        libp2p::swarm::DialError::Transport(errors) => errors
            .iter()
            .find_map(|(_, e)| circuit_refusal(e as &(dyn std::error::Error + 'static))),
        _ => None,
    };
    ConnectError::Dial {
        peer: *peer,
        circuit,
        detail: format!("connect to {peer}: {error}"),
    }
}

/// The relay's refusal of a circuit, if `e` or anything it wraps is one.
fn circuit_refusal(e: &(dyn std::error::Error + 'static)) -> Option<CircuitRefusal> {
    use libp2p::relay::outbound::hop::ConnectError as Hop;
    let mut next = Some(e);
    // Bounded: error chains are short; a cycle would be a bug elsewhere.
    for _ in 0..16 {
        let e = next?;
        if let Some(c) = e.downcast_ref::<Hop>() {
            return match c {
                Hop::PermissionDenied => Some(CircuitRefusal::PermissionDenied),
                Hop::ResourceLimitExceeded => Some(CircuitRefusal::ResourceLimitExceeded),
                Hop::ConnectionFailed => Some(CircuitRefusal::ConnectionFailed),
                Hop::NoReservation => Some(CircuitRefusal::NoReservation),
                _ => None,
            };
        }
        // `io::Error::source` skips the error it wraps: look inside.
        if let Some(found) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| circuit_refusal(inner))
        {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// Whether `e`, or an `io::Error` it wraps, is of kind `TimedOut` (the
/// transport stack boxes errors into `io::Error`s, whose `source` skips
/// the error they wrap).
fn timed_out(e: &std::io::Error) -> bool {
    let mut next = Some(e);
    // Bounded: a few layers of boxing at most.
    for _ in 0..8 {
        let Some(e) = next else { return false };
        if e.kind() == std::io::ErrorKind::TimedOut {
            return true;
        }
        next = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<std::io::Error>());
    }
    false
}

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
    /// The addresses the waiters of each peer in `dials` asked to dial:
    /// dialed again when the dial they waited on was a punch that failed.
    addrs: HashMap<PeerId, Vec<Multiaddr>>,
    /// Waiting for stale connections to close (at most [`MAX_WAITERS`]).
    fresh: Vec<FreshWait>,
}

impl Waits {
    /// Waiters for a dial, all peers.
    fn dialing(&self) -> usize {
        self.dials.values().map(Vec::len).sum()
    }
}

impl Engine {
    pub(super) fn on_connect(
        &mut self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        (mut keep_via, listed): (Option<Vec<PeerId>>, Option<Vec<PeerId>>),
        suspect: Option<ConnectionId>,
        reply: Reply,
    ) {
        // Connections being closed for idleness must be gone
        // before the call opens its stream.
        let mut stale = self.conns.open_among(&peer, &self.idle_closing);
        if let Some(id) = suspect {
            // The stream failed on a direct connection (the caller saw it
            // was one): the relay worked before the punch and is the
            // fallback, so no relayed connection is closed, the direct one
            // goes if it has not already, and punches to this peer back
            // off either way.
            tracing::debug!(%peer, connection = %id, "a call's stream failed on a direct connection: closing it, the call retries relayed");
            if self.conns.is_direct(&peer, id) {
                stale.push(id);
            }
            keep_via = None;
            self.swarm.behaviour_mut().direct.path_failed(peer);
        }
        if let Some(keep) = keep_via {
            stale.extend(self.conns.stale(&peer, &keep));
            stale.sort();
            stale.dedup();
        }
        if !stale.is_empty() {
            self.waits.fresh.retain(|w| !w.reply.is_closed());
            if self.waits.fresh.len() >= MAX_WAITERS {
                let _ = reply.send(Err(ConnectError::TooManyPending));
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
            let _ = reply.send(Err(ConnectError::TooManyPending));
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
        let addrs_kept = addrs.clone();
        let opts = DialOpts::peer_id(peer)
            .addresses(addrs)
            .condition(condition)
            .build();
        match self.swarm.dial(opts) {
            Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {
                let w = self.waits.dials.entry(peer).or_default();
                w.retain(|s| !s.is_closed());
                w.push(reply);
                self.waits.addrs.insert(peer, addrs_kept);
            }
            Err(e) => {
                let _ = reply.send(Err(ConnectError::Dial {
                    peer,
                    circuit: None,
                    detail: format!("dial {peer}: {e}"),
                }));
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

    /// A punch dial to `peer` failed. Callers that asked to connect while
    /// it was under way waited on it (their own dial found one in
    /// progress); its failure is not theirs, so their dial is made now,
    /// unless a connection or another dial is there for them.
    pub(super) fn after_punch_failed(&mut self, peer: PeerId) {
        let waiting = self.waits.dials.get_mut(&peer).is_some_and(|w| {
            w.retain(|s| !s.is_closed());
            !w.is_empty()
        });
        if !waiting || self.swarm.is_connected(&peer) {
            return;
        }
        let addrs = self.waits.addrs.get(&peer).cloned().unwrap_or_default();
        let opts = DialOpts::peer_id(peer)
            .addresses(addrs)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .build();
        match self.swarm.dial(opts) {
            Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {
                tracing::debug!(%peer, "a punch failed under waiting callers: their dial made now");
            }
            Err(e) => self.resolve_waiters(
                &peer,
                Err(ConnectError::Dial {
                    peer,
                    circuit: None,
                    detail: format!("dial {peer}: {e}"),
                }),
            ),
        }
    }

    /// Answers everyone waiting for a connection to `peer`.
    pub(super) fn resolve_waiters(&mut self, peer: &PeerId, result: Result<(), ConnectError>) {
        self.waits.addrs.remove(peer);
        if let Some(ws) = self.waits.dials.remove(peer) {
            for w in ws {
                let _ = w.send(result.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use libp2p::core::transport::TransportError;
    use libp2p::relay::outbound::hop::ConnectError as Hop;
    use libp2p::swarm::DialError;

    use super::*;

    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

    fn dial_error(errors: Vec<std::io::Error>) -> DialError {
        let addr: Multiaddr = "/ip4/127.0.0.1/tcp/1/p2p-circuit".parse().expect("addr");
        DialError::Transport(
            errors
                .into_iter()
                .map(|e| (addr.clone(), TransportError::Other(e)))
                .collect(),
        )
    }

    /// As `transport::timed_out_as_io` makes it, boxed once more by the
    /// transport stack.
    fn timeout() -> std::io::Error {
        std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connect timed out",
        ))
    }

    #[test]
    fn a_dial_past_the_connect_timeout_on_every_address_is_a_timeout_not_a_route_failure() {
        let peer = PeerId::random();
        let f = dial_failure(&peer, &dial_error(vec![timeout(), timeout()]), SECOND);
        assert!(f.is_timeout(), "{f:?}");
        assert!(!f.is_route_failure(), "{f:?}");
        // One address that failed otherwise: the route failed there.
        let refused =
            std::io::Error::other(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let f = dial_failure(&peer, &dial_error(vec![timeout(), refused]), SECOND);
        assert!(f.is_route_failure(), "{f:?}");
        assert!(!f.is_timeout(), "{f:?}");
        let f = dial_failure(&peer, &dial_error(vec![]), SECOND);
        assert!(f.is_route_failure(), "{f:?}");
    }

    fn relayed_dial_error(e: Hop) -> DialError {
        // As the relay client's transport reports it, boxed in an io::Error
        // by the node's transport stack.
        let relay = libp2p::relay::client::transport::Error::Connect(e);
        let io = std::io::Error::other(relay);
        let addr: Multiaddr = "/ip4/127.0.0.1/tcp/1/p2p-circuit".parse().expect("addr");
        DialError::Transport(vec![(addr, TransportError::Other(io))])
    }

    #[test]
    fn only_a_relay_permission_denied_is_a_policy_refusal() {
        let peer = PeerId::random();
        let denied = dial_failure(&peer, &relayed_dial_error(Hop::PermissionDenied), SECOND);
        assert!(denied.is_denied(), "{denied:?}");
        assert!(denied.to_string().contains(&peer.to_string()));
        for (other, refusal) in [
            (
                Hop::ResourceLimitExceeded,
                CircuitRefusal::ResourceLimitExceeded,
            ),
            (Hop::ConnectionFailed, CircuitRefusal::ConnectionFailed),
            (Hop::NoReservation, CircuitRefusal::NoReservation),
        ] {
            let f = dial_failure(&peer, &relayed_dial_error(other), SECOND);
            assert!(!f.is_denied(), "{f:?}");
            assert!(
                matches!(f, ConnectError::Dial { circuit: Some(c), .. } if c == refusal),
                "{f:?}"
            );
        }
        let f = dial_failure(&peer, &DialError::Aborted, SECOND);
        assert!(!f.is_denied());
    }
}
