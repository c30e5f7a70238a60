//! Directory refresh: the router directory (and the key set, and the
//! revocations and the signed policy served beside it) is fetched at start, then every
//! `--directory-interval-secs` ±20%, so a fleet does not come back
//! together; a failure is retried after a jittered backoff from 2 s up to
//! the interval or [`RETRY_MAX`], whichever is shorter (a long interval
//! must not leave a member without a directory for long). Between fetches
//! the cached directory is used, so a router's death does not send the
//! fleet to the control plane at once.
//!
//! A member the cached directory cannot help is in a hurry ([`Hurry`]).
//! With no router held (every router it knew sent go-away, or none is
//! reachable) it fetches again after 1–2 s, doubling per fetch up to 4 s
//! for the first [`HURRY_FAST_FOR`] (60 s: a restart is short, and a
//! router back must be seen within seconds, so no pause passes 8 s), then
//! up to [`HURRY_MAX`] (30 s) for as long as it lasts. Short of K with
//! no free candidate left, the same doubling straight up to the interval.
//! Each pause is drawn from `[d, 2d]`, so members orphaned together (a
//! whole mesh restarting) spread their fetches over the window. The
//! control plane's unauthenticated budget (GetDirectory and GetKeys, 1,000
//! a second by default, answering the rest with retry-after, which the
//! client honours within its time budget) paces them: 10,000 orphaned
//! members ask about 1,700 times a second for the first minute (the
//! budget sheds the excess), then about 220 times a second. A fetch shows
//! routers back (a restarted router under a new PeerId is simply a new
//! candidate; one that kept its PeerId ends its draining shun, see
//! [`super::shun::Choice::lift_returned`]), so members are back within
//! seconds of the first router answering instead of after the interval.
//! The hurry ends once K routers are held (or, for its no-router form,
//! one), and starts over when the last router is lost. A fetch in a hurry
//! reads the key set only when it must ([`super::directory_keys`]), so a
//! returning fleet's fetches cost the control plane one call each.
//!
//! The key set is written to the data dir only when it changed: a write is
//! an fsync, and a fleet of thousands of members sharing a disk rewrote
//! the same bytes every interval.
//!
//! [`Directory`] is the schedule and the cache: pure transitions taking
//! `now`, tested without a swarm; the fetch runs as an engine op.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{ClientError, HeldPolicyVersion};
use agentmesh_proto::pb::controlplane::GetDirectoryResponse;
use agentmesh_proto::pb::credential::KeySet;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

use super::directory_keys::{KeysRead, signed_by_key_not_held};
use super::slot::Phase;
use super::{Engine, Op, backoff, jittered};
use crate::select::Candidate;

/// Shortest pause before retrying a failed fetch (doubling per failure, up
/// to the interval).
const RETRY_MIN: Duration = Duration::from_secs(2);
/// Longest pause before retrying a failed fetch, whatever the interval.
const RETRY_MAX: Duration = Duration::from_secs(60);
/// First pause of a hurry (drawn from `[d, 2d]`), doubling per fetch.
pub(crate) const HURRY_MIN: Duration = Duration::from_secs(1);
/// Longest pause (before the `[d, 2d]` draw) of the first
/// [`HURRY_FAST_FOR`] with no router held.
pub(crate) const HURRY_FAST_MAX: Duration = Duration::from_secs(4);
/// How long a hurry with no router held keeps its pauses short.
pub(crate) const HURRY_FAST_FOR: Duration = Duration::from_secs(60);
/// Longest a fetch made in a hurry may take (the client's own retries of
/// an unreachable control plane, honouring its retry-after, included):
/// past it the fetch counts as failed and the hurry's schedule, not the
/// client's backoff (up to 10 s a step for its 180 s budget), decides when
/// to ask again, so a control plane back from a restart is seen soon.
pub(crate) const HURRY_FETCH_LIMIT: Duration = Duration::from_secs(10);
/// Longest pause of a hurry with no router held, after the first
/// [`HURRY_FAST_FOR`] (before the `[d, 2d]` draw).
pub(crate) const HURRY_MAX: Duration = Duration::from_secs(30);

/// Why the cached directory cannot help, so the next fetch comes soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hurry {
    /// No router held: every one sent go-away, or none is reachable.
    NoRouter,
    /// Fewer than K held and no free candidate to try.
    ShortOfK,
}

impl Hurry {
    /// The metric label of fetches made in this hurry.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Hurry::NoRouter => "no_router",
            Hurry::ShortOfK => "short_of_k",
        }
    }
}

/// A hurry in progress.
#[derive(Debug, Clone, Copy)]
struct HurryRun {
    why: Hurry,
    /// Fetches made in it so far.
    fetches: u32,
    /// When it began.
    since: Instant,
    /// When its next fetch is due.
    at: Instant,
}

/// The pause before fetch number `n` (0-based) of a hurry whose pauses
/// grow up to `max`: `min(HURRY_MIN × 2^n, max)`, drawn from `[d, 2d]`.
pub(crate) fn hurry_pause(n: u32, max: Duration) -> Duration {
    jittered(HURRY_MIN.saturating_mul(1 << n.min(16)).min(max), 1.0)
}

/// Why a directory fetch failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// The control plane client gave up.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A fetch in a hurry took longer than [`HURRY_FETCH_LIMIT`].
    #[error("no answer within {0:?} (a fetch with no router held)")]
    TooSlow(Duration),
}

/// The cached directory and when to fetch it next.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    interval: Duration,
    next: Instant,
    failures: u32,
    in_flight: bool,
    /// A fetch has succeeded once: routers can be chosen.
    have: bool,
    /// Routers from the directory, then go-away alternatives not in it.
    candidates: Vec<Candidate>,
    /// Their addresses, shared with call tasks in [`crate::command::Routes`].
    addrs: Arc<HashMap<PeerId, Vec<Multiaddr>>>,
    /// The key set last written to the data dir (by this schedule).
    keys_stored: Option<KeySet>,
    /// The hurry in force, if any.
    hurry: Option<HurryRun>,
    /// When the fetch in flight (or the last one) started.
    started_at: Instant,
    /// When the key set was last read with the directory.
    keys_read: KeysRead,
}

impl Directory {
    /// Nothing fetched yet; the first fetch is due at `now`.
    pub(crate) fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval: interval.max(Duration::from_secs(1)),
            next: now,
            failures: 0,
            in_flight: false,
            have: false,
            candidates: Vec::new(),
            addrs: Arc::default(),
            keys_stored: None,
            hurry: None,
            started_at: now,
            keys_read: KeysRead::default(),
        }
    }

    /// Whether a fetch starting at `now` reads the key set whatever the
    /// directory says (see [`super::directory_keys`]).
    pub(crate) fn keys_due(&self, now: Instant) -> bool {
        self.keys_read.due(self.hurry.is_some(), self.interval, now)
    }

    /// The key set was read with the directory at `now`.
    pub(crate) fn keys_were_read(&mut self, now: Instant) {
        self.keys_read.read(now);
    }

    /// Whether a fetch should start now: the interval's (or a failure's
    /// retry) is due, or the hurry's.
    pub(crate) fn due(&self, now: Instant) -> bool {
        !self.in_flight && (now >= self.next || self.hurry.is_some_and(|h| now >= h.at))
    }

    /// A fetch started at `now`.
    pub(crate) fn started(&mut self, now: Instant) {
        self.in_flight = true;
        self.started_at = now;
    }

    /// Whether a fetch is under way.
    pub(crate) fn fetching(&self) -> bool {
        self.in_flight
    }

    /// When the fetch in flight (or the last one) started.
    pub(crate) fn started_at(&self) -> Instant {
        self.started_at
    }

    /// The hurry in force, if any.
    pub(crate) fn hurry(&self) -> Option<Hurry> {
        self.hurry.map(|h| h.why)
    }

    /// Says at `now` whether (and why) the member is in a hurry (see the
    /// module docs). Entering one, or losing the last router, schedules a
    /// fetch after the first pause; a hurry that ends lets the interval
    /// schedule alone decide again. Returns whether a new hurry began.
    pub(crate) fn set_hurry(&mut self, hurry: Option<Hurry>, now: Instant) -> bool {
        match (self.hurry, hurry) {
            (_, None) => {
                self.hurry = None;
                false
            }
            // Still in the same hurry, or back to one router of K: the
            // doubling goes on.
            (Some(run), Some(new))
                if run.why == new || (run.why, new) == (Hurry::NoRouter, Hurry::ShortOfK) =>
            {
                self.hurry = Some(HurryRun { why: new, ..run });
                false
            }
            // A new hurry, or the last router lost: start over, soon.
            (_, Some(why)) => {
                let mut run = HurryRun {
                    why,
                    fetches: 0,
                    since: now,
                    at: now,
                };
                run.at = now + hurry_pause(0, self.hurry_cap(&run, now));
                self.hurry = Some(run);
                true
            }
        }
    }

    /// The longest pause (before the draw) of `run` at `now`.
    fn hurry_cap(&self, run: &HurryRun, now: Instant) -> Duration {
        let cap = match run.why {
            Hurry::NoRouter if now.saturating_duration_since(run.since) < HURRY_FAST_FOR => {
                HURRY_FAST_MAX
            }
            Hurry::NoRouter => HURRY_MAX,
            Hurry::ShortOfK => self.interval,
        };
        cap.min(self.interval)
    }

    /// The hurry's next fetch, after one ended at `now` (success or not).
    fn hurry_next(&mut self, now: Instant) {
        if let Some(mut run) = self.hurry {
            run.fetches += 1;
            run.at = now + hurry_pause(run.fetches, self.hurry_cap(&run, now));
            self.hurry = Some(run);
        }
    }

    /// A fetch at `now` returned `routers`: they replace the candidates.
    /// Returns the wait before the next fetch (the interval ±20%).
    pub(crate) fn fetched(&mut self, routers: Vec<Candidate>, now: Instant) -> Duration {
        self.in_flight = false;
        self.failures = 0;
        self.have = true;
        self.candidates = routers;
        self.reindex();
        let wait = jittered(self.interval.mul_f64(0.8), 0.5);
        self.next = now + wait;
        self.hurry_next(now);
        wait
    }

    /// A fetch failed at `now`: the cache stays; retried after the returned backoff.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        self.in_flight = false;
        self.failures += 1;
        let wait = backoff(self.failures, RETRY_MIN, self.interval.min(RETRY_MAX));
        self.next = now + wait;
        self.hurry_next(now);
        wait
    }

    /// Whether `keys` differ from the set last stored; if so they count as
    /// stored from now on (the caller writes them).
    pub(crate) fn keys_to_store(&mut self, keys: &KeySet) -> bool {
        if self.keys_stored.as_ref() == Some(keys) {
            return false;
        }
        self.keys_stored = Some(keys.clone());
        true
    }

    /// Adds routers (a go-away's alternatives) not already known; directory
    /// entries win. Returns how many were added.
    pub(crate) fn merge(&mut self, more: Vec<Candidate>) -> usize {
        let before = self.candidates.len();
        for c in more {
            if !self.candidates.iter().any(|k| k.peer == c.peer) {
                self.candidates.push(c);
            }
        }
        let added = self.candidates.len() - before;
        if added > 0 {
            self.reindex();
        }
        added
    }

    fn reindex(&mut self) {
        self.addrs = Arc::new(
            self.candidates
                .iter()
                .map(|c| (c.peer, c.addrs.clone()))
                .collect(),
        );
    }

    /// Whether a fetch has succeeded once.
    pub(crate) fn have(&self) -> bool {
        self.have
    }

    /// The routers to choose from.
    pub(crate) fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Their addresses (cheap to clone).
    pub(crate) fn addrs(&self) -> Arc<HashMap<PeerId, Vec<Multiaddr>>> {
        self.addrs.clone()
    }

    /// The routers known now.
    pub(crate) fn known(&self) -> HashSet<PeerId> {
        self.candidates.iter().map(|c| c.peer).collect()
    }
}

impl Engine {
    /// Tells the schedule at `now` whether the member is in a hurry (see
    /// the module docs): no router held and none being acquired (only
    /// reconnecting after failed connections, if any), or fewer than K
    /// routers with no free candidate left.
    pub(super) fn update_hurry(&mut self, now: Instant) {
        let hurry = if !self.directory.have()
            || self.node.is_shutting_down()
            || self
                .node
                .own_credential_revoked(agentmesh_proto::unix_now())
        {
            // A revoked member has no router to hurry to.
            None
        } else {
            let held = self.slots.values().any(|s| s.is_reserved());
            let trying = self.slots.values().any(|s| {
                s.leaving.is_none()
                    && matches!(
                        s.phase,
                        Phase::Dialing | Phase::Authing | Phase::Reserving(_)
                    )
            });
            let active = self.slots.values().filter(|s| s.leaving.is_none()).count();
            if !held && !trying {
                Some(Hurry::NoRouter)
            } else if active < self.node.config.routers.count && !self.has_free_candidate() {
                Some(Hurry::ShortOfK)
            } else {
                None
            }
        };
        if self.directory.set_hurry(hurry, now) {
            tracing::debug!(
                ?hurry,
                "the cached directory offers no router: fetching it again soon"
            );
        }
    }

    pub(super) fn start_directory(&mut self) {
        let schedule = self.directory.hurry().map_or("interval", Hurry::label);
        self.node
            .metrics
            .routers
            .directory_fetches
            .get_or_create(&crate::metrics::ScheduleLabel { schedule })
            .inc();
        let now = Instant::now();
        self.directory.started(now);
        let keys_due = self.directory.keys_due(now);
        let node = self.node.clone();
        let limit = self.directory.hurry().map(|_| HURRY_FETCH_LIMIT);
        self.ops.push(Box::pin(async move {
            let fetch = async {
                // Naming the copy we hold: an unchanged policy is not sent.
                let held = node.policy.held().map(|h| HeldPolicyVersion {
                    epoch: h.epoch,
                    version: h.version,
                });
                let dir = node.client.get_directory_holding(held.as_ref()).await?;
                let keys = if keys_due
                    || signed_by_key_not_held(&dir, &node.trust(), agentmesh_proto::unix_now())
                {
                    Some(node.client.get_keys().await?)
                } else {
                    None
                };
                // The policy served beside the directory, verified with the
                // keys just fetched (a rotation may have re-signed it),
                // unless they are older than the ones held.
                if let Some(signed) = dir.policy.clone() {
                    let trust = match &keys {
                        Some(keys) => {
                            let mut trust = (*node.trust()).clone();
                            trust.offer_keys(keys);
                            Arc::new(trust)
                        }
                        None => node.trust(),
                    };
                    node.policy
                        .offer(signed, trust, crate::policy::DIRECTORY)
                        .await;
                }
                Ok::<_, FetchError>((dir, keys))
            };
            let r = match limit {
                None => fetch.await,
                Some(limit) => tokio::time::timeout(limit, fetch)
                    .await
                    .unwrap_or(Err(FetchError::TooSlow(limit))),
            };
            Op::Directory(Box::new(r))
        }));
    }

    pub(super) fn on_directory(
        &mut self,
        result: Result<(GetDirectoryResponse, Option<KeySet>), FetchError>,
    ) {
        let settles = self.choice.revocation_check.is_some();
        self.choice.revocation_settled(self.directory.started_at());
        match result {
            Ok((dir, keys)) => {
                self.node.metrics.cp("directory", true);
                let taken = keys.as_ref().is_some_and(|k| self.node.set_keys(k));
                if keys.is_some() {
                    self.directory.keys_were_read(Instant::now());
                }
                // The control plane's signed list, verified with the keys
                // just installed; taken only if newer than the one held.
                if let Some(list) = dir.revocations.as_ref() {
                    self.node.policy.offer_revocations(
                        &self.node.trust,
                        list,
                        agentmesh_proto::unix_now(),
                        crate::policy::DIRECTORY,
                    );
                }
                let routers = dir
                    .routers
                    .iter()
                    .filter_map(Candidate::from_info)
                    .collect();
                self.directory.fetched(routers, Instant::now());
                let known = self.directory.known();
                self.choice.forget_unknown(&known);
                // Routers that left (go-away, DRAINING) and are back: up
                // and not draining in this directory, fetched after they
                // were shunned.
                let lifted = self
                    .choice
                    .lift_returned(self.directory.candidates(), self.directory.started_at());
                if !lifted.is_empty() {
                    tracing::info!(routers = ?lifted, "routers that had left are back in the directory: trying them again");
                    self.node
                        .metrics
                        .routers
                        .shuns_lifted
                        .inc_by(lifted.len() as u64);
                }
                if let Some(keys) = keys.filter(|k| taken && self.directory.keys_to_store(k)) {
                    let dir_path = self.node.config.data_dir.clone();
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = crate::identity::store_keys(&dir_path, &keys) {
                            tracing::warn!(error = %e, "could not store the key set");
                        }
                    });
                }
                self.top_up();
                self.publish_status();
            }
            Err(e) => {
                self.node.metrics.cp("directory", false);
                let wait = self.directory.failed(Instant::now());
                tracing::warn!(error = %e, retry_in = ?wait, "directory fetch failed");
                if settles {
                    // Not settled by the control plane: the other routers
                    // judge our credential themselves.
                    self.top_up();
                }
            }
        }
        if self.choice.revocation_check.is_some() {
            // That fetch began before the router's refusal: one more.
            self.start_directory();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand() -> Candidate {
        Candidate {
            peer: PeerId::random(),
            addrs: vec!["/ip4/127.0.0.1/tcp/1".parse().expect("addr")],
            labels: Default::default(),
            load: 0.0,
            draining: false,
            lease_expires_at_unix_secs: 0,
        }
    }

    #[test]
    fn fetched_every_interval_within_twenty_percent_and_failures_keep_the_cache() {
        let now = Instant::now();
        let interval = Duration::from_secs(60);
        let mut d = Directory::new(interval, now);
        assert!(d.due(now) && !d.have());
        d.started(now);
        assert!(!d.due(now), "one fetch at a time");
        let a = cand();
        let wait = d.fetched(vec![a.clone()], now);
        assert!(d.have());
        assert!(
            wait >= interval.mul_f64(0.8) && wait <= interval.mul_f64(1.2),
            "{wait:?}"
        );
        assert!(!d.due(now + wait - Duration::from_millis(1)) && d.due(now + wait));
        assert_eq!(d.addrs().get(&a.peer), Some(&a.addrs));
        // Failures back off from 2 s up to the interval (here below
        // RETRY_MAX), and keep what was fetched.
        for n in 1..=10u32 {
            d.started(now);
            let w = d.failed(now);
            let base = RETRY_MIN.saturating_mul(1 << n).min(interval);
            assert!(w >= base && w <= base.mul_f64(1.5), "{n}: {w:?}");
        }
        assert_eq!(d.candidates().len(), 1);
        assert!(d.have());
        // A success resets the backoff.
        d.fetched(vec![a], now);
        assert!(d.failed(now) <= RETRY_MIN.saturating_mul(2).mul_f64(1.5));
    }

    #[test]
    fn with_no_router_held_the_directory_is_fetched_again_within_seconds_then_less_often() {
        let start = Instant::now();
        let interval = Duration::from_secs(300);
        let mut d = Directory::new(interval, start);
        d.started(start);
        d.fetched(vec![cand()], start);
        // Attached: the interval alone decides.
        assert!(!d.set_hurry(None, start));
        assert!(!d.due(start + Duration::from_secs(200)));
        // Every router left: the next fetch comes after 1-2 s, not 240-360 s.
        let t0 = start + Duration::from_secs(10);
        assert!(d.set_hurry(Some(Hurry::NoRouter), t0), "a hurry begins");
        assert!(!d.due(t0 + HURRY_MIN - Duration::from_millis(1)));
        assert!(d.due(t0 + HURRY_MIN * 2));
        // Still none held after each fetch: pauses double from 1-2 s to
        // 4-8 s for the first minute, so a router back is seen within 8 s;
        // then up to 30-60 s.
        let mut now = t0 + HURRY_MIN * 2;
        let mut fast = 0;
        for n in 1..=20u32 {
            assert_eq!(d.hurry(), Some(Hurry::NoRouter));
            assert!(d.due(now), "{n}");
            d.started(now);
            assert!(!d.due(now), "one fetch at a time");
            d.fetched(vec![cand()], now);
            assert!(!d.set_hurry(Some(Hurry::NoRouter), now), "same hurry");
            let cap = if now - t0 < HURRY_FAST_FOR {
                fast += 1;
                HURRY_FAST_MAX
            } else {
                HURRY_MAX
            };
            let base = HURRY_MIN.saturating_mul(1 << n).min(cap);
            let due_at = (1..=200u64)
                .map(|ms| now + Duration::from_millis(ms * 500))
                .find(|t| d.due(*t))
                .expect("due within 100 s");
            let waited = due_at - now;
            assert!(
                waited >= base && waited <= base * 2 + Duration::from_millis(500),
                "{n}: {waited:?} vs {base:?}"
            );
            now = due_at;
        }
        assert!(fast >= 7, "{fast} fetches in the first minute");
        assert!(now - t0 > Duration::from_secs(300), "slower after a minute");
        // A failed fetch in a hurry is retried no later than the hurry's
        // pause (the failure backoff may come sooner).
        d.started(now);
        d.failed(now);
        assert!(d.due(now + HURRY_MAX * 2));
        // One router back (of K = 2), none free: the doubling goes on
        // (up to the interval now), it does not start over.
        assert!(!d.set_hurry(Some(Hurry::ShortOfK), now));
        d.started(now);
        d.fetched(vec![cand()], now);
        assert!(!d.due(now + HURRY_MAX), "past 30 s now");
        // The last router lost again: soon once more.
        assert!(d.set_hurry(Some(Hurry::NoRouter), now));
        assert!(d.due(now + HURRY_MIN * 2));
        // K held: the hurry's fetch is forgotten, the interval decides.
        assert!(!d.set_hurry(None, now));
        assert_eq!(d.hurry(), None);
        assert!(!d.due(now + HURRY_MIN * 2));
    }

    #[test]
    fn short_of_k_the_pauses_double_up_to_the_interval() {
        let now = Instant::now();
        let interval = Duration::from_secs(300);
        let mut d = Directory::new(interval, now);
        d.started(now);
        d.fetched(vec![cand()], now);
        assert!(d.set_hurry(Some(Hurry::ShortOfK), now));
        let mut t = now;
        for n in 1..=12u32 {
            let due_at = (1..=1300u64)
                .map(|ms| t + Duration::from_millis(ms * 500))
                .find(|x| d.due(*x))
                .expect("due within the interval");
            t = due_at;
            d.started(t);
            d.fetched(vec![cand()], t);
            let _ = n;
        }
        // Twelve fetches took far more than a minute: no fast phase.
        assert!(t - now > Duration::from_secs(600), "{:?}", t - now);
    }

    #[test]
    fn a_fleet_orphaned_at_once_spreads_its_first_fetches_over_a_second() {
        let now = Instant::now();
        let mut buckets = [0usize; 10];
        for _ in 0..2000 {
            let p = hurry_pause(0, HURRY_MAX);
            assert!(p >= HURRY_MIN && p <= HURRY_MIN * 2, "{p:?}");
            let i = ((p - HURRY_MIN).as_secs_f64() * 10.0) as usize;
            buckets[i.min(9)] += 1;
        }
        assert!(buckets.iter().all(|b| *b > 100 && *b < 300), "{buckets:?}");
        // The cap holds whatever the count.
        assert!(hurry_pause(40, HURRY_MAX) <= HURRY_MAX * 2);
        let _ = now;
    }

    #[test]
    fn a_long_interval_does_not_stretch_the_retries_of_a_failed_fetch() {
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(3_600), now);
        for _ in 0..20 {
            d.started(now);
            let w = d.failed(now);
            assert!(w <= RETRY_MAX.mul_f64(1.5), "{w:?}");
        }
    }

    #[test]
    fn the_key_set_is_stored_only_when_it_changed() {
        use agentmesh_proto::pb::credential::PublicKey;
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(60), now);
        let one = KeySet {
            keys: vec![PublicKey {
                key_id: "k1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(d.keys_to_store(&one), "first fetch: stored");
        assert!(!d.keys_to_store(&one.clone()), "same bytes: not again");
        let mut two = one.clone();
        two.keys.push(PublicKey {
            key_id: "k2".into(),
            ..Default::default()
        });
        assert!(d.keys_to_store(&two), "a rotation: stored");
        assert!(!d.keys_to_store(&two));
        assert!(d.keys_to_store(&one), "a key past its grace: stored");
    }

    #[test]
    fn alternatives_add_unknown_routers_and_the_directory_wins() {
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(60), now);
        let (a, b) = (cand(), cand());
        d.fetched(vec![a.clone()], now);
        let mut a_elsewhere = a.clone();
        a_elsewhere.addrs = vec!["/ip4/10.0.0.1/tcp/9".parse().expect("addr")];
        assert_eq!(d.merge(vec![a_elsewhere, b.clone()]), 1);
        assert_eq!(d.addrs().get(&a.peer), Some(&a.addrs));
        assert_eq!(d.addrs().get(&b.peer), Some(&b.addrs));
        assert_eq!(d.known(), [a.peer, b.peer].into());
        // The next fetch replaces them all.
        d.fetched(vec![a.clone()], now);
        assert_eq!(d.known(), [a.peer].into());
    }
}
