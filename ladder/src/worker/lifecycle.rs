//! One member's life in a worker: start, enroll, ready, first call, then
//! watch its state until it ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use super::state::{Shared, Slot};
use crate::config::source_ip;
use crate::member::{Member, MemberSpec, View, Watch};
use crate::wire::Event;

/// How long a member may take to enroll, then to become ready, before the ladder gives up on it.
const MEMBER_PHASE_DEADLINE: Duration = Duration::from_secs(900);
/// First retry delay of a failed first call (doubles, with jitter, up to the cap).
const CALL_RETRY_INITIAL: Duration = Duration::from_millis(250);
/// Largest retry delay of a failed first call.
const CALL_RETRY_MAX: Duration = Duration::from_secs(5);
/// One member in this many serves its Unix socket (the 1% checked over it).
pub(crate) const SOCKET_EVERY: u64 = 100;

/// The replicas member `index` dials, starting with replica `index mod N`:
/// its calls go to the first and move on only when it does not answer, so
/// the fleet spreads over the replicas as a Service would spread it (each
/// replica serves 1/N of the shared budgets).
fn spread(endpoints: &[String], index: u64) -> Vec<String> {
    let mut out = endpoints.to_vec();
    if !out.is_empty() {
        let n = out.len() as u64;
        out.rotate_left((index % n) as usize);
    }
    out
}

/// Runs member `slot` from start to end.
pub(crate) async fn run(shared: Arc<Shared>, slot: Arc<Slot>) {
    let t0 = Instant::now();
    let spec = MemberSpec {
        control_plane: shared.cfg.control_plane.clone(),
        control_plane_endpoints: spread(&shared.cfg.control_plane_endpoints, slot.index),
        control_plane_ca: shared.cfg.control_plane_ca.clone(),
        token: super::propagation::token_for(&shared, &slot),
        data_dir: shared.cfg.data_dir.join(format!("m{}", slot.index)),
        routers: shared.cfg.member_routers,
        expose_echo: slot.provider.then_some(shared.echo),
        dial_source_ip: source_ip(slot.index, shared.cfg.source_ips).map(Into::into),
        socket: slot.index.is_multiple_of(SOCKET_EVERY),
        call_timeout: Duration::from_secs(shared.cfg.call_timeout_secs.max(1)),
        ping_interval: Duration::from_secs(shared.cfg.member_ping_interval_secs.max(1)),
        rejoin_spread: Duration::from_millis(shared.cfg.member_rejoin_spread_ms),
        expose_also: shared.cfg.propagation.expose_also.clone(),
        direct: shared.cfg.member_direct,
        direct_transport: shared.cfg.member_direct_transport,
        quic_idle_timeout: Duration::from_secs(shared.cfg.member_quic_idle_timeout_secs),
    };
    let member = match Member::start(spec).await {
        Ok(m) => Arc::new(m),
        Err(e) => {
            shared.exit(&slot, format!("start: {e}")).await;
            return;
        }
    };
    let _ = slot.member.set(member.clone());
    let mut watch = member.watch();
    let _ = slot.watch.set(watch.clone());
    tokio::spawn(super::propagation::follow_policy(
        slot.clone(),
        member.clone(),
    ));

    // The node enrolls inside `spawn`: once it returns, the credential is in hand.
    let enrolled_at = Instant::now();
    shared
        .emit(Event::Enrolled {
            member: slot.index,
            ms: ms(enrolled_at - t0),
        })
        .await;

    if let Err(why) = wait_for(&mut watch, |v| v.ready).await {
        return gone(&shared, &slot, format!("before ready: {why}")).await;
    }
    let ready_at = Instant::now();
    slot.last_ready.store(true, Ordering::SeqCst);
    slot.ready_seen.store(true, Ordering::SeqCst);
    shared
        .emit(Event::Ready {
            member: slot.index,
            ms: ms(ready_at - enrolled_at),
        })
        .await;

    if !slot.provider {
        first_call(&shared, &slot, &member, ready_at).await;
    }

    // Watch until the node stops or ends.
    loop {
        let view = watch.view();
        shared.observe(&slot, view, watch.held());
        super::propagation::note_routers(&slot, view.routers);
        if view.ready {
            *slot
                .last_ready_held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = watch.held();
        }
        if view.stopping || watch.changed().await.is_err() {
            break;
        }
    }
    // Its node ended or is stopping: it holds no router from now on.
    super::propagation::note_routers(&slot, 0);
    if !shared.leaving.load(Ordering::SeqCst) {
        shared.exit(&slot, stopped_why(&watch)).await;
    }
}

/// Why a member's node stopped: its core's panic when it died of one (a
/// dead swarm would otherwise look like a member that just never changes).
fn stopped_why(watch: &Watch) -> String {
    match watch.failed() {
        Some(panic) => format!("node core panicked: {panic}"),
        None => "node stopped".to_string(),
    }
}

async fn gone(shared: &Shared, slot: &Slot, why: String) {
    if !shared.leaving.load(Ordering::SeqCst) {
        shared.exit(slot, why).await;
    }
}

async fn wait_for(watch: &mut Watch, pred: impl Fn(View) -> bool) -> Result<(), String> {
    let deadline = Instant::now() + MEMBER_PHASE_DEADLINE;
    loop {
        let view = watch.view();
        if pred(view) {
            return Ok(());
        }
        if view.stopping {
            return Err(stopped_why(watch));
        }
        match tokio::time::timeout_at(deadline, watch.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(())) => return Err("node ended".to_string()),
            Err(_) => return Err(format!("gave up after {MEMBER_PHASE_DEADLINE:?}")),
        }
    }
}

async fn first_call(shared: &Shared, slot: &Slot, member: &Member, ready_at: Instant) {
    let budget = Duration::from_secs(shared.cfg.call_budget_secs.max(1));
    let mut delay = CALL_RETRY_INITIAL;
    let mut attempts = 0u32;
    let (ok, error) = loop {
        attempts += 1;
        match member.call_echo().await {
            Ok(_) => break (true, None),
            Err(e) => {
                let jitter = rand::thread_rng().gen_range(0..=delay.as_millis() as u64 / 2);
                let wait = delay + Duration::from_millis(jitter);
                if ready_at.elapsed() + wait >= budget {
                    break (false, Some(e.to_string()));
                }
                tracing::debug!(member = slot.index, attempts, error = %e, "first call failed, retrying");
                tokio::time::sleep(wait).await;
                delay = (delay * 2).min(CALL_RETRY_MAX);
            }
        }
    };
    shared
        .emit(Event::FirstCall {
            member: slot.index,
            ok,
            ms: ms(ready_at.elapsed()),
            attempts,
            error,
        })
        .await;
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
