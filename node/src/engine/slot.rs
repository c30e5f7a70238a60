//! One router slot: where one of the routers we hold (or are acquiring)
//! stands, from the dial to an active relay reservation, and its
//! re-presentations of a refreshed credential. Transitions are pure (they
//! take `now` and return what the engine must do next), so the slot is
//! tested without a swarm; the engine performs the dials, auths and
//! reservations they call for.
//!
//! ```text
//! Dialing ─connected─▶ Authing ─admitted─▶ Reserving ─accepted─▶ Reserved
//!    ▲                   │  ▲                 │   ▲                  │
//!    └──── Redial ◀──────┘  └── ReserveWait ◀─┴───┼──── lost ────────┘
//!       (conn failed)          (refused/lost)     └─ reset: at once ─┘
//! ```

use std::time::Duration;

use libp2p::Multiaddr;
use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::ListenerId;
use tokio::time::Instant;

use super::backoff;

/// Re-presentations that failed in a row (refused, or no answer: a
/// timeout, a refused stream) before the router is given up.
pub(crate) const MAX_REPRESENT_FAILURES: u32 = 5;

/// Pause before the first re-presentation retry; it doubles for each
/// failure in a row (jittered up to ×1.5), capped at [`REPRESENT_RETRY_MAX`].
pub(crate) const REPRESENT_RETRY_MIN: Duration = Duration::from_secs(3);

/// Longest pause between re-presentation retries.
const REPRESENT_RETRY_MAX: Duration = Duration::from_secs(30);

/// Reservations refused or lost in a row before the router is replaced by
/// another candidate (when one is free; otherwise it is retried).
pub(crate) const MAX_RESERVE_FAILURES: u32 = 2;

/// Shortest pause before asking for a reservation again (doubling per failure).
const RESERVE_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest pause before asking for a reservation again.
const RESERVE_RETRY_MAX: Duration = Duration::from_secs(30);

/// After `failures` (≥ 1) failed re-presentations in a row: the pause
/// before the next one, or `None` to give the router up. The pauses grow
/// (3, 6, 12, 24 s base), so a router slow to learn a new signing key
/// (it re-fetches keys at most every 30 s) gets time, while a router that
/// never answers is let go after [`MAX_REPRESENT_FAILURES`]: at most about
/// 68 s of pauses plus the exchanges' own timeouts.
pub(crate) fn represent_retry(failures: u32) -> Option<Duration> {
    (failures < MAX_REPRESENT_FAILURES).then(|| {
        backoff(
            failures.saturating_sub(1),
            REPRESENT_RETRY_MIN,
            REPRESENT_RETRY_MAX,
        )
    })
}

/// Where one router stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    Dialing,
    Authing,
    /// The connection failed (refused, closed) at the dial or under the
    /// first auth: a fresh connection is made after a jittered backoff
    /// (`Op::Redial`, [`super::redial`]).
    Redial,
    Reserving(ListenerId),
    Reserved(ListenerId),
    /// Admitted; the reservation is retried at the instant.
    ReserveWait(Instant),
}

impl Phase {
    /// Whether the router has admitted us (past the first auth).
    pub(crate) fn is_admitted(&self) -> bool {
        !matches!(self, Self::Dialing | Self::Authing | Self::Redial)
    }

    /// A short name for the status.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Dialing => "dialing",
            Self::Authing => "authenticating",
            Self::Redial => "reconnecting",
            Self::Reserving(_) => "reserving",
            Self::Reserved(_) => "reserved",
            Self::ReserveWait(_) => "waiting to reserve",
        }
    }
}

/// What a closed reservation listener calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// Ask again now (a silent reset of a live reservation by the client).
    ReserveNow,
    /// Wait (the slot is in [`Phase::ReserveWait`]), or replace the router
    /// if `give_up` and another is free.
    Wait { give_up: bool, failures: u32 },
}

/// One of the routers we hold or are acquiring.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) addr: Option<Multiaddr>,
    pub(crate) phase: Phase,
    pub(crate) reserve_failures: u32,
    pub(crate) published: bool,
    pub(crate) represent_failures: u32,
    pub(crate) represent_at: Option<Instant>,
    /// Sent go-away: replaced first, then released and shunned this long.
    pub(crate) leaving: Option<Duration>,
    /// When the go-away's retry-after runs out: once released, the
    /// connection stays for the calls through it until then at the latest
    /// (see [`super::linger`]).
    pub(crate) linger_until: Option<Instant>,
    /// The router said it is draining: once dropped, never tried early.
    pub(crate) draining: bool,
    /// The router's reason for refusing our records the last time it
    /// answered a publication (cleared when it accepts them).
    pub(crate) records_refused: Option<String>,
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
}

impl Slot {
    /// A router being dialed.
    pub(crate) fn new() -> Self {
        Self {
            addr: None,
            phase: Phase::Dialing,
            reserve_failures: 0,
            published: false,
            represent_failures: 0,
            represent_at: None,
            leaving: None,
            linger_until: None,
            draining: false,
            records_refused: None,
        }
    }

    /// A connection to the router came up at `addr`: true when the first
    /// auth should start (the slot was dialing, and `addr` is the router's
    /// own, not a relayed one).
    pub(crate) fn connected(&mut self, addr: Multiaddr) -> bool {
        if self.phase != Phase::Dialing || addr.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
            return false;
        }
        self.addr = Some(addr);
        self.phase = Phase::Authing;
        true
    }

    /// The router admitted us (`initial`: the first auth, else a
    /// re-presentation): true when a reservation should be asked for.
    pub(crate) fn admitted(&mut self, initial: bool) -> bool {
        self.represent_failures = 0;
        self.represent_at = None;
        initial && self.phase == Phase::Authing
    }

    /// A re-presentation failed at `now`: true when it is retried (at
    /// `represent_at`), false to give the router up.
    pub(crate) fn represent_failed(&mut self, now: Instant) -> bool {
        self.represent_failures += 1;
        match represent_retry(self.represent_failures) {
            Some(wait) => {
                self.represent_at = Some(now + wait);
                true
            }
            None => false,
        }
    }

    /// Whether a re-presentation retry is due; clears it when it is.
    pub(crate) fn take_represent(&mut self, now: Instant) -> bool {
        let due = self.represent_at.is_some_and(|at| at <= now);
        if due {
            self.represent_at = None;
        }
        due
    }

    /// A reservation was asked for on `listener`.
    pub(crate) fn reserving(&mut self, listener: ListenerId) {
        self.phase = Phase::Reserving(listener);
    }

    /// The reservation could not even be asked for: wait and ask again.
    pub(crate) fn reserve_not_asked(&mut self, now: Instant) -> Duration {
        self.reserve_failures += 1;
        self.wait_to_reserve(now)
    }

    fn wait_to_reserve(&mut self, now: Instant) -> Duration {
        let wait = backoff(self.reserve_failures, RESERVE_RETRY_MIN, RESERVE_RETRY_MAX);
        self.phase = Phase::ReserveWait(now + wait);
        wait
    }

    /// The relay accepted the reservation: true when this slot was asking.
    pub(crate) fn reserved(&mut self) -> bool {
        match self.phase {
            Phase::Reserving(l) => {
                self.phase = Phase::Reserved(l);
                self.reserve_failures = 0;
                true
            }
            _ => false,
        }
    }

    /// The reservation's listener, while one is asked for or active.
    pub(crate) fn listener(&self) -> Option<ListenerId> {
        match self.phase {
            Phase::Reserving(l) | Phase::Reserved(l) => Some(l),
            _ => None,
        }
    }

    /// Whether the reservation is active.
    pub(crate) fn is_reserved(&self) -> bool {
        matches!(self.phase, Phase::Reserved(_))
    }

    /// Whether the slot serves as one of K: not leaving, reserved, and
    /// holding our records when we expose services.
    pub(crate) fn serves(&self, exposing: bool) -> bool {
        self.leaving.is_none() && self.is_reserved() && (self.published || !exposing)
    }

    /// The reservation's listener closed at `now` (`error`: the relay's
    /// reason, if any; `connected`: the connection to the router lives).
    /// An active reservation reset silently while connected is asked for
    /// again at once, but not twice in a row; otherwise the slot waits
    /// with a growing backoff, and after [`MAX_RESERVE_FAILURES`] the
    /// router should be replaced (unless it is leaving anyway).
    pub(crate) fn reservation_lost(
        &mut self,
        error: Option<&str>,
        connected: bool,
        now: Instant,
    ) -> Lost {
        let at_once =
            error.is_none() && connected && self.is_reserved() && self.reserve_failures == 0;
        self.reserve_failures += 1;
        self.published = false;
        if at_once {
            return Lost::ReserveNow;
        }
        let give_up = self.reserve_failures >= MAX_RESERVE_FAILURES && self.leaving.is_none();
        if !give_up {
            self.wait_to_reserve(now);
        }
        Lost::Wait {
            give_up,
            failures: self.reserve_failures,
        }
    }

    /// Keeps waiting after [`Lost::Wait`] with `give_up` when no other
    /// router is free.
    pub(crate) fn keep_waiting(&mut self, now: Instant) -> Duration {
        self.wait_to_reserve(now)
    }

    /// Whether the wait before asking for a reservation again is over.
    pub(crate) fn reserve_due(&self, now: Instant) -> bool {
        matches!(self.phase, Phase::ReserveWait(at) if at <= now)
    }

    /// Re-admission before reserving again: the first auth once more.
    pub(crate) fn reauth(&mut self) {
        self.phase = Phase::Authing;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> Multiaddr {
        "/ip4/127.0.0.1/tcp/4001".parse().expect("addr")
    }

    fn listener() -> ListenerId {
        ListenerId::next()
    }

    #[test]
    fn a_slot_goes_from_dial_to_an_active_reservation() {
        let mut s = Slot::new();
        let relayed: Multiaddr = format!("{}/p2p/{}/p2p-circuit", addr(), libp2p::PeerId::random())
            .parse()
            .expect("addr");
        assert!(
            !s.connected(relayed),
            "a relayed address is never a router's own"
        );
        assert_eq!(s.phase, Phase::Dialing);
        assert!(s.connected(addr()));
        assert_eq!(s.phase, Phase::Authing);
        assert!(!s.connected(addr()), "only once");
        assert!(!s.phase.is_admitted());
        assert!(!s.admitted(false), "a re-presentation never reserves");
        assert!(s.admitted(true));
        let l = listener();
        s.reserving(l);
        assert!(s.phase.is_admitted() && !s.is_reserved());
        assert_eq!(s.listener(), Some(l));
        assert!(s.reserved());
        assert!(!s.reserved(), "only from reserving");
        assert!(s.is_reserved() && s.serves(false) && !s.serves(true));
        s.published = true;
        assert!(s.serves(true));
        s.leaving = Some(Duration::from_secs(5));
        assert!(!s.serves(true), "a leaving router does not count");
    }

    #[test]
    fn a_silent_reset_is_asked_again_at_once_only_once() {
        let now = Instant::now();
        let mut s = Slot::new();
        s.connected(addr());
        s.admitted(true);
        s.reserving(listener());
        s.reserved();
        s.published = true;
        assert_eq!(s.reservation_lost(None, true, now), Lost::ReserveNow);
        assert!(!s.published);
        s.reserving(listener());
        // Not reserved yet, and a failure already counted: back off.
        assert_eq!(
            s.reservation_lost(None, true, now),
            Lost::Wait {
                give_up: true,
                failures: 2
            }
        );
        let wait = s.keep_waiting(now);
        assert!(!s.reserve_due(now) && s.reserve_due(now + wait));
        s.reauth();
        assert_eq!(s.phase, Phase::Authing);
    }

    #[test]
    fn refusals_back_off_and_the_second_replaces_the_router() {
        let now = Instant::now();
        let mut s = Slot::new();
        s.connected(addr());
        s.admitted(true);
        s.reserving(listener());
        // A refusal (with a reason) or a lost connection never re-asks at once.
        assert_eq!(
            s.reservation_lost(Some("denied"), true, now),
            Lost::Wait {
                give_up: false,
                failures: 1
            }
        );
        let Phase::ReserveWait(at) = s.phase else {
            panic!("not waiting: {:?}", s.phase);
        };
        let wait = at - now;
        assert!(
            wait >= Duration::from_secs(2) && wait <= Duration::from_secs(3),
            "{wait:?}"
        );
        s.reserving(listener());
        s.reserved();
        assert_eq!(s.reserve_failures, 0, "an acceptance clears the count");
        assert_eq!(
            s.reservation_lost(None, false, now),
            Lost::Wait {
                give_up: false,
                failures: 1
            },
            "connection gone: back off"
        );
        s.reserving(listener());
        assert_eq!(
            s.reservation_lost(Some("denied"), true, now),
            Lost::Wait {
                give_up: true,
                failures: 2
            }
        );
        // A leaving router is never replaced for this: it goes anyway.
        s.leaving = Some(Duration::from_secs(5));
        s.reserving(listener());
        assert!(matches!(
            s.reservation_lost(Some("denied"), true, now),
            Lost::Wait { give_up: false, .. }
        ));
        assert!(s.reserve_not_asked(now) >= Duration::from_secs(1));
    }

    #[test]
    fn re_presentations_retry_with_growing_pauses_then_give_up() {
        let now = Instant::now();
        let mut s = Slot::new();
        for n in 1..MAX_REPRESENT_FAILURES {
            assert!(s.represent_failed(now), "{n}");
            let at = s.represent_at.expect("scheduled");
            assert!(!s.take_represent(at - Duration::from_millis(1)));
            assert!(s.take_represent(at));
            assert!(!s.take_represent(at), "taken once");
        }
        assert!(!s.represent_failed(now), "given up");
        s.admitted(false);
        assert_eq!(s.represent_failures, 0);
        assert_eq!(s.represent_at, None);
    }

    #[test]
    fn re_presentation_retries_grow_then_the_router_is_given_up() {
        let mut most = Duration::ZERO;
        for failures in 1..MAX_REPRESENT_FAILURES {
            let base = REPRESENT_RETRY_MIN * (1 << (failures - 1));
            for _ in 0..50 {
                let wait = represent_retry(failures).expect("retried");
                assert!(
                    wait >= base && wait <= base.mul_f64(1.5),
                    "{failures}: {wait:?}"
                );
            }
            most += base.mul_f64(1.5);
        }
        assert_eq!(represent_retry(MAX_REPRESENT_FAILURES), None);
        assert_eq!(represent_retry(MAX_REPRESENT_FAILURES + 10), None);
        // The pauses before giving up are bounded (about a minute).
        assert!(most <= Duration::from_secs(68), "{most:?}");
    }
}
