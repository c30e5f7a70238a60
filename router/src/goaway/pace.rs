//! Paced go-aways: members are sent away in waves sized so they re-attach
//! at a rate the surviving routers can admit, instead of all in one second.
//! The drain and the overload trim both send through [`send_paced`].
//!
//! Sending every member of a router away at once aims thousands of
//! re-attaches (noise handshake, auth, reservation, records) at the other
//! routers in the same second; on a machine short of CPU their auth answers
//! then miss the members' deadlines, members retry and the storm feeds
//! itself. The rule, every [`WAVE_EVERY`] ([`wave`], pure):
//!
//! 1. **Survivors**: the routers of the last directory a go-away names as
//!    alternatives (not draining, not this one, with addresses, below their
//!    low watermark); `n` = their count, at least 1.
//! 2. **Pace**: `rate = --drain-rate-members-per-sec × n` members a second;
//!    a wave is `rate × WAVE_EVERY`, at least 1. Rate 0 turns pacing off:
//!    one wave with everyone (the behaviour before pacing).
//! 3. **Held back**: a member told to go is *moving* until it leaves this
//!    router (it leaves once its replacement is reserved, make-before-break).
//!    While more than `rate × REATTACH_WINDOW` are moving, the survivors are
//!    admitting slower than asked, and the wave shrinks by the excess: the
//!    pace follows the admission rate actually seen.
//! 4. **Room**: moving members plus the wave never exceed the survivors'
//!    advertised room, Σ (low watermark − attached) over the survivors that
//!    reported a load (as fresh as their last lease).
//! 5. **Deadline**: every member is told by the sending deadline (the drain:
//!    `--drain-grace-secs` from the drain's start less the settling time, see
//!    [`settle_time`]; the trim: `--trim-close-grace-secs`). A wave is at
//!    least `waiting ÷ waves left`, overriding 3 and 4: the grace wins over
//!    the pace, so nobody is still waiting for its wave when the router
//!    closes.
//!
//! A member waiting for its wave is not told anything: it keeps its
//! admission, reservation and records here and keeps serving and calling
//! through this router. Members that leave on their own before their wave
//! are skipped.
//!
//! Metrics, by go-away reason (`draining` for the drain, `overloaded` for
//! the trim): `agentmesh_router_goaway_waves_total`,
//! `agentmesh_router_goaway_wave_members{state="waiting|moving"}`,
//! `agentmesh_router_goaway_wave_rate_members_per_sec` (the pace in effect),
//! `agentmesh_router_goaway_wave_reattach_members_per_sec` (members that
//! left over the last [`REATTACH_WINDOW`]) and
//! `agentmesh_router_goaway_waves_adjusted_total{why="held_back|room|deadline"}`
//! (waves the rule shrank or, for `deadline`, enlarged).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use agentmesh_streams::Control;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use libp2p::PeerId;
use tokio::time::Instant;

use super::sender::{self, Outcome};
use super::{GoAways, REASONS, Reason, is_alternative};
use crate::admission::{Admissions, Purpose};
use crate::directory::Directory;
use crate::metrics::Metrics;

/// Time between waves.
pub(crate) const WAVE_EVERY: Duration = Duration::from_millis(500);
/// Members moving at once are held to this many seconds of the pace.
pub(crate) const REATTACH_WINDOW: Duration = Duration::from_secs(5);
/// Longest time a drain keeps after its last go-away for members to move.
const SETTLE_MAX: Duration = Duration::from_secs(10);

/// Why a wave was not the plain pace (the `why` label).
pub(crate) const ADJUSTMENTS: [&str; 3] = ["held_back", "room", "deadline"];
/// States of the members a paced send works through (the `state` label).
pub(crate) const STATES: [&str; 2] = ["waiting", "moving"];

/// The part of a drain's grace kept after the last go-away for the last
/// wave to move: a third of the grace, at most [`SETTLE_MAX`].
pub(crate) fn settle_time(grace: Duration) -> Duration {
    (grace / 3).min(SETTLE_MAX)
}

/// The surviving routers as the directory shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Survivors {
    /// Routers a go-away names as alternatives.
    pub(crate) count: usize,
    /// Σ (low watermark − attached) over those that reported a load;
    /// `None` when none did (room unknown: not a bound).
    pub(crate) room: Option<u64>,
}

/// The survivors of the last directory, seen from router `me`.
pub(crate) fn survivors(directory: &Directory, me: PeerId) -> Survivors {
    let dir = directory.routers.read();
    let mut s = Survivors::default();
    for r in dir.iter().filter(|r| is_alternative(r, me)) {
        s.count += 1;
        if let Some(l) = r.load.as_ref().filter(|l| l.low_watermark > 0) {
            let room = u64::from(l.low_watermark.saturating_sub(l.attached_members));
            *s.room.get_or_insert(0) += room;
        }
    }
    s
}

/// Where a paced send stands at one wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaveInput {
    /// Members not told yet (and still attached).
    pub(crate) waiting: usize,
    /// Members told that are still attached here.
    pub(crate) moving: usize,
    pub(crate) survivors: Survivors,
    /// Time left until every member must have been told.
    pub(crate) until_deadline: Duration,
}

/// One wave as the rule sized it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Wave {
    /// Members to tell now.
    pub(crate) size: usize,
    /// The pace in effect, members per second (0: unpaced).
    pub(crate) rate: f64,
    /// Which rule changed the plain pace, if any (one of [`ADJUSTMENTS`]).
    pub(crate) adjusted: Option<&'static str>,
}

/// Sizes the next wave (see the module docs for the rule);
/// `rate_per_survivor` is `--drain-rate-members-per-sec` (0: unpaced).
pub(crate) fn wave(rate_per_survivor: u32, input: WaveInput) -> Wave {
    if input.waiting == 0 {
        return Wave {
            size: 0,
            rate: 0.0,
            adjusted: None,
        };
    }
    if rate_per_survivor == 0 {
        return Wave {
            size: input.waiting,
            rate: 0.0,
            adjusted: None,
        };
    }
    let rate = f64::from(rate_per_survivor) * input.survivors.count.max(1) as f64;
    let pace = ((rate * WAVE_EVERY.as_secs_f64()).ceil() as usize).max(1);
    let mut size = pace;
    let mut adjusted = None;
    let window = (rate * REATTACH_WINDOW.as_secs_f64()).ceil() as usize;
    if input.moving + size > window {
        size = window.saturating_sub(input.moving);
        adjusted = Some("held_back");
    }
    if let Some(room) = input.survivors.room {
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        if input.moving + size > room {
            size = room.saturating_sub(input.moving);
            adjusted = Some("room");
        }
    }
    // Waves left before the deadline, this one included.
    let waves_left =
        (input.until_deadline.as_secs_f64() / WAVE_EVERY.as_secs_f64()).floor() as usize + 1;
    let floor = input.waiting.div_ceil(waves_left);
    if size < floor {
        size = floor;
        adjusted = Some("deadline");
    }
    Wave {
        size: size.min(input.waiting),
        rate,
        adjusted,
    }
}

/// Pre-creates every series of the wave metrics.
pub(crate) fn precreate_labels(metrics: &Metrics) {
    for reason in REASONS {
        let r = reason.as_str();
        let _ = metrics.goaway.waves.get_or_create(&[("reason", r)]);
        let _ = metrics.goaway.wave_rate.get_or_create(&[("reason", r)]);
        let _ = metrics.goaway.wave_reattach.get_or_create(&[("reason", r)]);
        for s in STATES {
            let _ = metrics
                .goaway
                .wave_members
                .get_or_create(&[("reason", r), ("state", s)]);
        }
        for why in ADJUSTMENTS {
            let _ = metrics
                .goaway
                .waves_adjusted
                .get_or_create(&[("reason", r), ("why", why)]);
        }
    }
}

/// What a paced send did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Waves sent (waves of size 0 not counted).
    pub(crate) waves: u64,
    /// Members told, in the order they were.
    pub(crate) told: Vec<PeerId>,
    /// Go-aways acknowledged.
    pub(crate) acked: usize,
}

/// What a paced send works with.
pub(crate) struct Pacer<'a> {
    pub(crate) goaways: &'a GoAways,
    pub(crate) control: &'a Control,
    pub(crate) admissions: &'a Admissions,
    pub(crate) reason: Reason,
}

/// Members that left over a sliding window, for the re-attach rate.
#[derive(Debug, Default)]
struct LeftRate {
    /// (when, members told that had left by then), oldest first.
    samples: VecDeque<(Instant, usize)>,
}

impl LeftRate {
    /// Records `left` at `now`; returns members per second over the last
    /// [`REATTACH_WINDOW`] (0 until two samples exist).
    fn record(&mut self, now: Instant, left: usize) -> f64 {
        self.samples.push_back((now, left));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > REATTACH_WINDOW)
        {
            self.samples.pop_front();
        }
        match self.samples.front() {
            Some((t, first)) if *t < now => {
                left.saturating_sub(*first) as f64 / now.saturating_duration_since(*t).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// Attached members now.
fn attached(admissions: &Admissions) -> HashSet<PeerId> {
    admissions
        .read()
        .iter()
        .filter(|(_, a)| a.purpose == Purpose::Attach)
        .map(|(p, _)| *p)
        .collect()
}

/// Sends go-away `p.reason` to `peers` in the order given, in waves sized
/// by [`wave`], every member told by `deadline`; at most
/// `--goaway-max-concurrent-streams` exchanges run at once. Returns once
/// every member was told and every exchange ended. Members that are no
/// longer attached when their wave comes are skipped.
pub(crate) async fn send_paced(p: Pacer<'_>, peers: Vec<PeerId>, deadline: Instant) -> Summary {
    let config = &p.goaways.config;
    let rate_per_survivor = config.rate_members_per_sec;
    let fanout = config.goaway_max_concurrent_streams.max(1);
    let stream_deadline = p.goaways.stream_timeout;
    let m = &p.goaways.metrics;
    let r = p.reason.as_str();
    let waiting_gauge = m
        .goaway
        .wave_members
        .get_or_create(&[("reason", r), ("state", "waiting")])
        .clone();
    let moving_gauge = m
        .goaway
        .wave_members
        .get_or_create(&[("reason", r), ("state", "moving")])
        .clone();
    let rate_gauge = m.goaway.wave_rate.get_or_create(&[("reason", r)]).clone();
    let reattach_gauge = m
        .goaway
        .wave_reattach
        .get_or_create(&[("reason", r)])
        .clone();

    let mut waiting: VecDeque<PeerId> = peers.into();
    let mut told: Vec<PeerId> = Vec::new();
    let mut told_set: HashSet<PeerId> = HashSet::new();
    let mut to_send: VecDeque<PeerId> = VecDeque::new();
    let mut sending = FuturesUnordered::new();
    let mut summary = Summary::default();
    let mut left_rate = LeftRate::default();
    // One message per wave: alternatives follow the directory as it changes.
    let mut msg = p.goaways.message(p.reason);
    let mut tick = tokio::time::interval(WAVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                let here = attached(p.admissions);
                waiting.retain(|peer| here.contains(peer));
                let moving = told_set.iter().filter(|peer| here.contains(peer)).count();
                let left = told_set.len() - moving;
                reattach_gauge.set(left_rate.record(now, left) as i64);
                let w = wave(rate_per_survivor, WaveInput {
                    waiting: waiting.len(),
                    moving,
                    survivors: survivors(&p.goaways.directory, p.goaways.me),
                    until_deadline: deadline.saturating_duration_since(now),
                });
                rate_gauge.set(w.rate.round() as i64);
                if let Some(why) = w.adjusted {
                    m.goaway.waves_adjusted.get_or_create(&[("reason", r), ("why", why)]).inc();
                }
                if w.size > 0 {
                    msg = p.goaways.message(p.reason);
                    summary.waves += 1;
                    m.goaway.waves.get_or_create(&[("reason", r)]).inc();
                    tracing::debug!(reason = r, size = w.size, waiting = waiting.len(), moving, rate = w.rate, adjusted = ?w.adjusted, "go-away wave");
                    for peer in waiting.drain(..w.size) {
                        told_set.insert(peer);
                        told.push(peer);
                        to_send.push_back(peer);
                    }
                }
                waiting_gauge.set(waiting.len() as i64);
                moving_gauge.set(i64::try_from(moving + w.size).unwrap_or(i64::MAX));
            }
            Some(outcome) = sending.next(), if !sending.is_empty() => {
                let outcome: Outcome = outcome;
                p.goaways.count(p.reason, outcome.as_str());
                summary.acked += usize::from(outcome == Outcome::Acked);
            }
        }
        while sending.len() < fanout {
            let Some(peer) = to_send.pop_front() else {
                break;
            };
            let control = p.control.clone();
            let msg = msg.clone();
            sending
                .push(async move { sender::send_one(control, peer, &msg, stream_deadline).await });
        }
        if waiting.is_empty() && to_send.is_empty() && sending.is_empty() {
            break;
        }
    }
    waiting_gauge.set(0);
    tracing::info!(
        reason = r,
        waves = summary.waves,
        told = told.len(),
        acked = summary.acked,
        "paced go-aways sent"
    );
    summary.told = told;
    summary
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn input(
        waiting: usize,
        moving: usize,
        count: usize,
        room: Option<u64>,
        secs: f64,
    ) -> WaveInput {
        WaveInput {
            waiting,
            moving,
            survivors: Survivors { count, room },
            until_deadline: Duration::from_secs_f64(secs),
        }
    }

    #[test]
    fn the_pace_is_per_survivor_and_the_grace_wins() {
        // 3 survivors at 200/s: 600/s, 300 a wave.
        let w = wave(200, input(6_000, 0, 3, None, 60.0));
        assert_eq!((w.size, w.adjusted), (300, None));
        assert_eq!(w.rate, 600.0);
        // No survivor known: paced as one.
        assert_eq!(wave(200, input(6_000, 0, 0, None, 60.0)).size, 100);
        // 6,000 waiting and 5 s left: 11 waves, at least 546 each.
        let w = wave(200, input(6_000, 0, 3, None, 5.0));
        assert_eq!((w.size, w.adjusted), (546, Some("deadline")));
        // Past the deadline: everyone now.
        assert_eq!(wave(200, input(6_000, 2_000, 3, Some(0), 0.0)).size, 6_000);
        // Unpaced: one wave with everyone.
        let w = wave(0, input(6_000, 0, 3, None, 60.0));
        assert_eq!((w.size, w.adjusted), (6_000, None));
        // Nothing waiting: nothing sent.
        assert_eq!(wave(200, input(0, 10, 3, None, 60.0)).size, 0);
    }

    #[test]
    fn slow_survivors_hold_waves_back_and_room_bounds_them() {
        // An hour to go: the deadline asks for 1 a wave at most here.
        let hour = 3_600.0;
        // 600/s × 5 s = 3,000 may be moving; 2,900 are: 100 more.
        let w = wave(200, input(6_000, 2_900, 3, None, hour));
        assert_eq!((w.size, w.adjusted), (100, Some("held_back")));
        // Beyond the window: only what the deadline needs.
        let w = wave(200, input(6_000, 3_500, 3, None, hour));
        assert_eq!((w.size, w.adjusted), (1, Some("deadline")));
        // Room for 250 more members on the survivors, 100 moving: 150.
        let w = wave(200, input(6_000, 100, 3, Some(250), hour));
        assert_eq!((w.size, w.adjusted), (150, Some("room")));
        // Full survivors: only what the deadline needs (6,000 over 60 s: 50 a wave).
        assert_eq!(wave(200, input(6_000, 0, 3, Some(0), 60.0)).size, 50);
    }

    #[test]
    fn settling_keeps_a_third_of_the_grace_at_most_ten_seconds() {
        assert_eq!(
            settle_time(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            settle_time(Duration::from_secs(60)),
            Duration::from_secs(10)
        );
        assert_eq!(settle_time(Duration::from_secs(9)), Duration::from_secs(3));
    }

    #[test]
    fn the_reattach_rate_is_over_the_last_window() {
        let mut r = LeftRate::default();
        let t = Instant::now();
        assert_eq!(r.record(t, 0), 0.0);
        assert_eq!(r.record(t + Duration::from_secs(1), 100), 100.0);
        assert_eq!(r.record(t + Duration::from_secs(2), 300), 150.0);
        // The first sample ages out after the window.
        let later = t + REATTACH_WINDOW + Duration::from_secs(2);
        assert_eq!(r.record(later, 300), 0.0);
    }

    proptest! {
        /// Whatever the survivors do, members are told within the deadline:
        /// a send that waves every WAVE_EVERY tells everyone by the last
        /// wave at or before the deadline, and never more than are waiting.
        #[test]
        fn everyone_is_told_by_the_deadline(
            members in 0usize..20_000,
            rate in 0u32..500,
            count in 0usize..6,
            room in proptest::option::of(0u64..10_000),
            secs in 0u32..60,
            stuck in 0usize..5_000,
        ) {
            let deadline = Duration::from_secs(u64::from(secs));
            let mut waiting = members;
            let mut elapsed = Duration::ZERO;
            let mut moving = stuck;
            loop {
                let w = wave(rate, WaveInput {
                    waiting,
                    moving,
                    survivors: Survivors { count, room },
                    until_deadline: deadline.saturating_sub(elapsed),
                });
                prop_assert!(w.size <= waiting);
                waiting -= w.size;
                // Survivors that never admit anyone: every told member stays moving.
                moving += w.size;
                if waiting == 0 {
                    break;
                }
                elapsed += WAVE_EVERY;
                prop_assert!(elapsed <= deadline, "{waiting} still waiting past the deadline");
            }
        }

        /// Without the deadline pressing, a wave never exceeds the pace.
        #[test]
        fn a_wave_never_exceeds_the_pace_before_the_deadline(
            waiting in 1usize..20_000,
            moving in 0usize..5_000,
            rate in 1u32..500,
            count in 1usize..6,
        ) {
            let w = wave(rate, WaveInput {
                waiting,
                moving,
                survivors: Survivors { count, room: None },
                until_deadline: Duration::from_secs(3_600),
            });
            let pace = (f64::from(rate) * count as f64 * WAVE_EVERY.as_secs_f64()).ceil() as usize;
            if w.adjusted != Some("deadline") {
                prop_assert!(w.size <= pace.max(1));
            }
        }
    }
}
