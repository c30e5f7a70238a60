//! A worker's shared state: its members and what the hold and the current
//! event window have seen of them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::WorkerConfig;
use crate::member::{CallFailure, Held, Member, View, Watch};
use crate::wire::{
    BelowKRecord, DirectWindow, Event, FlapRecord, HoldStats, MAX_FLAP_RECORDS, WindowStats,
    pick_below_k,
};

/// Everything the worker's tasks share.
pub(crate) struct Shared {
    pub(crate) cfg: WorkerConfig,
    pub(crate) token: String,
    pub(crate) echo: SocketAddr,
    pub(crate) out: mpsc::Sender<Event>,
    pub(crate) slots: Mutex<Vec<Arc<Slot>>>,
    pub(crate) window: Mutex<WindowAcc>,
    pub(crate) hold: Mutex<HoldAcc>,
    pub(crate) leaving: AtomicBool,
    /// Held calls and the revocable token (`--policy-change-at`, `--revoke-token-at`).
    pub(crate) propagation: super::trace::Live,
}

/// One member's place in the worker.
pub(crate) struct Slot {
    pub(crate) index: u64,
    pub(crate) provider: bool,
    pub(crate) member: OnceLock<Arc<Member>>,
    pub(crate) watch: OnceLock<Watch>,
    /// Became ready at least once (flaps count only after that).
    pub(crate) ready_seen: AtomicBool,
    /// Readiness at the last one-second sample.
    pub(crate) last_ready: AtomicBool,
    pub(crate) flapped_in_hold: AtomicBool,
    pub(crate) exited: AtomicBool,
    pub(crate) win: Mutex<SlotWindow>,
    /// What the member held when last seen ready (for its flap record).
    pub(crate) last_ready_held: Mutex<Held>,
    /// What the member held when last seen on K (for its below-K record).
    pub(crate) last_on_k_held: Mutex<Held>,
    /// Its below-K record in the current window, if it fell below K.
    pub(crate) below_k: Mutex<Option<BelowKRecord>>,
    /// What the propagation events read of it.
    pub(crate) trace: super::trace::SlotTrace,
}

/// One member's view of the current window.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SlotWindow {
    active: bool,
    lost_ready: bool,
    /// When it was ready again after its last loss in this window (ms
    /// into the window; none: not ready again yet).
    ready_again_ms: Option<u64>,
    below_one: bool,
    below_k: bool,
    back_ms: Option<u64>,
    /// When the current dip below K started (ms into the window).
    below_k_since: Option<u64>,
    /// Ms below K in earlier dips of this window.
    below_k_total_ms: u64,
}

/// The current event window.
#[derive(Debug, Default)]
pub(crate) struct WindowAcc {
    pub(crate) active: bool,
    pub(crate) start: Option<Instant>,
    /// The wall clock at `start`, Unix ms (see [`WindowStats::mark_unix_ms`]).
    pub(crate) start_unix_ms: u64,
    pub(crate) members: u64,
    pub(crate) calls_ok: u64,
    pub(crate) calls_failed: u64,
    pub(crate) call_errors: BTreeMap<String, u64>,
    /// Which window this is (calls report into the window they started in).
    pub(crate) generation: u64,
    /// Calls started in this window that have not ended.
    pub(crate) in_flight: u64,
    /// Of `calls_ok`, those that went direct.
    pub(crate) calls_direct: u64,
    /// Warm calls by path (see `WindowStats::warm_direct`).
    pub(crate) warm_direct: u64,
    pub(crate) warm_relayed: u64,
    /// Each live member's direct counters at the window's start, by slot
    /// index (see `WindowStats::direct_counts`).
    pub(crate) direct_before: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Warm calls by `first>warm` path (see `WindowStats::warm_paths`).
    pub(crate) warm_paths: BTreeMap<String, u64>,
    /// Relayed warm calls by provider (see `WindowStats::warm_relayed_by_provider`).
    pub(crate) warm_relayed_by_provider: BTreeMap<String, u64>,
}

/// Hold counters since `HoldStart`.
#[derive(Debug, Default)]
pub(crate) struct HoldAcc {
    pub(crate) stats: HoldStats,
    pub(crate) started: bool,
    /// When `HoldStart` arrived (flap records say seconds into the hold).
    pub(crate) start: Option<Instant>,
}

/// Distinct error texts kept per window.
const MAX_ERROR_KINDS: usize = 16;
/// Characters kept of an error text.
const MAX_ERROR_CHARS: usize = 120;

/// The direct counters of every live member of `slots`, by slot index.
fn direct_counts_of(slots: &[Arc<Slot>]) -> BTreeMap<u64, BTreeMap<String, u64>> {
    slots
        .iter()
        .filter(|s| !s.exited.load(Ordering::SeqCst))
        .filter_map(|s| Some((s.index, s.member.get()?.direct_counts()?)))
        .collect()
}

/// The window's direct counters from each member's counts at its start and
/// end: counters summed as their increase over members present at both
/// ends (a member that started or stopped in between would read as a
/// jump), `open` summed as it is at the end; zeros left out.
fn direct_increase(
    before: &BTreeMap<u64, BTreeMap<String, u64>>,
    after: &BTreeMap<u64, BTreeMap<String, u64>>,
) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for (index, counts) in after {
        let start = before.get(index);
        for (name, &n) in counts {
            let grew = if name == "open" {
                n
            } else if let Some(start) = start {
                n.saturating_sub(start.get(name).copied().unwrap_or(0))
            } else {
                continue;
            };
            *sum.entry(name.clone()).or_insert(0) += grew;
        }
    }
    sum.retain(|_, n| *n > 0);
    sum
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// A snapshot of the slots.
    pub(crate) fn slots(&self) -> Vec<Arc<Slot>> {
        lock(&self.slots).clone()
    }

    /// Adds a slot.
    pub(crate) fn add(&self, slot: Arc<Slot>) {
        lock(&self.slots).push(slot);
    }

    /// Sends an event to the coordinator (waits if the pipe is full).
    pub(crate) async fn emit(&self, ev: Event) {
        let _ = self.out.send(ev).await;
    }

    /// Records a member's exit.
    pub(crate) async fn exit(&self, slot: &Slot, reason: String) {
        if slot.exited.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let mut h = lock(&self.hold);
            if h.started {
                h.stats.exits += 1;
            }
        }
        self.emit(Event::Exit {
            member: slot.index,
            reason,
        })
        .await;
    }

    /// Starts a window: every live member's window state is reset to its current view.
    pub(crate) fn mark(&self) {
        let now = Instant::now();
        let k = self.cfg.member_routers;
        let slots = self.slots();
        let mut members = 0;
        let mut below = Vec::new();
        for s in &slots {
            *lock(&s.below_k) = None;
            let mut w = lock(&s.win);
            *w = SlotWindow::default();
            if s.exited.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(watch) = s.watch.get() {
                members += 1;
                w.active = true;
                let view = watch.view();
                w.apply(view, k, 0);
                if view.routers < k {
                    below.push((s.clone(), view.routers, watch.held()));
                }
            }
        }
        let direct_before = direct_counts_of(&slots);
        {
            let mut acc = lock(&self.window);
            *acc = WindowAcc {
                active: true,
                start: Some(now),
                start_unix_ms: crate::propagation::unix_ms(),
                members,
                generation: acc.generation + 1,
                direct_before,
                ..WindowAcc::default()
            };
        }
        for (s, routers, held) in below {
            self.track_below_k(&s, routers, held, 0);
        }
    }

    /// Keeps `slot`'s below-K record up to date with a view showing
    /// `routers` reserved and `held` (see [`BelowKRecord`]); at most one
    /// record per member and window (the report picks which to show). Takes
    /// the window lock and the slot's locks one at a time.
    fn track_below_k(&self, slot: &Slot, routers: usize, held: Held, ms: u64) {
        let k = self.cfg.member_routers;
        if routers >= k {
            if let Some(r) = lock(&slot.below_k).as_mut()
                && r.back_ms.is_none()
            {
                r.back_ms = Some(ms);
            }
            *lock(&slot.last_on_k_held) = held;
            return;
        }
        {
            let mut rec = lock(&slot.below_k);
            if let Some(r) = rec.as_mut() {
                // Below K again (or still): what keeps it there now.
                r.back_ms = None;
                if held.last_router_error.is_some() {
                    r.last_router_error = held.last_router_error;
                }
                return;
            }
        }
        {
            if !lock(&self.window).active {
                return;
            }
        }
        let before = lock(&slot.last_on_k_held).reserved.clone();
        *lock(&slot.below_k) = Some(BelowKRecord {
            member: slot.index,
            peer_id: slot.peer_id(),
            at_ms: ms,
            back_ms: None,
            routers_before: before,
            routers_after: held.reserved,
            last_router_error: held.last_router_error,
        });
    }

    /// Feeds a member's new view (and what it holds) into the window.
    pub(crate) fn observe(&self, slot: &Slot, view: View, held: Held) {
        let start = match lock(&self.window).start {
            Some(s) => s,
            None => {
                if view.routers >= self.cfg.member_routers {
                    *lock(&slot.last_on_k_held) = held;
                }
                return;
            }
        };
        let ms = start.elapsed().as_millis() as u64;
        lock(&slot.win).apply(view, self.cfg.member_routers, ms);
        self.track_below_k(slot, view.routers, held, ms);
    }

    /// Counts a window call as started; `None` when no window is active.
    /// The returned generation goes back with its result.
    pub(crate) fn window_call_started(&self) -> Option<u64> {
        let mut acc = lock(&self.window);
        if !acc.active {
            return None;
        }
        acc.in_flight += 1;
        Some(acc.generation)
    }

    /// Records one window call's result (ignored once its window has ended).
    pub(crate) fn window_call(
        &self,
        generation: u64,
        result: Result<crate::member::EchoRoute, CallFailure>,
    ) {
        let mut acc = lock(&self.window);
        if !acc.active || acc.generation != generation {
            return;
        }
        acc.in_flight = acc.in_flight.saturating_sub(1);
        match result {
            Ok(route) => {
                acc.calls_ok += 1;
                acc.calls_direct += u64::from(route.direct);
            }
            Err(e) => {
                acc.calls_failed += 1;
                let key: String = e.to_string().chars().take(MAX_ERROR_CHARS).collect();
                if acc.call_errors.len() < MAX_ERROR_KINDS || acc.call_errors.contains_key(&key) {
                    *acc.call_errors.entry(key).or_insert(0) += 1;
                }
            }
        }
    }

    /// A warm call of `generation`'s window took the direct path or not;
    /// `first`: how the caller's first call went.
    pub(crate) fn window_warm(
        &self,
        generation: u64,
        first: &crate::member::EchoRoute,
        direct: bool,
    ) {
        let mut acc = lock(&self.window);
        if !acc.active || acc.generation != generation {
            return;
        }
        if direct {
            acc.warm_direct += 1;
        } else {
            acc.warm_relayed += 1;
        }
        let path = |d: bool| if d { "direct" } else { "relayed" };
        *acc.warm_paths
            .entry(format!("{}>{}", path(first.direct), path(direct)))
            .or_insert(0) += 1;
        if !direct {
            // The PeerId's tail names the provider in a line of the report.
            let tail = first.provider.len().saturating_sub(6);
            *acc.warm_relayed_by_provider
                .entry(first.provider[tail..].to_string())
                .or_insert(0) += 1;
        }
    }

    /// Ends the window and sums it up.
    pub(crate) fn window_report(&self) -> WindowStats {
        let direct_after = direct_counts_of(&self.slots());
        let (mut stats, now_ms) = {
            let mut acc = lock(&self.window);
            acc.active = false;
            let direct_counts = direct_increase(&acc.direct_before, &direct_after);
            let now_ms = acc
                .start
                .take()
                .map_or(0, |s| s.elapsed().as_millis() as u64);
            let stats = WindowStats {
                members: acc.members,
                calls_ok: acc.calls_ok,
                calls_failed: acc.calls_failed,
                call_errors: std::mem::take(&mut acc.call_errors),
                calls_unfinished: acc.in_flight,
                calls_direct: acc.calls_direct,
                warm_direct: acc.warm_direct,
                warm_relayed: acc.warm_relayed,
                direct: DirectWindow {
                    counts: direct_counts,
                    warm_paths: std::mem::take(&mut acc.warm_paths),
                    warm_relayed_by_provider: std::mem::take(&mut acc.warm_relayed_by_provider),
                },
                mark_unix_ms: acc.start_unix_ms,
                ..WindowStats::default()
            };
            (stats, now_ms)
        };
        for s in self.slots() {
            let rec = lock(&s.below_k).take();
            let mut w = lock(&s.win);
            if !w.active {
                continue;
            }
            w.active = false;
            stats.below_k_records.extend(rec);
            if w.lost_ready {
                stats.lost_ready += 1;
                match w.ready_again_ms {
                    Some(ms) => stats.ready_again_ms.push(ms),
                    None => stats.not_ready_again += 1,
                }
            }
            stats.below_one_router += u64::from(w.below_one);
            if w.below_k {
                stats.below_k_routers += 1;
                stats.below_k_ms.push(w.below_k_ms(now_ms));
                match w.back_ms {
                    Some(ms) => stats.back_on_k_ms.push(ms),
                    None => stats.not_back_on_k += 1,
                }
            }
        }
        stats.below_k_records = pick_below_k(std::mem::take(&mut stats.below_k_records));
        stats
    }

    /// Resets the hold counters.
    pub(crate) fn hold_start(&self) {
        for s in self.slots() {
            s.flapped_in_hold.store(false, Ordering::SeqCst);
        }
        let mut h = lock(&self.hold);
        *h = HoldAcc {
            started: true,
            start: Some(Instant::now()),
            stats: HoldStats {
                fewest_ready: u64::MAX,
                ..HoldStats::default()
            },
        };
    }

    /// The hold counters so far.
    pub(crate) fn hold_report(&self) -> HoldStats {
        let mut s = lock(&self.hold).stats.clone();
        if s.fewest_ready == u64::MAX {
            s.fewest_ready = 0;
        }
        s
    }

    /// Records one one-second sample.
    pub(crate) fn hold_sample(&self, alive: u64, ready: u64, flaps: u64, members_flapped: u64) {
        let mut h = lock(&self.hold);
        if !h.started {
            return;
        }
        h.stats.samples += 1;
        h.stats.alive = alive;
        h.stats.fewest_ready = h.stats.fewest_ready.min(ready);
        h.stats.flaps += flaps;
        h.stats.members_flapped += members_flapped;
    }

    /// Records the first readiness loss of `slot` in the hold (at most
    /// [`MAX_FLAP_RECORDS`]): what it held when last ready, what it holds
    /// now (`now`) and the node's last router error.
    pub(crate) fn hold_flap(&self, slot: &Slot, now: Held) {
        let before = lock(&slot.last_ready_held).clone();
        let mut h = lock(&self.hold);
        let Some(start) = h.start.filter(|_| h.started) else {
            return;
        };
        if h.stats.flap_records.len() >= MAX_FLAP_RECORDS {
            return;
        }
        h.stats.flap_records.push(FlapRecord {
            member: slot.index,
            peer_id: slot.peer_id(),
            at_secs: start.elapsed().as_secs_f64(),
            routers_before: before.reserved,
            leaving_before: before.leaving,
            routers_after: now.reserved,
            last_router_error: now.last_router_error,
        });
    }

    /// Records one Unix-socket `/readyz` check that took `took`.
    pub(crate) fn socket_check(&self, check: SocketCheck, took: std::time::Duration) {
        let mut h = lock(&self.hold);
        if !h.started {
            return;
        }
        let st = &mut h.stats;
        st.socket_checks += 1;
        st.socket_read_max_ms = st
            .socket_read_max_ms
            .max(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
        match check {
            SocketCheck::Agreed => {}
            SocketCheck::Changed => st.socket_changed += 1,
            SocketCheck::Disagreed => st.socket_mismatches += 1,
            SocketCheck::Unanswered => st.socket_unanswered += 1,
        }
    }
}

/// What one Unix-socket `/readyz` read found, against the in-process
/// watch read just before and just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketCheck {
    /// Answered with what the watch said before and after.
    Agreed,
    /// The watch changed during the read; the answer is one of its values.
    Changed,
    /// Answered with a readiness the watch had neither before nor after.
    Disagreed,
    /// No answer (failed, or none within the read's deadline).
    Unanswered,
}

impl SocketCheck {
    /// Classifies an answer (`None`: no answer; `Some(ready)`: 200 or not)
    /// against the watch before and after the read.
    pub(crate) fn of(answer: Option<bool>, before: bool, after: bool) -> Self {
        match answer {
            None => Self::Unanswered,
            Some(a) if a == before && a == after => Self::Agreed,
            Some(a) if a == before || a == after => Self::Changed,
            Some(_) => Self::Disagreed,
        }
    }
}

impl SlotWindow {
    fn apply(&mut self, v: View, k: usize, ms: u64) {
        if !self.active {
            return;
        }
        if !v.ready {
            self.lost_ready = true;
            self.ready_again_ms = None;
        } else if self.lost_ready && self.ready_again_ms.is_none() {
            self.ready_again_ms = Some(ms);
        }
        if v.routers == 0 {
            self.below_one = true;
        }
        if v.routers < k {
            self.below_k = true;
            self.back_ms = None;
            self.below_k_since.get_or_insert(ms);
        } else {
            if self.below_k && self.back_ms.is_none() {
                self.back_ms = Some(ms);
            }
            if let Some(since) = self.below_k_since.take() {
                self.below_k_total_ms += ms.saturating_sub(since);
            }
        }
    }

    /// Ms below K in this window as of `now_ms` (an open dip counts to now).
    fn below_k_ms(&self, now_ms: u64) -> u64 {
        self.below_k_total_ms
            + self
                .below_k_since
                .map_or(0, |since| now_ms.saturating_sub(since))
    }
}

impl Slot {
    /// The member's PeerId, empty before it started.
    fn peer_id(&self) -> String {
        self.member
            .get()
            .map(|m| m.peer_id().to_string())
            .unwrap_or_default()
    }

    /// A new, not yet started member slot.
    pub(crate) fn new(index: u64, provider: bool) -> Self {
        Self {
            index,
            provider,
            member: OnceLock::new(),
            watch: OnceLock::new(),
            ready_seen: AtomicBool::new(false),
            last_ready: AtomicBool::new(false),
            flapped_in_hold: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            win: Mutex::new(SlotWindow::default()),
            last_ready_held: Mutex::new(Held::default()),
            last_on_k_held: Mutex::new(Held::default()),
            below_k: Mutex::new(None),
            trace: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use std::time::Duration;

    #[test]
    fn a_slow_read_is_unanswered_and_a_read_across_a_change_agrees() {
        use SocketCheck::*;
        assert_eq!(SocketCheck::of(Some(true), true, true), Agreed);
        assert_eq!(SocketCheck::of(Some(false), false, false), Agreed);
        // Became ready (or not) while the read was under way.
        assert_eq!(SocketCheck::of(Some(false), false, true), Changed);
        assert_eq!(SocketCheck::of(Some(false), true, false), Changed);
        // The socket said something the watch never said meanwhile.
        assert_eq!(SocketCheck::of(Some(false), true, true), Disagreed);
        assert_eq!(SocketCheck::of(Some(true), false, false), Disagreed);
        // No answer is no "not ready", whatever the watch said.
        assert_eq!(SocketCheck::of(None, true, true), Unanswered);
    }

    /// A worker's shared state with no members (window accounting only).
    fn shared() -> Shared {
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            worker: WorkerConfig,
        }
        let args = Args::try_parse_from([
            "worker",
            "--control-plane",
            "http://127.0.0.1:1",
            "--token-file",
            "token",
            "--data-dir",
            "data",
        ])
        .expect("worker flags");
        let (out, _) = mpsc::channel(1);
        Shared {
            cfg: args.worker,
            token: String::new(),
            echo: SocketAddr::from(([127, 0, 0, 1], 1)),
            out,
            slots: Mutex::new(Vec::new()),
            window: Mutex::new(WindowAcc::default()),
            hold: Mutex::new(HoldAcc::default()),
            leaving: AtomicBool::new(false),
            propagation: super::super::trace::Live::new(None),
        }
    }

    #[test]
    fn direct_counters_sum_the_increase_of_members_present_at_both_ends() {
        let counts = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
            pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let before = [
            (1, counts(&[("upgrade:direct", 5), ("open", 4)])),
            (2, counts(&[("upgrade:direct", 1), ("upgrade:failed", 2)])),
            (3, counts(&[("upgrade:direct", 7)])),
        ]
        .into();
        let after = [
            (1, counts(&[("upgrade:direct", 8), ("open", 2)])),
            // Member 2 restarted its counters: no negative increase.
            (2, counts(&[("upgrade:direct", 0), ("upgrade:failed", 3)])),
            // Member 4 joined in the window: its counts are not an increase,
            // but its open connections are open.
            (4, counts(&[("upgrade:direct", 9), ("open", 1)])),
        ]
        .into();
        assert_eq!(
            direct_increase(&before, &after),
            counts(&[("upgrade:direct", 3), ("upgrade:failed", 1), ("open", 3)])
        );
    }

    #[test]
    fn window_calls_count_by_reason_and_in_flight_ones_stay_unfinished() {
        let s = shared();
        assert_eq!(s.window_call_started(), None, "no window yet");
        s.mark();
        let g = s.window_call_started().expect("window active");
        let _slow = s.window_call_started().expect("window active");
        let _ = s.window_call_started().expect("window active");
        let route = |direct| crate::member::EchoRoute {
            provider: "p".into(),
            direct,
        };
        s.window_call(g, Ok(route(true)));
        s.window_warm(g, &route(false), true);
        s.window_warm(g, &route(true), false);
        s.window_call(
            g,
            Err(CallFailure::EchoNotReturned(Duration::from_secs(10))),
        );
        let w = s.window_report();
        assert_eq!((w.calls_ok, w.calls_failed, w.calls_unfinished), (1, 1, 1));
        assert_eq!((w.calls_direct, w.warm_direct, w.warm_relayed), (1, 1, 1));
        assert_eq!(
            w.direct.warm_paths,
            [
                ("direct>relayed".to_string(), 1),
                ("relayed>direct".to_string(), 1)
            ]
            .into()
        );
        assert_eq!(
            w.direct.warm_relayed_by_provider,
            [("p".to_string(), 1)].into()
        );
        assert_eq!(
            w.call_errors.get("echo not returned within 10s"),
            Some(&1),
            "{:?}",
            w.call_errors
        );

        // A call of the old window that ends in the next one counts in neither.
        s.mark();
        s.window_call(g, Err(CallFailure::Call("timeout")));
        let w = s.window_report();
        assert_eq!((w.calls_ok, w.calls_failed, w.calls_unfinished), (0, 0, 0));
        assert!(w.call_errors.is_empty());
    }

    #[test]
    fn window_tracks_the_way_back_to_k() {
        let mut w = SlotWindow {
            active: true,
            ..SlotWindow::default()
        };
        let v = |ready, routers| View {
            enrolled: true,
            ready,
            routers,
            stopping: false,
        };
        w.apply(v(true, 2), 2, 0);
        assert!(!w.below_k);
        w.apply(v(true, 1), 2, 10);
        w.apply(v(false, 0), 2, 20);
        w.apply(v(true, 2), 2, 1500);
        assert!(w.below_k && w.below_one && w.lost_ready);
        assert_eq!(w.back_ms, Some(1500));
        assert_eq!(w.below_k_ms(1500), 1490);
        // A second, brief dip late in the window: back on K is from the
        // event (60,005 ms), time below K adds only the 5 ms dip.
        w.apply(v(true, 1), 2, 60_000);
        assert_eq!(w.back_ms, None);
        assert_eq!(w.below_k_ms(60_002), 1492);
        w.apply(v(true, 2), 2, 60_005);
        assert_eq!(w.back_ms, Some(60_005));
        assert_eq!(w.below_k_ms(90_000), 1495);
        let mut idle = SlotWindow::default();
        idle.apply(v(false, 0), 2, 5);
        assert!(!idle.lost_ready);
    }

    #[test]
    fn window_tracks_the_way_back_to_ready() {
        let mut w = SlotWindow {
            active: true,
            ..SlotWindow::default()
        };
        let v = |ready, routers| View {
            enrolled: true,
            ready,
            routers,
            stopping: false,
        };
        w.apply(v(true, 2), 2, 0);
        assert_eq!((w.lost_ready, w.ready_again_ms), (false, None));
        w.apply(v(false, 0), 2, 30);
        w.apply(v(false, 0), 2, 900);
        assert_eq!((w.lost_ready, w.ready_again_ms), (true, None));
        w.apply(v(true, 1), 2, 4_000);
        assert_eq!(w.ready_again_ms, Some(4_000));
        // Back on K later does not move the way back to ready.
        w.apply(v(true, 2), 2, 4_500);
        assert_eq!(w.ready_again_ms, Some(4_000));
        // Lost again: ready again is from the last loss.
        w.apply(v(false, 0), 2, 9_000);
        assert_eq!(w.ready_again_ms, None);
        w.apply(v(true, 1), 2, 9_200);
        assert_eq!(w.ready_again_ms, Some(9_200));
    }

    #[test]
    fn window_report_counts_members_not_ready_again() {
        let s = shared();
        let view = |ready, routers| View {
            enrolled: true,
            ready,
            routers,
            stopping: false,
        };
        let back = Arc::new(Slot::new(1, false));
        let gone = Arc::new(Slot::new(2, false));
        s.add(back.clone());
        s.add(gone.clone());
        s.mark();
        let before = crate::propagation::unix_ms();
        for slot in [&back, &gone] {
            lock(&slot.win).active = true;
            s.observe(slot, view(false, 0), Held::default());
        }
        s.observe(&back, view(true, 1), Held::default());
        let w = s.window_report();
        assert_eq!(w.lost_ready, 2);
        assert_eq!(w.ready_again_ms.len(), 1);
        assert_eq!(w.not_ready_again, 1);
        assert!(w.mark_unix_ms > 0 && w.mark_unix_ms <= before, "{w:?}");
    }

    #[test]
    fn below_k_records_say_when_why_and_when_back() {
        let s = shared();
        let k = s.cfg.member_routers;
        let held = |routers: &[&str], error: Option<&str>| Held {
            reserved: routers.iter().map(ToString::to_string).collect(),
            leaving: Vec::new(),
            last_router_error: error.map(Into::into),
        };
        let view = |routers| View {
            enrolled: true,
            ready: true,
            routers,
            stopping: false,
        };
        let ab: Vec<&str> = ["ra", "rb", "rc"].into_iter().take(k).collect();
        let slot = Arc::new(Slot::new(3, false));
        s.add(slot.clone());
        // On K before the window: remembered as "before".
        s.observe(&slot, view(k), held(&ab, None));
        s.mark();
        lock(&slot.win).active = true;
        s.observe(&slot, view(k - 1), held(&ab[1..], Some("router ra: lost")));
        s.observe(
            &slot,
            view(k - 1),
            held(&ab[1..], Some("router rd: refused")),
        );
        s.observe(&slot, view(k), held(&ab, None));
        let w = s.window_report();
        assert_eq!(w.below_k_routers, 1);
        let r = &w.below_k_records[0];
        assert_eq!(r.member, 3);
        assert_eq!(
            r.routers_before,
            ab.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
        assert_eq!(r.routers_after.len(), k - 1);
        // What kept it below K: the last error seen while there.
        assert_eq!(r.last_router_error.as_deref(), Some("router rd: refused"));
        assert!(r.back_ms.is_some_and(|b| b >= r.at_ms));
        // The next window starts clean.
        s.mark();
        assert!(s.window_report().below_k_records.is_empty());
    }

    #[test]
    fn flap_records_say_what_was_held_and_are_bounded() {
        let s = shared();
        let slot = Slot::new(4, false);
        *lock(&slot.last_ready_held) = Held {
            reserved: vec!["ra".into(), "rb".into()],
            leaving: vec!["rb".into()],
            last_router_error: None,
        };
        let now = Held {
            reserved: Vec::new(),
            leaving: Vec::new(),
            last_router_error: Some("router ra: lost the connection".into()),
        };
        // Not in a hold yet: nothing kept.
        s.hold_flap(&slot, now.clone());
        assert!(s.hold_report().flap_records.is_empty());
        s.hold_start();
        for _ in 0..MAX_FLAP_RECORDS + 5 {
            s.hold_flap(&slot, now.clone());
        }
        let r = s.hold_report().flap_records;
        assert_eq!(r.len(), MAX_FLAP_RECORDS);
        assert_eq!(r[0].member, 4);
        assert_eq!(
            r[0].routers_before,
            vec!["ra".to_string(), "rb".to_string()]
        );
        assert_eq!(r[0].leaving_before, vec!["rb".to_string()]);
        assert!(r[0].routers_after.is_empty());
        assert_eq!(
            r[0].last_router_error.as_deref(),
            Some("router ra: lost the connection")
        );
        assert!(r[0].at_secs >= 0.0);
    }
}
