//! Holding K routers: dial, auth (attach) before anything else, reserve a
//! relay slot, publish records; replace lost or refusing routers from the
//! cached directory; re-present a refreshed credential.

use std::collections::HashSet;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthRefusal, GoAwayReason, Purpose};
use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::ListenerId;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

use super::slot::{Lost, Phase, Slot};
use super::{Engine, Op, jittered};
use crate::status::NodeStatus;
use agentmesh_wire::ExchangeFailure as _;
use agentmesh_wire::auth::{self, AuthError, AuthOutcome};

/// Doublings of a shun for a router failing again and again (2^4 = ×16).
const MAX_SHUN_FAILURES: u32 = 4;

/// How long a router that kept failing re-presentations is passed over.
const REPRESENT_FAILED_SHUN: Duration = Duration::from_secs(30);

/// How long a router whose first auth failed (no answer, or the connection
/// kept failing for the [`super::redial::BUDGET`]) is passed over.
const AUTH_FAILED_SHUN: Duration = Duration::from_secs(10);

/// How long a router that keeps refusing reservations is passed over.
const RESERVE_REFUSED_SHUN: Duration = Duration::from_secs(30);

/// How long a router that refused our credential as revoked is passed over
/// (jittered), unless the credential changes first: a revoked member that
/// asked every 30 s cost 500 revoked members' routers ~50 refused auths/s.
pub(crate) const REVOKED_SHUN: Duration = Duration::from_secs(1800);

/// `addr` without a trailing `/p2p/..`, then `/p2p/router`.
pub(crate) fn router_base(addr: &Multiaddr, router: PeerId) -> Multiaddr {
    let mut a = addr.clone();
    while matches!(a.iter().last(), Some(Protocol::P2p(_))) {
        a.pop();
    }
    a.with(Protocol::P2p(router))
}

impl Engine {
    /// Keeps `peer` out of the choice for `base`, doubled for each failure
    /// in a row (capped at [`MAX_SHUN_FAILURES`] doublings), jittered. When
    /// short of K it may be tried again after `base` alone, unless
    /// `draining` (see [`super::shun`]).
    fn shun(&mut self, peer: PeerId, base: Duration, draining: bool) {
        self.shun_as(peer, base, draining, false);
    }

    /// [`Self::shun`], and `until_new_credential` (see [`super::shun::Shun`]).
    fn shun_as(
        &mut self,
        peer: PeerId,
        base: Duration,
        draining: bool,
        until_new_credential: bool,
    ) {
        let n = self.choice.failures.entry(peer).or_insert(0);
        let wait = base.saturating_mul(1 << (*n).min(MAX_SHUN_FAILURES));
        *n += 1;
        let wait = wait.min(super::goaway::MAX_SHUN.max(base));
        let now = Instant::now();
        let until = now + jittered(wait, 0.5);
        let early = (now + jittered(base, 0.5)).min(until);
        let lease_seen = self.lease_seen(&peer);
        self.choice.shunned.insert(
            peer,
            super::shun::Shun {
                until,
                early,
                draining,
                until_new_credential,
                since: now,
                lease_seen,
            },
        );
    }

    /// `router`'s lease expiry in our directory (0: not listed).
    fn lease_seen(&self, router: &PeerId) -> i64 {
        self.directory
            .candidates()
            .iter()
            .find(|c| c.peer == *router)
            .map_or(0, |c| c.lease_expires_at_unix_secs)
    }

    /// Whether a router we could attach to instead is free: matches the
    /// selector, is not held and is not shunned.
    pub(super) fn has_free_candidate(&self) -> bool {
        self.directory.candidates().iter().any(|c| {
            crate::select::matches_selector(c, &self.node.config.routers.selector)
                && !self.slots.contains_key(&c.peer)
                && !self.choice.shunned.contains_key(&c.peer)
        })
    }

    pub(super) fn reserved_peers(&self) -> Vec<PeerId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.is_reserved())
            .map(|(p, _)| *p)
            .collect()
    }

    pub(super) fn admitted_peers(&self) -> Vec<PeerId> {
        self.slots
            .iter()
            .filter(|(_, s)| s.phase.is_admitted())
            .map(|(p, _)| *p)
            .collect()
    }

    pub(super) fn status_snapshot(&self) -> NodeStatus {
        let mut reserved = self.reserved_peers();
        reserved.sort();
        let mut admitted = self.admitted_peers();
        admitted.sort();
        let mut leaving: Vec<PeerId> = self
            .slots
            .iter()
            .filter(|(_, s)| s.leaving.is_some())
            .map(|(p, _)| *p)
            .collect();
        leaving.sort();
        let exposing = !self.node.config.services.expose.is_empty();
        let records_accepted = self.slots.values().any(|s| s.is_reserved() && s.published);
        let mut refusing: Vec<(&PeerId, &String)> = self
            .slots
            .iter()
            .filter_map(|(p, s)| s.records_refused.as_ref().map(|why| (p, why)))
            .collect();
        refusing.sort();
        let records_refused = refusing
            .first()
            .map(|(p, why)| format!("router {p}: {why}"));
        let claims =
            agentmesh_proto::credential::peek_claims(&self.node.credential()).unwrap_or_default();
        NodeStatus {
            enrolled: !self.node.credential().claims.is_empty(),
            credential_expires_at_unix_secs: claims.expires_at_unix_secs,
            routers_wanted: self.node.config.routers.count,
            ready: !reserved.is_empty()
                && (!exposing || records_accepted)
                && !self.node.is_shutting_down(),
            admitted,
            reserved,
            leaving,
            candidates: self
                .directory
                .candidates()
                .iter()
                .filter(|c| crate::select::matches_selector(c, &self.node.config.routers.selector))
                .count(),
            exposing,
            records_accepted,
            records_refused,
            stopping: self.node.is_shutting_down(),
            revoked: self
                .node
                .own_credential_revoked(agentmesh_proto::unix_now()),
            last_router_error: self.last_router_error.clone(),
            failed: None,
        }
    }

    /// Dials new routers until K are held or being acquired; a node that
    /// had lost every router dials one at a time until one serves (see
    /// [`Self::rejoin_want`]).
    pub(super) fn top_up(&mut self) {
        let revoked = self
            .node
            .own_credential_revoked(agentmesh_proto::unix_now());
        self.node
            .metrics
            .routers
            .credential_revoked
            .set(i64::from(revoked));
        if revoked || self.choice.checking_revocation(Instant::now()) {
            // Every router would refuse us (the control plane's signed
            // list names our credential), or one said so and the fetch
            // that settles it is under way: ask no router now.
            return;
        }
        let want = self.rejoin_want();
        let active = self.slots.values().filter(|s| s.leaving.is_none()).count();
        if !self.directory.have() || active >= want || self.node.is_shutting_down() {
            return;
        }
        if let Some(at) = self.choice.replace_after {
            if Instant::now() < at && !self.reserved_peers().is_empty() {
                // Spreading a lost router's replacement (see
                // `replace_lost_later`); `Op::TopUp` comes back at `at`.
                return;
            }
            self.choice.replace_after = None;
        }
        let mut exclude: HashSet<PeerId> = self.slots.keys().copied().collect();
        exclude.extend(self.choice.shunned.keys().copied());
        let mut chosen = crate::select::choose(
            self.directory.candidates(),
            &self.node.config.routers.selector,
            &self.node.config.routers.prefer,
            &exclude,
            want - active,
            &mut rand::thread_rng(),
        );
        let short = want - active - chosen.len();
        if short > 0 && !self.choice.shunned.is_empty() {
            // Fewer than K free candidates: rather than sit below K for a
            // doubled shun, try the shunned router ending soonest again.
            let mut held: HashSet<PeerId> = self.slots.keys().copied().collect();
            held.extend(chosen.iter().map(|c| c.peer));
            let extra = super::shun::fallbacks(
                self.directory.candidates(),
                &self.node.config.routers.selector,
                &held,
                &self.choice.shunned,
                Instant::now(),
                short,
            );
            for c in &extra {
                tracing::debug!(router = %c.peer, "short of K routers: trying a shunned router again early");
                self.choice.shunned.remove(&c.peer);
            }
            chosen.extend(extra);
        }
        if chosen.is_empty() && self.slots.is_empty() && !self.choice.warned_no_router {
            // Once per directory fetch: say what was there.
            self.choice.warned_no_router = true;
            let seen: Vec<_> = self
                .directory
                .candidates()
                .iter()
                .map(|c| (c.peer, &c.labels, c.draining))
                .collect();
            tracing::warn!(
                selector = ?self.node.config.routers.selector,
                shunned = self.choice.shunned.len(),
                ?seen,
                "no router to attach to: none matches the selector or all are shunned"
            );
        }
        for c in chosen {
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(c.peer)
                .addresses(self.attach_addrs(&c.addrs))
                .build();
            let already = self.swarm.is_connected(&c.peer);
            self.slots.insert(c.peer, Slot::new());
            if already {
                // A transit connection to it exists: reuse it.
                let addr = c.addrs[0].clone();
                self.on_router_connected(c.peer, addr);
            } else {
                match self.swarm.dial(opts) {
                    // A dial already under way (e.g. a call's transit
                    // connection) connects us just as well.
                    Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {}
                    Err(e) => {
                        tracing::debug!(router = %c.peer, error = %e, "dial refused");
                        self.slots.remove(&c.peer);
                        self.shun(c.peer, AUTH_FAILED_SHUN, false);
                    }
                }
            }
        }
    }

    /// A router refused our credential as revoked: before another router
    /// is asked, the directory is fetched (its signed revocation list
    /// settles it, see [`super::shun::Choice::revocation_check`]).
    fn check_revocation(&mut self) {
        self.choice.revocation_check = Some(Instant::now());
        if !self.directory.fetching() {
            self.start_directory();
        }
    }

    /// Routers to hold or acquire now: K, or one while a node that had
    /// lost every router holds none. When a whole mesh restarts every
    /// member comes back at once and the routers' CPU goes to handshakes:
    /// one attach each makes the fleet ready in half the work; the other
    /// K − 1 follow after the rejoin spread ([`Self::on_reserved`]). A
    /// first start dials K at once (nothing is storming then, and a dead
    /// router in the directory must not delay readiness).
    fn rejoin_want(&self) -> usize {
        self.choice
            .routers_wanted(self.node.config.routers.count, self.reserved_peers().len())
    }

    pub(super) fn on_router_connected(&mut self, peer: PeerId, addr: Multiaddr) {
        if self.slots.get_mut(&peer).is_some_and(|s| s.connected(addr)) {
            self.start_auth(peer, true);
        }
    }

    fn start_auth(&mut self, router: PeerId, initial: bool) {
        let node = self.node.clone();
        let attached: Vec<PeerId> = self
            .admitted_peers()
            .into_iter()
            .filter(|p| *p != router)
            .collect();
        let slots = &self.slots;
        let slot = self.pushes.slot_for(router, |p| slots.contains_key(p));
        self.ops.push(Box::pin(async move {
            let req = auth::request_for(node.credential(), Purpose::Attach, &attached);
            let req = super::policy_push::stamp(&node, req, slot);
            let result = auth::request(
                node.control.clone(),
                router,
                req,
                node.config.call_timeout(),
            )
            .await;
            super::policy_push::take_admitted_policy(&node, &result).await;
            Op::Auth {
                router,
                initial,
                result,
            }
        }));
    }

    pub(super) fn on_auth(
        &mut self,
        router: PeerId,
        initial: bool,
        result: Result<AuthOutcome, AuthError>,
    ) {
        let m = &self.node.metrics;
        let label = match &result {
            Ok(AuthOutcome::Admitted { .. }) => "admitted",
            Ok(AuthOutcome::Refused(..)) => "refused",
            Ok(AuthOutcome::Busy { .. }) => "busy",
            Ok(AuthOutcome::GoAway(_)) => "go_away",
            Err(_) => "error",
        };
        m.routers
            .auth
            .get_or_create(&crate::metrics::ResultLabel { result: label })
            .inc();
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        match result {
            Ok(AuthOutcome::Admitted {
                until, observed, ..
            }) => {
                tracing::debug!(%router, until, initial, ?observed, "admitted");
                self.on_observed(router, observed);
                let Some(slot) = self.slots.get_mut(&router) else {
                    return;
                };
                let reserve = slot.admitted(initial);
                self.choice.redials.remove(&router);
                if reserve {
                    self.reserve(router);
                }
            }
            Ok(outcome) if !initial => {
                // A fresh credential refused (the router may not have the new
                // key yet): retry after a growing pause, give up after a few.
                tracing::warn!(%router, ?outcome, failures = slot.represent_failures + 1, "re-presentation refused");
                self.represent_failed(router, format!("re-presentation refused: {outcome:?}"));
            }
            Ok(AuthOutcome::Busy {
                retry_after,
                detail,
            }) => {
                // Busy admitting others: not a verdict on us. Ask again on
                // this connection (no new handshake) after its retry-after,
                // jittered, within the redial budget.
                tracing::debug!(%router, ?retry_after, %detail, "router busy: asking again later");
                self.retry_router(router, &format!("busy: {detail}"), false, Some(retry_after));
            }
            Ok(AuthOutcome::Refused(reason, detail)) => {
                tracing::warn!(%router, ?reason, %detail, "router refused admission");
                slot.draining |= reason == AuthRefusal::Draining;
                self.note_error(router, format!("refused admission: {reason:?} {detail}"));
                let wait = match reason {
                    AuthRefusal::UnknownKey | AuthRefusal::NotYetValid => Duration::from_secs(3),
                    AuthRefusal::Overloaded | AuthRefusal::Draining => Duration::from_secs(60),
                    AuthRefusal::Revoked => REVOKED_SHUN,
                    _ => Duration::from_secs(30),
                };
                if reason == AuthRefusal::Revoked {
                    self.node.metrics.routers.router_revoked_refusals.inc();
                    self.forget_router_as(router, wait, true);
                    let _ = self.swarm.disconnect_peer_id(router);
                    self.check_revocation();
                } else {
                    self.drop_router(router, wait);
                }
            }
            Ok(AuthOutcome::GoAway(g)) => {
                tracing::info!(%router, reason = g.reason, "router sent go-away on admission");
                slot.draining |= super::goaway::is_draining(&g);
                let why = GoAwayReason::try_from(g.reason).map_or("other", |r| r.as_str_name());
                self.note_error(router, format!("answered admission with go-away {why}"));
                self.merge_alternatives(&g.alternatives);
                self.drop_router(router, super::goaway::shun_for(&g));
                self.top_up();
            }
            Err(_) if initial && slot.phase != Phase::Authing => {
                // A stale answer: the slot moved on (its connection failed
                // and a fresh one is being made).
            }
            Err(e) => {
                let conn_failed = e.is_connection_failure() || matches!(e, AuthError::Open { .. });
                if initial && conn_failed {
                    // The connection (or the stream, refused by a router
                    // short of auth streams) failed, not the router's
                    // verdict: connect afresh after a backoff.
                    self.conn_failed(router, &e.to_string(), false);
                } else if initial {
                    tracing::warn!(%router, error = %e, "auth exchange failed");
                    self.note_error(router, format!("auth failed: {e}"));
                    self.drop_router(router, AUTH_FAILED_SHUN);
                } else {
                    tracing::warn!(%router, error = %e, failures = slot.represent_failures + 1, "re-presentation failed");
                    self.represent_failed(router, format!("re-presentation failed: {e}"));
                }
            }
        }
        self.publish_status();
    }

    /// A re-presentation to `router` was refused or got no answer: retry
    /// after the [`represent_retry`] pause, or give the router up.
    fn represent_failed(&mut self, router: PeerId, why: String) {
        self.note_error(router, why);
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        if !slot.represent_failed(Instant::now()) {
            tracing::warn!(%router, failures = slot.represent_failures, "re-presentation keeps failing: giving the router up");
            self.drop_router(router, REPRESENT_FAILED_SHUN);
            self.top_up();
        }
    }

    /// The connection to `router` was refused or closed at the dial
    /// (`dialing`) or under the first auth: not the router's verdict. Within
    /// the [`super::redial::BUDGET`], back off (jittered, exponential): at a
    /// failed dial with another router free, let the slot go to it and keep
    /// this one out for the backoff only; otherwise keep the slot and
    /// connect afresh after the backoff. Past the budget, shun it as a
    /// failed router.
    pub(super) fn conn_failed(&mut self, router: PeerId, error: &str, dialing: bool) {
        self.retry_router(router, error, dialing, None);
    }

    /// [`Self::conn_failed`], or (with `retry_after`) a router that answered
    /// busy: the delay honours its retry-after (see
    /// [`super::redial::Redials::next_after`]). With `may_move` (a failed
    /// dial: no connection to keep) and another router free, the slot goes
    /// to it meanwhile.
    fn retry_router(
        &mut self,
        router: PeerId,
        error: &str,
        may_move: bool,
        retry_after: Option<Duration>,
    ) {
        if !self.slots.contains_key(&router) {
            return;
        }
        let dialing = may_move;
        let now = Instant::now();
        let run = self
            .choice
            .redials
            .entry(router)
            .or_insert_with(|| super::redial::Redials::new(now));
        run.renew(now);
        let mut rng = rand::thread_rng();
        let next = match retry_after {
            Some(asked) => run.next_after(now, asked, &mut rng),
            None => run.next_delay(now, &mut rng),
        };
        let Some(delay) = next else {
            // Kept: tried again early (nothing else left), the next run
            // resumes at the delay this one reached (see `super::redial`).
            run.spend();
            tracing::warn!(%router, %error, "connection to router keeps failing: passing it over");
            self.note_error(
                router,
                format!(
                    "connection kept failing for {:?}, passed over: {error}",
                    super::redial::BUDGET
                ),
            );
            self.drop_router(router, AUTH_FAILED_SHUN);
            self.top_up();
            return;
        };
        let attempt = run.attempts();
        if retry_after.is_none() {
            // Busy answers are counted as auth results of their own.
            self.node.metrics.routers.auth_conn_retries.inc();
        }
        let what = if retry_after.is_some() {
            "answered busy"
        } else {
            "connection failed"
        };
        self.note_error(
            router,
            format!("{what} (retry {attempt} in {delay:?}): {error}"),
        );
        if dialing && self.has_free_candidate() {
            tracing::info!(%router, %error, attempt, retry_in = ?delay, "connection to router failed: trying another router meanwhile");
            self.slots.remove(&router);
            let lease_seen = self.lease_seen(&router);
            self.choice.shunned.insert(
                router,
                super::shun::Shun {
                    until: now + delay,
                    early: now + delay,
                    draining: false,
                    until_new_credential: false,
                    since: now,
                    lease_seen,
                },
            );
            self.top_up();
            self.publish_status();
            return;
        }
        if retry_after.is_some() {
            tracing::debug!(%router, %error, attempt, retry_in = ?delay, "router busy: asking again after its retry-after");
        } else {
            tracing::info!(%router, %error, attempt, retry_in = ?delay, "connection to router failed: connecting afresh after a backoff");
        }
        if let Some(slot) = self.slots.get_mut(&router) {
            slot.phase = Phase::Redial;
        }
        self.ops.push(Box::pin(async move {
            tokio::time::sleep(delay).await;
            Op::Redial(router)
        }));
    }

    /// Connects afresh to a router whose first auth's connection failed:
    /// auth on the connection left if one is (the failed one has closed by
    /// now), else dial.
    pub(super) fn redial(&mut self, router: PeerId) {
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        if slot.phase != Phase::Redial {
            return;
        }
        if self.swarm.is_connected(&router) {
            slot.reauth();
            self.start_auth(router, true);
            return;
        }
        slot.phase = Phase::Dialing;
        let addrs = self
            .directory
            .candidates()
            .iter()
            .find(|c| c.peer == router)
            .map(|c| c.addrs.clone())
            .or_else(|| slot.addr.clone().map(|a| vec![a]))
            .unwrap_or_default();
        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(router)
            .addresses(self.attach_addrs(&addrs))
            .build();
        match self.swarm.dial(opts) {
            // Connected (ConnectionEstablished starts the auth), or a dial
            // already under way will be.
            Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {}
            Err(e) => {
                tracing::warn!(%router, error = %e, "cannot dial router afresh");
                self.drop_router(router, AUTH_FAILED_SHUN);
                self.top_up();
            }
        }
    }

    /// The addresses of a router we dial to attach to it: with direct
    /// connections on, only those of our direct transport where it offers
    /// any (what it observes is then our listening socket's mapping:
    /// `select::direct_attach_addrs`); else all.
    fn attach_addrs(&self, addrs: &[libp2p::Multiaddr]) -> Vec<libp2p::Multiaddr> {
        let direct = &self.swarm.behaviour().direct;
        if direct.enabled() {
            crate::select::direct_attach_addrs(addrs, direct.quic())
        } else {
            addrs.to_vec()
        }
    }

    /// Forgets a router, closes our connection to it and shuns it for `wait`
    /// (never early if it said it is draining).
    pub(super) fn drop_router(&mut self, router: PeerId, wait: Duration) {
        self.forget_router(router, wait);
        let _ = self.swarm.disconnect_peer_id(router);
    }

    /// [`Self::drop_router`] without closing the connection: the slot, its
    /// reservation and our records' mention of the router go, and it is
    /// shunned for `wait`.
    pub(super) fn forget_router(&mut self, router: PeerId, wait: Duration) {
        self.forget_router_as(router, wait, false);
    }

    /// [`Self::forget_router`], shunned until the credential changes when
    /// `revoked` (the router refused it as revoked).
    fn forget_router_as(&mut self, router: PeerId, wait: Duration, revoked: bool) {
        let draining = match self.slots.remove(&router) {
            Some(s) => {
                if let Some(l) = s.listener() {
                    self.swarm.remove_listener(l);
                }
                s.draining
            }
            None => false,
        };
        self.shun_as(router, wait, draining, revoked);
        self.records.dirty = true;
        self.publish_status();
    }

    fn reserve(&mut self, router: PeerId) {
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        let Some(addr) = slot.addr.clone() else {
            return;
        };
        let circuit = router_base(&addr, router).with(Protocol::P2pCircuit);
        match self.swarm.listen_on(circuit) {
            Ok(id) => {
                // No deadline of ours: closing a relay listener whose
                // reservation is still pending races libp2p-relay 0.22's
                // client, which panics ("Relay connection exist",
                // priv_client.rs:303) when the acceptance arrives after the
                // close; 382 member swarms died that way in a 5,000-member
                // ladder at load 37. Its own request timeout ends a
                // reservation nobody answers (ListenerClosed, retried).
                slot.reserving(id);
            }
            Err(e) => {
                tracing::warn!(%router, error = %e, "cannot request a reservation");
                slot.reserve_not_asked(Instant::now());
            }
        }
    }

    pub(super) fn on_reserved(&mut self, router: PeerId) {
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        if slot.reserved() {
            self.choice.failures.remove(&router);
            self.choice.lifted.remove(&router);
            let rejoined = std::mem::replace(&mut self.choice.held_before, true)
                && self.reserved_peers().len() == 1;
            if rejoined {
                // Back from holding none: the other K − 1 after a random
                // wait, so a returning fleet's second attaches come after
                // its first ones (see `rejoin_want`).
                self.spread_attaches(self.node.config.routers.rejoin_spread, "rejoin");
                self.top_up();
            }
            self.node
                .metrics
                .routers
                .reservations
                .get_or_create(&crate::metrics::ResultLabel { result: "ok" })
                .inc();
            tracing::info!(%router, "relay reservation active");
            self.records.dirty = true;
            self.release_leaving();
            if self.node.config.services.expose.is_empty() {
                self.publish_status();
            } else {
                self.publish_records();
            }
        }
    }

    pub(super) fn on_listener_closed(&mut self, listener: ListenerId, error: Option<String>) {
        let free = self.has_free_candidate();
        let Some(router) = self
            .slots
            .iter()
            .find(|(_, s)| s.listener() == Some(listener))
            .map(|(p, _)| *p)
        else {
            return;
        };
        let connected = self.swarm.is_connected(&router);
        let now = Instant::now();
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        let lost = slot.reservation_lost(error.as_deref(), connected, now);
        self.records.dirty = true;
        self.node
            .metrics
            .routers
            .reservations
            .get_or_create(&crate::metrics::ResultLabel { result: "error" })
            .inc();
        let (give_up, failures) = match lost {
            // The relay client dropped an active reservation on its own
            // while the router still holds us (libp2p-relay 0.22 does so
            // when an outbound circuit request through that router times
            // out): ask again now, no backoff and no re-admission, so the
            // member is unreachable there for one round trip, not seconds.
            Lost::ReserveNow => {
                self.note_error(
                    router,
                    "reservation reset by the relay client: asked again at once",
                );
                tracing::info!(%router, "relay reservation reset by the client: reserving again");
                self.reserve(router);
                self.publish_status();
                return;
            }
            Lost::Wait { give_up, failures } => (give_up, failures),
        };
        self.note_error(
            router,
            format!(
                "reservation refused or lost ({failures} in a row): {}",
                error.as_deref().unwrap_or("closed")
            ),
        );
        if give_up && free {
            // A router that keeps refusing reservations (e.g. its relay is
            // full) would hold this slot forever: move to another router.
            tracing::warn!(%router, error = ?error, failures, "relay reservation refused again: replacing the router");
            self.node
                .metrics
                .routers
                .routers_replaced
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: "reservation_refused",
                })
                .inc();
            self.drop_router(router, RESERVE_REFUSED_SHUN);
            self.top_up();
            return;
        }
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        let retry_in = if give_up {
            slot.keep_waiting(now)
        } else {
            match slot.phase {
                Phase::ReserveWait(at) => at.saturating_duration_since(now),
                _ => Duration::ZERO,
            }
        };
        tracing::warn!(%router, error = ?error, ?retry_in, "relay reservation refused or lost");
        self.publish_status();
    }

    pub(super) fn retry_reservations(&mut self, now: Instant) {
        let due: Vec<PeerId> = self
            .slots
            .iter()
            .filter(|(_, s)| s.reserve_due(now))
            .map(|(p, _)| *p)
            .collect();
        for router in due {
            if self.swarm.is_connected(&router) {
                // Re-admit first: a refused reservation may mean the router
                // no longer holds us as attached.
                if let Some(slot) = self.slots.get_mut(&router) {
                    slot.reauth();
                }
                self.start_auth(router, true);
            } else {
                self.drop_router(router, Duration::from_secs(2));
            }
        }
    }

    pub(super) fn retry_represent(&mut self, now: Instant) {
        let due: Vec<PeerId> = self
            .slots
            .iter_mut()
            .filter_map(|(p, s)| s.take_represent(now).then_some(*p))
            .collect();
        for router in due {
            self.start_auth(router, false);
        }
    }

    /// After a refresh: show the new credential to every admitted router.
    pub(super) fn represent_all(&mut self) {
        for router in self.admitted_peers() {
            self.start_auth(router, false);
        }
    }

    pub(super) fn on_router_lost(&mut self, peer: PeerId) {
        let Some(slot) = self.slots.get(&peer) else {
            return;
        };
        if let Some(shun) = slot.leaving {
            // Kept after its go-away until K others were reserved; it closed
            // us first (its grace ended): let it go, whatever its phase.
            tracing::info!(router = %peer, "router that sent go-away closed our connection");
            self.count_release("router_closed");
            self.note_error(peer, "sent go-away, then closed our connection");
            self.drop_router(peer, shun);
            self.top_up();
            return;
        }
        match slot.phase {
            // A dial or a fresh connection is under way: its own result
            // (connected, or a dial error) decides.
            Phase::Dialing | Phase::Redial => return,
            // The connection closed under the first auth: not a refusal.
            Phase::Authing => {
                self.conn_failed(peer, "connection closed during the first auth", false);
                return;
            }
            _ => {}
        }
        tracing::warn!(router = %peer, "lost connection to router");
        self.note_error(peer, "lost the connection");
        self.drop_router(peer, Duration::from_secs(3));
        self.replace_lost_later();
        self.top_up();
    }

    /// A router was lost: while another still serves us, wait a random
    /// time of up to `--router-replace-spread-ms` before replacing it, so
    /// the members a killed router held do not all re-attach to the
    /// survivors in the same instant (the wait is cut short if the last
    /// serving router goes too).
    fn replace_lost_later(&mut self) {
        self.spread_attaches(self.node.config.routers.replace_spread, "replace");
    }

    /// Puts the next attaches off by a random wait of up to `spread` while
    /// a router serves us (`Op::TopUp` comes back when it ends; a wait
    /// already running is kept), counted by `reason` (one of
    /// `metrics::SPREAD_REASONS`).
    fn spread_attaches(&mut self, spread: Duration, reason: &'static str) {
        if spread.is_zero()
            || self.reserved_peers().is_empty()
            || self.choice.replace_after.is_some()
        {
            return;
        }
        self.node
            .metrics
            .routers
            .attaches_spread
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
        let wait = spread.mul_f64(rand::Rng::gen_range(&mut rand::thread_rng(), 0.0..=1.0));
        self.choice.replace_after = Some(Instant::now() + wait);
        tracing::debug!(
            ?wait,
            reason,
            "attaching further routers after a spread wait"
        );
        self.ops.push(Box::pin(async move {
            tokio::time::sleep(wait).await;
            Op::TopUp
        }));
    }

    pub(super) fn on_router_dial_failed(&mut self, peer: PeerId, error: &str) {
        if matches!(self.slots.get(&peer), Some(s) if s.phase == Phase::Dialing)
            && !self.swarm.is_connected(&peer)
        {
            // Refused or closed before or while handshaking (a router
            // short of room for unadmitted connections does that): back off.
            self.conn_failed(peer, error, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuit_base_replaces_any_trailing_peer_id() {
        let r = PeerId::random();
        let plain: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
        let with: Multiaddr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{r}")
            .parse()
            .expect("addr");
        assert_eq!(router_base(&plain, r), with);
        assert_eq!(router_base(&with, r), with);
    }
}
