//! Letting go of a router without cutting the calls through it.
//!
//! After a go-away, once K other routers serve us, the leaving router is
//! released: its slot, its reservation and our records' mention of it go at
//! once, so no new call or circuit goes through it (calls route around
//! routers that are leaving or lingering, and a call whose provider is
//! reached only through one dials it anew through another router, see
//! `call::outbound`). Its *connection* is another matter: every relayed
//! connection through it (our circuits to providers, callers' circuits to
//! us) rides on it, and closing it cuts every call streaming over them —
//! seen in the paced-drain ladder as a window call ended mid-stream
//! (`unexpected end of file`) or stalled when the member released the
//! drained router under it.
//!
//! So a released router whose relayed connections still carry a call
//! lingers: connected, not held. Each tick, its relayed connections that
//! carry nothing are closed (so the router's drain can end early, when no
//! member and no circuit is left), and it is disconnected once none
//! carries a call ([`Carries::Call`], or [`Carries::Maybe`] while a call to
//! that peer is being set up), or at the latest when its go-away's
//! retry-after (the time the router asked us to stay away, at most
//! [`super::goaway::MAX_SHUN`]) runs out after the go-away. The router
//! itself ends it sooner at the end of its drain or trim grace: that close
//! is the go-away's real deadline, and the calls still running then are
//! the ones the grace was too short for.
//!
//! Counted: `agentmesh_node_goaway_lingering` (routers lingering now) and
//! `agentmesh_node_goaway_linger_ends_total{reason}` (`calls_done`,
//! `deadline`, `router_closed`).

use std::collections::HashMap;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use tokio::time::Instant;

use super::Engine;
use crate::metrics::ReasonLabel;
use crate::peer_calls::Carries;

/// Routers let go after their go-away, still connected for their calls,
/// with the instant they are disconnected at the latest.
#[derive(Debug, Default)]
pub(crate) struct Lingering {
    until: HashMap<PeerId, Instant>,
}

impl Lingering {
    /// The routers lingering now.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &PeerId> {
        self.until.keys()
    }
}

/// What to do with one lingering router now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Keep it; close these relayed connections through it (they carry nothing).
    Keep(Vec<ConnectionId>),
    /// Disconnect it, for this [`crate::metrics::GOAWAY_LINGER_ENDS`] reason.
    Disconnect(&'static str),
}

/// The step for a router lingering `until`, whose relayed connections
/// carry what `conns` says.
pub(crate) fn step(now: Instant, until: Instant, conns: &[(ConnectionId, Carries)]) -> Step {
    if !conns.iter().any(|(_, c)| *c != Carries::Nothing) {
        return Step::Disconnect("calls_done");
    }
    if now >= until {
        return Step::Disconnect("deadline");
    }
    Step::Keep(
        conns
            .iter()
            .filter(|(_, c)| *c == Carries::Nothing)
            .map(|(id, _)| *id)
            .collect(),
    )
}

impl Engine {
    /// `router`, released after its go-away (its slot already gone): keep
    /// its connection while calls go through it, until `until` at the
    /// latest; disconnect it now if none does.
    pub(super) fn linger(&mut self, router: PeerId, until: Instant) {
        self.lingering.until.insert(router, until);
        self.step_lingering(Instant::now());
        if self.lingering.until.contains_key(&router) {
            tracing::info!(%router, "released after go-away; its connection stays while calls through it last");
        }
    }

    /// One step for every lingering router (each tick, and when one starts).
    pub(super) fn step_lingering(&mut self, now: Instant) {
        let routers: Vec<(PeerId, Instant)> =
            self.lingering.until.iter().map(|(r, u)| (*r, *u)).collect();
        for (router, until) in routers {
            if self.slots.contains_key(&router) {
                // Held again (tried early when short of K): the slot owns
                // the connection now.
                self.lingering.until.remove(&router);
                continue;
            }
            let conns: Vec<(ConnectionId, Carries)> = self
                .conns
                .through(&router)
                .into_iter()
                .map(|(peer, id)| (id, self.node.peer_calls.carries(&peer, id)))
                .collect();
            match step(now, until, &conns) {
                Step::Keep(idle) => {
                    for id in idle {
                        if self.idle_closing.insert(id) {
                            // A connect to that peer waits for it to close.
                            self.swarm.close_connection(id);
                        }
                    }
                }
                Step::Disconnect(reason) => {
                    if reason == "deadline" {
                        tracing::warn!(%router, calls = conns.len(), "go-away's retry-after ran out with calls through the router: disconnecting");
                    } else {
                        tracing::debug!(%router, reason, "let go of a router after go-away");
                    }
                    self.lingering.until.remove(&router);
                    self.count_linger_end(reason);
                    let _ = self.swarm.disconnect_peer_id(router);
                }
            }
        }
        self.node
            .metrics
            .routers
            .goaway_lingering
            .set(i64::try_from(self.lingering.until.len()).unwrap_or(i64::MAX));
    }

    /// A lingering router's last connection closed (it closed us first).
    pub(super) fn lingering_closed(&mut self, router: &PeerId) {
        if self.lingering.until.remove(router).is_some() {
            self.count_linger_end("router_closed");
            self.node
                .metrics
                .routers
                .goaway_lingering
                .set(i64::try_from(self.lingering.until.len()).unwrap_or(i64::MAX));
        }
    }

    fn count_linger_end(&self, reason: &'static str) {
        self.node
            .metrics
            .routers
            .goaway_linger_ends
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_router_lingers_while_a_call_goes_through_it_and_no_longer_than_its_deadline() {
        let now = Instant::now();
        let until = now + Duration::from_secs(30);
        let (a, b, c) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
            ConnectionId::new_unchecked(3),
        );
        // Nothing through it: let go at once.
        assert_eq!(step(now, until, &[]), Step::Disconnect("calls_done"));
        assert_eq!(
            step(now, until, &[(a, Carries::Nothing)]),
            Step::Disconnect("calls_done")
        );
        // A call on one circuit: kept, the idle circuit closed.
        assert_eq!(
            step(now, until, &[(a, Carries::Call), (b, Carries::Nothing)]),
            Step::Keep(vec![b])
        );
        // A call being set up to a peer keeps that peer's circuit too.
        assert_eq!(step(now, until, &[(c, Carries::Maybe)]), Step::Keep(vec![]));
        // At the deadline, calls or not, it goes.
        assert_eq!(
            step(until, until, &[(a, Carries::Call)]),
            Step::Disconnect("deadline")
        );
        assert!(crate::metrics::GOAWAY_LINGER_ENDS.contains(&"calls_done"));
        assert!(crate::metrics::GOAWAY_LINGER_ENDS.contains(&"deadline"));
    }
}
