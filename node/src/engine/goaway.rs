//! Go-away (`/agentmesh/goaway/1`): accepted only from a router we are
//! admitted by; make-before-break: the router is marked leaving, a
//! replacement is attached, reserved and given our records, and only then is
//! the old router released and shunned for its `retry_after` (≤ 1 h).
//!
//! A leaving router is released only once K routers that are not leaving
//! are reserved (and hold our records). Short of that — the alternatives
//! refuse us, or fewer than K others exist — it is kept: it still serves
//! until its drain or trim grace ends and then closes us itself, while the
//! node keeps trying to reach K elsewhere (calls route around it). So a
//! member never lets go of a working router for nothing: before, it
//! released the leaving router as soon as no replacement was in progress,
//! leaving it below K (or on one router) for as long as the survivors
//! refused it. Releases are counted by reason
//! (`agentmesh_node_goaway_releases_total`: `replaced`, `router_closed`).
//!
//! The decisions are pure and tested without a swarm: [`GoAways`] (which
//! arriving stream is read, bounded), [`shun_for`], [`alternatives`] and
//! [`release_due`]; the engine performs the exchange and the moves.

use std::time::Duration;

use agentmesh_proto::pb::mesh::{Alternative, GoAway, GoAwayReason};
use agentmesh_wire::goaway::{self, GoAwayError};
use libp2p::{Multiaddr, PeerId, Stream};

use super::slot::Slot;
use super::{Engine, Op};
use crate::metrics::ResultLabel;
use crate::select::Candidate;

/// Longest a go-away may keep us away from a router.
pub(crate) const MAX_SHUN: Duration = Duration::from_secs(3600);
/// Shortest shun after a go-away.
const MIN_SHUN: Duration = Duration::from_secs(5);
/// Go-away exchanges in progress at once; more are dropped unanswered.
const MAX_PENDING: usize = 16;

/// How long a go-away asks us to stay away.
pub(crate) fn shun_for(g: &GoAway) -> Duration {
    Duration::from_secs(u64::from(g.retry_after_secs)).clamp(MIN_SHUN, MAX_SHUN)
}

/// Whether a go-away says the router is draining (leaving for good).
pub(crate) fn is_draining(g: &GoAway) -> bool {
    GoAwayReason::try_from(g.reason) == Ok(GoAwayReason::Draining)
}

/// Directory-like candidates from a go-away's alternatives.
pub(crate) fn alternatives(alts: &[Alternative]) -> Vec<Candidate> {
    alts.iter()
        .filter_map(|a| {
            let peer = PeerId::from_bytes(&a.peer_id).ok()?;
            let addrs: Vec<Multiaddr> = a.addrs.iter().filter_map(|s| s.parse().ok()).collect();
            if addrs.is_empty() {
                return None;
            }
            let load = a.load.as_ref().map_or(0.0, |l| {
                let m = f64::from(l.attached_members);
                if l.high_watermark > 0 {
                    m / f64::from(l.high_watermark)
                } else {
                    m
                }
            });
            Some(Candidate {
                peer,
                addrs,
                labels: Default::default(),
                load,
                draining: false,
                lease_expires_at_unix_secs: 0,
            })
        })
        .collect()
}

/// What becomes of an arriving go-away stream.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Read and obeyed.
    Read,
    /// From a router that has not admitted us: counted `ignored`.
    Ignored,
    /// [`MAX_PENDING`] exchanges already in progress: dropped unread,
    /// counted `overflow` (the router's grace still ends in a close, which
    /// the node handles as a lost router).
    Overflow,
}

fn pending_verdict(admitted: bool, pending: usize) -> Verdict {
    if !admitted {
        Verdict::Ignored
    } else if pending >= MAX_PENDING {
        Verdict::Overflow
    } else {
        Verdict::Read
    }
}

/// Go-away exchanges in progress (at most [`MAX_PENDING`]).
#[derive(Debug, Default)]
pub(crate) struct GoAways {
    pending: usize,
}

impl GoAways {
    /// A go-away stream arrived from a router that has (`admitted`) or has
    /// not admitted us: what to do with it; a [`Verdict::Read`] counts as
    /// in progress until [`GoAways::finished`].
    fn arrive(&mut self, admitted: bool) -> Verdict {
        let v = pending_verdict(admitted, self.pending);
        if v == Verdict::Read {
            self.pending += 1;
        }
        v
    }

    /// An exchange ended (read, failed or timed out).
    fn finished(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }
}

/// Whether the leaving routers among `slots` may be released: K routers
/// that are not leaving serve (reserved, holding our records when we
/// expose services). Short of that they are kept (see the module docs).
pub(crate) fn release_due<'a>(
    slots: impl Iterator<Item = &'a Slot>,
    k: usize,
    exposing: bool,
) -> bool {
    slots.filter(|s| s.serves(exposing)).count() >= k
}

impl Engine {
    fn count_goaway(&self, result: &'static str) {
        self.node
            .metrics
            .routers
            .goaways
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// A go-away stream arrived from `peer`.
    pub(super) fn on_goaway_stream(&mut self, peer: PeerId, mut stream: Stream) {
        let admitted = self.slots.get(&peer).is_some_and(|s| s.phase.is_admitted());
        match self.goaway.arrive(admitted) {
            Verdict::Read => {}
            Verdict::Ignored => {
                if let Some(suppressed) = self.node.metrics.log.pass(&peer, "goaway_ignored") {
                    tracing::warn!(%peer, suppressed, "go-away ignored: not from a router we are attached to (logged at most once a minute per peer)");
                }
                self.count_goaway("ignored");
                return;
            }
            Verdict::Overflow => {
                if let Some(suppressed) = self.node.metrics.log.pass(&peer, "goaway_overflow") {
                    tracing::warn!(
                        %peer,
                        pending = self.goaway.pending,
                        suppressed,
                        "go-away dropped unread: {MAX_PENDING} go-away exchanges already in progress (logged at most once a minute per peer)"
                    );
                }
                self.count_goaway("overflow");
                return;
            }
        }
        let deadline = self.node.config.call_timeout();
        self.ops.push(Box::pin(async move {
            let result = goaway::receive(&mut stream, deadline).await;
            Op::GoAway {
                router: peer,
                result,
            }
        }));
    }

    pub(super) fn on_goaway(&mut self, router: PeerId, result: Result<GoAway, GoAwayError>) {
        self.goaway.finished();
        let g = match result {
            Ok(g) => g,
            Err(e) => {
                if let Some(suppressed) = self.node.metrics.log.pass(&router, "goaway_malformed") {
                    tracing::warn!(%router, error = %e, suppressed, "bad go-away (logged at most once a minute per router)");
                }
                self.count_goaway("error");
                return;
            }
        };
        let label = match GoAwayReason::try_from(g.reason) {
            Ok(GoAwayReason::Draining) => "draining",
            Ok(GoAwayReason::Overloaded) => "overloaded",
            _ => "other",
        };
        self.count_goaway(label);
        if !self.slots.contains_key(&router) {
            return;
        }
        let shun = shun_for(&g);
        if let Some(suppressed) = self.node.metrics.log.pass(&router, "goaway_obeyed") {
            tracing::info!(%router, reason = label, alternatives = g.alternatives.len(), ?shun, suppressed, "go-away: moving (make before break; logged at most once a minute per router)");
        }
        self.note_error(
            router,
            format!(
                "sent go-away ({label}, {} alternatives): moving",
                g.alternatives.len()
            ),
        );
        let Some(slot) = self.slots.get_mut(&router) else {
            return;
        };
        slot.leaving = Some(shun);
        slot.linger_until = Some(tokio::time::Instant::now() + shun);
        slot.draining |= is_draining(&g);
        // The record stops naming it (see `publish_records`).
        self.records.dirty = true;
        self.merge_alternatives(&g.alternatives);
        self.top_up();
        self.release_leaving();
        self.publish_status();
    }

    /// Adds a go-away's alternatives to the candidates (directory entries win).
    pub(super) fn merge_alternatives(&mut self, alts: &[Alternative]) {
        self.directory.merge(alternatives(alts));
    }

    /// Releases leaving routers once K routers that are not leaving are
    /// reserved (and hold our records); until then they stay (see the
    /// module docs).
    pub(super) fn release_leaving(&mut self) {
        let leaving: Vec<(PeerId, Duration, Option<tokio::time::Instant>)> = self
            .slots
            .iter()
            .filter_map(|(p, s)| s.leaving.map(|d| (*p, d, s.linger_until)))
            .collect();
        if leaving.is_empty() {
            return;
        }
        let exposing = !self.node.config.services.expose.is_empty();
        if release_due(
            self.slots.values(),
            self.node.config.routers.count,
            exposing,
        ) {
            for (router, shun, until) in leaving {
                tracing::info!(%router, "released after go-away: replaced");
                self.count_release("replaced");
                // Not held any more, but connected while calls go through
                // it (see `super::linger`).
                self.forget_router(router, shun);
                self.linger(router, until.unwrap_or_else(tokio::time::Instant::now));
            }
        }
    }

    /// Counts a leaving router let go, by [`crate::metrics::GOAWAY_RELEASE_REASONS`].
    pub(super) fn count_release(&self, reason: &'static str) {
        self.node
            .metrics
            .routers
            .goaway_releases
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_is_an_overflow_not_an_unknown_router() {
        assert_eq!(pending_verdict(true, 0), Verdict::Read);
        assert_eq!(pending_verdict(true, MAX_PENDING - 1), Verdict::Read);
        assert_eq!(pending_verdict(true, MAX_PENDING), Verdict::Overflow);
        assert_eq!(pending_verdict(false, 0), Verdict::Ignored);
        assert_eq!(pending_verdict(false, MAX_PENDING), Verdict::Ignored);
        assert!(crate::metrics::GOAWAY_RESULTS.contains(&"overflow"));
    }

    #[test]
    fn exchanges_in_progress_are_bounded_and_freed_when_they_end() {
        let mut g = GoAways::default();
        assert_eq!(g.arrive(false), Verdict::Ignored);
        for _ in 0..MAX_PENDING {
            assert_eq!(g.arrive(true), Verdict::Read);
        }
        assert_eq!(g.arrive(true), Verdict::Overflow);
        assert_eq!(
            g.pending, MAX_PENDING,
            "an overflow is not counted in progress"
        );
        g.finished();
        assert_eq!(g.arrive(true), Verdict::Read);
        for _ in 0..MAX_PENDING + 3 {
            g.finished();
        }
        assert_eq!(g.pending, 0);
    }

    #[test]
    fn leaving_routers_go_only_once_k_others_serve() {
        let serving = || {
            let mut s = Slot::new();
            s.connected("/ip4/127.0.0.1/tcp/1".parse().expect("addr"));
            s.admitted(true);
            s.reserving(libp2p::core::transport::ListenerId::next());
            s.reserved();
            s
        };
        let mut leaving = serving();
        leaving.leaving = Some(Duration::from_secs(5));
        leaving.published = true;
        let unpublished = serving();
        let mut published = serving();
        published.published = true;
        // K = 2, exposing: the leaving one never counts, nor one without records.
        let slots = [leaving.clone(), published.clone(), unpublished.clone()];
        assert!(!release_due(slots.iter(), 2, true));
        assert!(release_due(slots.iter(), 2, false));
        let mut second = serving();
        second.published = true;
        let slots = [leaving, published, second, Slot::new()];
        assert!(release_due(slots.iter(), 2, true));
        assert!(
            !release_due(slots.iter(), 3, true),
            "a dialing slot does not serve"
        );
    }

    #[test]
    fn shun_is_bounded_and_alternatives_parse() {
        let g = GoAway {
            retry_after_secs: 10_000,
            ..Default::default()
        };
        assert_eq!(shun_for(&g), MAX_SHUN);
        assert_eq!(shun_for(&GoAway::default()), MIN_SHUN);
        let p = PeerId::random();
        let alts = vec![
            Alternative {
                peer_id: p.to_bytes(),
                addrs: vec!["/ip4/127.0.0.1/tcp/4001".into(), "junk".into()],
                load: None,
            },
            Alternative {
                peer_id: vec![1, 2, 3],
                addrs: vec!["/ip4/127.0.0.1/tcp/4002".into()],
                load: None,
            },
        ];
        let c = alternatives(&alts);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].peer, p);
        assert_eq!(c[0].addrs.len(), 1);
    }
}
