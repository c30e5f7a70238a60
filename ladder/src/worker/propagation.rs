//! The worker's side of the propagation events (see `crate::propagation`):
//! which token a member enrolls with, when each member's policy changed,
//! since when a member holds no router, and calls held open across an
//! event. All instants are Unix ms, the clock the coordinator shares.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::state::{Shared, Slot};
use super::trace::HeldCall;
use crate::member::{self, Member};
use crate::propagation::unix_ms;
use crate::wire::{Event, PropagationStats, Reply, RevokedMembers};

/// Policy changes remembered per member (the latest): an event window
/// brings a push and a directory fetch or two, far fewer.
const MAX_CHANGES: usize = 16;
/// Held calls opened at once per worker.
const OPEN_PARALLELISM: usize = 128;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The token member `slot` enrolls with (the revocable one for the members
/// `--revocable-every` picks, until it was revoked); remembers which.
pub(crate) fn token_for(shared: &Shared, slot: &Slot) -> String {
    let revoked = shared.propagation.token_revoked.load(Ordering::SeqCst);
    match &shared.propagation.revocable_token {
        Some(t) if !revoked && shared.cfg.propagation.revocable(slot.index, slot.provider) => {
            slot.trace.revocable.store(true, Ordering::SeqCst);
            t.clone()
        }
        _ => shared.token.clone(),
    }
}

/// Notes every change of the member's policy or revocations, until its node ends.
pub(crate) async fn follow_policy(slot: Arc<Slot>, member: Arc<Member>) {
    let mut changes = member.policy_changes();
    loop {
        let Some(version) = member.policy_version().await else {
            return;
        };
        {
            let mut c = lock(&slot.trace.changes);
            if c.len() == MAX_CHANGES {
                c.pop_front();
            }
            c.push_back((unix_ms(), version));
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Feeds the routers a member holds now (every status change).
pub(crate) fn note_routers(slot: &Slot, routers: usize) {
    let mut since = lock(&slot.trace.no_router_since);
    if routers > 0 {
        *since = None;
    } else if since.is_none() {
        *since = Some(unix_ms());
    }
}

/// Opens up to `count` held calls to `service` (see `Command::LiveCalls`)
/// and replies once every attempt ended.
pub(crate) async fn open_live(
    shared: Arc<Shared>,
    id: u64,
    service: String,
    count: u64,
    revocable_only: bool,
) {
    let members: Vec<Arc<Member>> = shared
        .slots()
        .into_iter()
        .filter(|s| !s.provider && !s.exited.load(Ordering::SeqCst))
        .filter(|s| !revocable_only || s.trace.revocable.load(Ordering::SeqCst))
        .filter(|s| s.watch.get().is_some_and(|w| w.view().ready))
        .filter_map(|s| s.member.get().cloned())
        .take(usize::try_from(count).unwrap_or(usize::MAX))
        .collect();
    let (mut opened, mut failed) = (0u64, 0u64);
    let mut set = JoinSet::new();
    let service: Arc<str> = service.into();
    for m in members {
        while set.len() >= OPEN_PARALLELISM {
            tally(set.join_next().await, &mut opened, &mut failed);
        }
        let (shared, service) = (shared.clone(), service.clone());
        set.spawn(async move { hold(shared, m, &service).await });
    }
    while let Some(r) = set.join_next().await {
        tally(Some(r), &mut opened, &mut failed);
    }
    shared
        .emit(Event::Reply {
            id,
            body: Reply::LiveCalls { opened, failed },
        })
        .await;
}

fn tally(r: Option<Result<bool, tokio::task::JoinError>>, opened: &mut u64, failed: &mut u64) {
    match r {
        Some(Ok(true)) => *opened += 1,
        Some(_) => *failed += 1,
        None => {}
    }
}

/// Opens one call; once open, holds it in a task of its own until it ends
/// or the next report stops it. Returns whether it opened.
async fn hold(shared: Arc<Shared>, member: Arc<Member>, service: &str) -> bool {
    let stream = match member.open_call(service).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, service, "held call not opened");
            return false;
        }
    };
    let call = Arc::new(HeldCall::default());
    lock(&shared.propagation.calls).push(call.clone());
    let mut stop = shared.propagation.stop.subscribe();
    let echo = member.deadlines().echo;
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.changed().await;
        };
        if let Some(why) = member::hold_open(stream, stopped, echo).await {
            *lock(&call.ended) = Some((unix_ms(), why));
        }
    });
    true
}

/// Sums up a propagation event (see `Command::PropagationReport`) and ends the held calls.
pub(crate) fn report(
    shared: &Shared,
    since: u64,
    min_version: Option<u64>,
    revoked: RevokedMembers,
) -> PropagationStats {
    let mut st = PropagationStats::default();
    if revoked == RevokedMembers::ThisEvent {
        shared
            .propagation
            .token_revoked
            .store(true, Ordering::SeqCst);
    }
    for s in shared.slots() {
        if s.member.get().is_none() {
            continue;
        }
        let exited = s.exited.load(Ordering::SeqCst);
        let revocable = s.trace.revocable.load(Ordering::SeqCst);
        match (revocable, revoked) {
            (true, RevokedMembers::ThisEvent) => {
                // A revoked member whose node ended after the event counts
                // (its end is when it lost its last router); one that had
                // ended before it does not.
                let none_since = *lock(&s.trace.no_router_since);
                if exited && none_since.is_none_or(|at| at < since) {
                    continue;
                }
                st.revoked_members += 1;
                match none_since {
                    Some(at) => st.dropped_ms.push(at.saturating_sub(since)),
                    None => st.not_dropped += 1,
                }
                continue;
            }
            _ if exited => continue,
            (true, RevokedMembers::Earlier) => continue,
            _ => {}
        }
        st.members += 1;
        let took = lock(&s.trace.changes)
            .iter()
            .find(|(at, v)| *at >= since && min_version.is_none_or(|m| *v >= m))
            .map(|(at, _)| at - since);
        match took {
            Some(ms) => st.took_ms.push(ms),
            None => st.not_taken += 1,
        }
    }
    let calls = std::mem::take(&mut *lock(&shared.propagation.calls));
    st.live_calls = calls.len() as u64;
    for c in calls {
        match lock(&c.ended).clone() {
            Some((at, _)) if at < since => st.ended_before += 1,
            Some((at, why)) => {
                st.closed_ms.push(at - since);
                *st.close_reasons.entry(why).or_insert(0) += 1;
            }
            None => st.still_open += 1,
        }
    }
    shared.propagation.stop.send_modify(|g| *g += 1);
    st
}
