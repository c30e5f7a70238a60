//! Draining (SIGTERM, `POST /drain`, [`crate::RouterHandle::drain`]): mark
//! the router draining (readiness turns false, new members get go-away
//! DRAINING instead of admission), send a last lease saying so, send
//! go-away DRAINING to every attached member, wait up to
//! `--drain-grace-secs` for them to move (make-before-break on their side;
//! the wait ends early once none is left and no circuit runs through the
//! router), then close every connection and stop the router.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_streams::Control;
use libp2p::PeerId;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::admission::Purpose;
use crate::goaway::{Reason, overload, sender};
use crate::state::Shared;
use crate::swarm::Command;

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

    /// True once the drain finished and the router closed.
    pub(crate) fn finished(&self) -> watch::Receiver<bool> {
        self.finished.subscribe()
    }
}

/// Members attached here now.
fn attached(shared: &Shared) -> Vec<PeerId> {
    shared
        .admission
        .read()
        .iter()
        .filter(|(_, a)| a.purpose == Purpose::Attach)
        .map(|(p, _)| *p)
        .collect()
}

/// Waits for a drain request, then drains and cancels `cancel` (stopping the router).
pub(crate) async fn run(
    shared: Arc<Shared>,
    control: Control,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    let mut requested = shared.drain.requested.subscribe();
    tokio::select! {
        _ = cancel.cancelled() => return,
        r = requested.wait_for(|v| *v) => if r.is_err() { return },
    }
    let members = attached(&shared);
    tracing::info!(members = members.len(), grace = ?shared.config.drain_grace, "draining");
    // The whole drain (lease, go-aways, moving) fits in the grace, so the
    // process ends within `drain_grace` plus the shutdown grace.
    let end = tokio::time::Instant::now() + shared.config.drain_grace;
    shared.update_readiness(|r| r.draining = true);
    shared.metrics.draining.set(1);

    // A last lease, so the directory shows this router draining.
    let lease_deadline = shared
        .config
        .control_plane_rpc_timeout
        .min(shared.config.drain_grace / 4);
    if tokio::time::timeout(lease_deadline, crate::cp::lease(&shared))
        .await
        .is_err()
    {
        tracing::warn!("draining lease timed out; members still get go-away");
    }

    let sending = sender::send_all(&shared, &control, members, Reason::Draining);
    if tokio::time::timeout_at(end, sending).await.is_err() {
        tracing::warn!("drain grace over while sending go-aways");
    }

    // Members move (make-before-break on their side); circuits in flight
    // through this router finish. Whichever comes first: both done, or the
    // grace is over.
    loop {
        let left = attached(&shared).len();
        let circuits = shared.metrics.circuits.get();
        if left == 0 && circuits <= 0 {
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
    let everyone: Vec<PeerId> = shared.admission.read().iter().map(|(p, _)| *p).collect();
    overload::disconnect(&commands, everyone).await;
    cancel.cancel();
    shared.drain.finished.send_replace(true);
    tracing::info!("drained");
}
