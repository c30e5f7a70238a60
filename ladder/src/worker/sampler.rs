//! The worker's one-second loops: readiness sampled from every member's watch
//! (plus 1% over their Unix sockets), and echo calls during event windows.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::seq::SliceRandom;

use super::state::{Shared, SocketCheck};
use crate::wire::{Event, Tick};
use crate::{http, procstat};

/// Sampling period.
const PERIOD: Duration = Duration::from_secs(1);
/// Deadline of one Unix-socket `/readyz` read.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// Samples readiness every second until the worker ends.
pub(crate) async fn sample_forever(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        if shared.leaving.load(Ordering::SeqCst) {
            return;
        }
        let (mut alive, mut ready, mut flaps, mut flapped) = (0u64, 0u64, 0u64, 0u64);
        for slot in shared.slots() {
            if slot.exited.load(Ordering::SeqCst) {
                continue;
            }
            let Some(watch) = slot.watch.get() else {
                alive += 1;
                continue;
            };
            alive += 1;
            let view = watch.view();
            ready += u64::from(view.ready);
            if slot.ready_seen.load(Ordering::SeqCst) {
                let was = slot.last_ready.swap(view.ready, Ordering::SeqCst);
                if was && !view.ready {
                    flaps += 1;
                    if !slot.flapped_in_hold.swap(true, Ordering::SeqCst) {
                        flapped += 1;
                        shared.hold_flap(&slot, watch.held());
                    }
                    shared.emit(Event::Flap { member: slot.index }).await;
                }
            }
            if let Some(socket) = slot.member.get().and_then(|m| m.socket().cloned()) {
                let shared = shared.clone();
                let watch = watch.clone();
                tokio::spawn(async move {
                    // The watch before and after the read: a read that
                    // straddles a change agrees with one of them, and a read
                    // that got no answer in time is slow, not "not ready".
                    let before = watch.view().ready;
                    let started = tokio::time::Instant::now();
                    let answer = http::get_unix(&socket, "/readyz", SOCKET_TIMEOUT).await;
                    let took = started.elapsed();
                    let after = watch.view().ready;
                    let answer = answer.ok().map(|r| r.status == 200);
                    shared.socket_check(SocketCheck::of(answer, before, after), took);
                });
            }
        }
        shared.hold_sample(alive, ready, flaps, flapped);
        let pid = std::process::id();
        let tick = Tick {
            alive,
            ready,
            fds: procstat::open_fds(pid).unwrap_or(0) as u64,
            rss_bytes: procstat::rss_bytes(pid).unwrap_or(0),
            cpu_secs: procstat::cpu_secs(pid).unwrap_or(0.0),
        };
        shared.emit(Event::Tick(tick)).await;
    }
}

/// While the current window is active, makes `window_calls_per_sec` echo
/// calls a second from random ready members.
pub(crate) async fn window_calls(shared: Arc<Shared>) {
    let per_tick = shared.cfg.window_calls_per_sec as usize;
    let mut ticker = tokio::time::interval(PERIOD);
    loop {
        ticker.tick().await;
        let active = shared.window.lock().map(|w| w.active).unwrap_or(false);
        if !active || shared.leaving.load(Ordering::SeqCst) {
            return;
        }
        let mut callers: Vec<_> = shared
            .slots()
            .into_iter()
            .filter(|s| !s.provider && !s.exited.load(Ordering::SeqCst))
            .filter(|s| s.watch.get().is_some_and(|w| w.view().ready))
            .collect();
        callers.shuffle(&mut rand::thread_rng());
        for slot in callers.into_iter().take(per_tick) {
            let Some(member) = slot.member.get().cloned() else {
                continue;
            };
            let Some(generation) = shared.window_call_started() else {
                return;
            };
            let shared = shared.clone();
            let warm = shared.cfg.member_direct;
            tokio::spawn(async move {
                let r = member.call_echo().await;
                let first = r.as_ref().ok().cloned();
                shared.window_call(generation, r);
                // With direct connections on: a warm call after the first
                // (its relayed connection has existed
                // `--warm-call-after-secs`), counted by path when it
                // reached the same provider.
                let Some(first) = first.filter(|_| warm) else {
                    return;
                };
                let after = std::time::Duration::from_secs(shared.cfg.warm_call_after_secs);
                tokio::time::sleep(after).await;
                let Some(generation) = shared.window_call_started() else {
                    return;
                };
                let r = member.call_echo().await;
                if let Ok(route) = &r
                    && route.provider == first.provider
                {
                    shared.window_warm(generation, &first, route.direct);
                }
                shared.window_call(generation, r);
            });
        }
    }
}
