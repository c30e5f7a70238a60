//! Draining (SIGTERM, `POST /drain`, [`crate::RouterHandle::drain`]): mark
//! the router draining (readiness turns false, new members get go-away
//! DRAINING instead of admission), send a last lease saying so, send
//! go-away DRAINING to every attached member in paced waves (see
//! [`crate::goaway::pace`]: the surviving routers get members at a rate
//! they can admit, and every member is told a settling time before the
//! grace ends; a member waiting for its wave keeps being served here), wait
//! up to `--drain-grace-secs` for them to move (make-before-break on their
//! side; the wait ends early once none is left and no circuit runs through
//! the router), then close every connection and stop the router.
//!
//! A call streaming over a circuit through this router is never cut by a
//! member: after its go-away a member opens no new call or circuit through
//! here, and once it has let go of this router it keeps its connection
//! while a circuit through it carries a call (`node/src/engine/linger.rs`),
//! so "no member left" also means "no call of theirs left here". The grace
//! is the one deadline of those calls: what still runs when it ends is cut
//! by the close below (see docs/architecture.md, "Draining without cutting
//! a call").

use std::sync::Arc;
use std::time::Duration;

use agentmesh_streams::Control;
use libp2p::PeerId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::admission::{AdmissionTable, Admissions, Purpose};
use crate::config::DrainConfig;
use crate::cp::Cp;
use crate::goaway::pace::{self, Pacer};
use crate::goaway::{GoAways, Reason};
use crate::metrics::Metrics;
use crate::readiness::ReadinessState;
use crate::swarm::Commands;

/// How often the grace wait checks whether members are left.
const POLL: Duration = Duration::from_millis(200);

/// Drain requested / finished, as watch channels.
#[derive(Debug)]
pub(crate) struct DrainState {
    requested: watch::Sender<bool>,
    finished: watch::Sender<bool>,
}

impl Default for DrainState {
    fn default() -> Self {
        Self {
            requested: watch::channel(false).0,
            finished: watch::channel(false).0,
        }
    }
}

impl DrainState {
    /// Asks for a drain; returns whether this call started it.
    pub(crate) fn request(&self) -> bool {
        self.requested
            .send_if_modified(|v| !std::mem::replace(v, true))
    }

    /// Whether a drain was asked for.
    pub(crate) fn is_requested(&self) -> bool {
        *self.requested.borrow()
    }

    /// Whether a drain was asked for, as a watch channel.
    pub(crate) fn requested(&self) -> watch::Receiver<bool> {
        self.requested.subscribe()
    }

    /// True once the drain finished and the router closed.
    pub(crate) fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

/// Members attached here now.
fn attached(table: &AdmissionTable) -> Vec<PeerId> {
    table
        .iter()
        .filter(|(_, a)| a.purpose == Purpose::Attach)
        .map(|(p, _)| *p)
        .collect()
}

/// Members attached here now in the order their waves go: those that
/// reported the most other routers first (they lose the least while they
/// move), then by PeerId so the order is stable.
fn wave_order(table: &AdmissionTable, me: PeerId) -> Vec<PeerId> {
    let mut members: Vec<(usize, PeerId)> = table
        .iter()
        .filter(|(_, a)| a.purpose == Purpose::Attach)
        .map(|(p, a)| (a.attached_routers.iter().filter(|r| **r != me).count(), *p))
        .collect();
    members.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1.to_bytes().cmp(&b.1.to_bytes()))
    });
    members.into_iter().map(|(_, p)| p).collect()
}

/// What a drain works with.
pub(crate) struct Drain {
    pub(crate) config: DrainConfig,
    /// The deadline of one control-plane call, for the last lease.
    pub(crate) rpc_timeout: Duration,
    pub(crate) state: Arc<DrainState>,
    pub(crate) admissions: Admissions,
    /// Circuits relayed now, as the swarm loop publishes them.
    pub(crate) circuits: watch::Receiver<usize>,
    pub(crate) readiness: Arc<ReadinessState>,
    pub(crate) metrics: Metrics,
    /// For the last lease.
    pub(crate) cp: Cp,
    pub(crate) goaways: GoAways,
    pub(crate) control: Control,
    pub(crate) commands: Commands,
}

/// Waits for a drain request, then drains and cancels `cancel` (stopping the router).
pub(crate) async fn run(d: Drain, cancel: CancellationToken) {
    let mut requested = d.state.requested.subscribe();
    tokio::select! {
        _ = cancel.cancelled() => return,
        r = requested.wait_for(|v| *v) => if r.is_err() { return },
    }
    let members = wave_order(&d.admissions.read(), d.goaways.me);
    tracing::info!(members = members.len(), grace = ?d.config.grace, "draining");
    // The whole drain (lease, go-aways, moving) fits in the grace, so the
    // process ends within `drain_grace` plus the shutdown grace.
    let end = tokio::time::Instant::now() + d.config.grace;
    d.readiness.update(|r| r.draining = true);
    d.metrics.draining.set(1);

    // A last lease, so the directory shows this router draining.
    let lease_deadline = d.rpc_timeout.min(d.config.grace / 4);
    if tokio::time::timeout(lease_deadline, crate::cp::lease(&d.cp))
        .await
        .is_err()
    {
        tracing::warn!("draining lease timed out; members still get go-away");
    }

    // Paced: every member is told by the settling time before the end.
    let told_by = end - pace::settle_time(d.config.grace);
    let pacer = Pacer {
        goaways: &d.goaways,
        control: &d.control,
        admissions: &d.admissions,
        reason: Reason::Draining,
    };
    let sending = pace::send_paced(pacer, members, told_by);
    if tokio::time::timeout_at(end, sending).await.is_err() {
        tracing::warn!("drain grace over while sending go-aways");
    }

    // Members move (make-before-break on their side); circuits in flight
    // through this router finish. Whichever comes first: both done, or the
    // grace is over.
    let moving = d
        .metrics
        .goaway
        .wave_members
        .get_or_create(&[("reason", Reason::Draining.as_str()), ("state", "moving")])
        .clone();
    loop {
        let left = attached(&d.admissions.read()).len();
        moving.set(i64::try_from(left).unwrap_or(i64::MAX));
        let circuits = *d.circuits.borrow();
        if left == 0 && circuits == 0 {
            tracing::info!("every member moved and no circuit is left");
            break;
        }
        if tokio::time::Instant::now() >= end {
            tracing::info!(left, circuits, "drain grace over; closing");
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
    let everyone: Vec<PeerId> = d.admissions.read().iter().map(|(p, _)| *p).collect();
    d.commands.disconnect(everyone).await;
    cancel.cancel();
    d.state.finished.send_replace(true);
    tracing::info!("drained");
}
