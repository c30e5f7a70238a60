//! Transit admissions ([`Command::Transit`]): a call whose provider shares
//! none of our routers goes through one of the provider's routers, and
//! that router must admit us for transit first. The engine owns these
//! admissions like every other: it connects, runs the auth (purpose
//! transit) and remembers the admission for the life of the connection.
//! A router we hold (or are acquiring) is never authed for transit: the
//! router keeps the latest purpose, and transit would cost us the
//! reservation.
//!
//! [`Command::Transit`]: crate::command::Command::Transit

use std::collections::HashSet;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{PolicyPushSlot, Purpose};
use libp2p::{Multiaddr, PeerId};
use tokio::sync::oneshot;

use super::{Engine, Op};
use crate::command::{ConnectError, TransitError};
use agentmesh_wire::auth::{self, AuthError, AuthOutcome};

/// A reply to a transit request.
pub(crate) type Reply = oneshot::Sender<Result<(), TransitError>>;

/// What a connected router needs before a call may go through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: held for attach, or admitted for transit on this connection.
    Nothing,
    /// A transit auth.
    Auth,
}

/// Routers that admitted us for transit on their current connection.
#[derive(Debug, Default)]
pub(crate) struct Transit {
    admitted: HashSet<PeerId>,
}

impl Transit {
    /// What `router` needs, `held` saying whether it is one of our slots.
    pub(crate) fn need(&self, router: &PeerId, held: bool) -> Need {
        if held || self.admitted.contains(router) {
            Need::Nothing
        } else {
            Need::Auth
        }
    }

    /// `router` admitted us for transit (on a connection that is still up).
    pub(crate) fn admitted(&mut self, router: PeerId) {
        self.admitted.insert(router);
    }

    /// The last connection to `router` closed: the admission went with it.
    pub(crate) fn disconnected(&mut self, router: &PeerId) {
        self.admitted.remove(router);
    }

    /// Routers admitting us for transit now.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &PeerId> {
        self.admitted.iter()
    }
}

impl Engine {
    /// Connects to `router` (within `connect_limit`), then admits us there
    /// for transit if it needs it (within `auth_limit`); answers `reply`.
    pub(super) fn on_transit(
        &mut self,
        router: PeerId,
        addrs: Vec<Multiaddr>,
        connect_limit: Duration,
        auth_limit: Duration,
        reply: Reply,
    ) {
        let (tx, rx) = oneshot::channel();
        self.on_connect(router, addrs, (None, None), None, tx);
        self.ops.push(Box::pin(async move {
            let connected = match tokio::time::timeout(connect_limit, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(ConnectError::Stopping),
                Err(_) => Err(ConnectError::TimedOut {
                    peer: router,
                    after: connect_limit,
                }),
            };
            Op::TransitConnected {
                router,
                connected,
                auth_limit,
                reply,
            }
        }));
    }

    pub(super) fn on_transit_connected(
        &mut self,
        router: PeerId,
        connected: Result<(), ConnectError>,
        auth_limit: Duration,
        reply: Reply,
    ) {
        if let Err(e) = connected {
            let _ = reply.send(Err(TransitError::Connect(e)));
            return;
        }
        if self.transit.need(&router, self.slots.contains_key(&router)) == Need::Nothing {
            let _ = reply.send(Ok(()));
            return;
        }
        let node = self.node.clone();
        let attached = self.reserved_peers();
        self.ops.push(Box::pin(async move {
            let req = auth::request_for(node.credential(), Purpose::Transit, &attached);
            let req = super::policy_push::stamp(&node, req, PolicyPushSlot::Unspecified);
            let result = auth::request(node.control.clone(), router, req, auth_limit).await;
            super::policy_push::take_admitted_policy(&node, &result).await;
            Op::TransitAuth {
                router,
                result,
                reply,
            }
        }));
    }

    pub(super) fn on_transit_auth(
        &mut self,
        router: PeerId,
        result: Result<AuthOutcome, AuthError>,
        reply: Reply,
    ) {
        let answer = match result {
            Ok(AuthOutcome::Admitted { .. }) => {
                // Only while the connection it was given on lives.
                if self.swarm.is_connected(&router) {
                    self.transit.admitted(router);
                }
                Ok(())
            }
            Ok(other) => Err(TransitError::Refused {
                router,
                outcome: Box::new(other),
            }),
            Err(e) => Err(TransitError::Wire(e)),
        };
        let _ = reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_routers_never_need_transit_and_admissions_end_with_the_connection() {
        let mut t = Transit::default();
        let r = PeerId::random();
        assert_eq!(t.need(&r, true), Need::Nothing, "held for attach");
        assert_eq!(t.need(&r, false), Need::Auth);
        t.admitted(r);
        assert_eq!(t.need(&r, false), Need::Nothing);
        assert_eq!(t.routers().count(), 1);
        t.disconnected(&r);
        assert_eq!(t.need(&r, false), Need::Auth);
        assert_eq!(t.routers().count(), 0);
    }
}
