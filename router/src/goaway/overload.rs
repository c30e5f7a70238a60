//! Trimming at the high watermark: every second, if the high watermark of
//! members is reached (and the low one is below it), close unauthenticated
//! connections, send go-away OVERLOADED to the members `trim::plan` picks
//! (bounded fan-out), wait `trim_close_grace` for them to move
//! (make-before-break on their side) and close whoever is still here.
//! One trim at a time; none while draining (the drain sends everyone away).

use std::sync::Arc;
use std::time::Duration;

use agentmesh_streams::Control;
use libp2p::PeerId;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Reason, sender};
use crate::state::Shared;
use crate::swarm::Command;
use crate::trim::{self, Candidate, TrimReason};

/// How often the watermark is checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Deadline of one request to the swarm loop.
const COMMAND_DEADLINE: Duration = Duration::from_secs(5);

/// Admitted peers as trimming sees them.
pub(crate) fn candidates(shared: &Shared) -> Vec<Candidate> {
    let me = shared.peer_id;
    shared
        .admission
        .read()
        .iter()
        .map(|(peer, a)| Candidate {
            peer: *peer,
            purpose: a.purpose,
            other_routers: a.attached_routers.iter().filter(|r| **r != me).count(),
        })
        .collect()
}

/// Asks the swarm loop to drop the admissions of `peers` and close their
/// connections, within a deadline; returns how many were still admitted
/// (0 if the loop did not answer in time).
pub(crate) async fn disconnect(commands: &mpsc::Sender<Command>, peers: Vec<PeerId>) -> usize {
    if peers.is_empty() {
        return 0;
    }
    let (reply, rx) = oneshot::channel();
    let asked = tokio::time::timeout(
        COMMAND_DEADLINE,
        commands.send(Command::Disconnect { peers, reply }),
    )
    .await;
    let answered = match asked {
        Ok(Ok(())) => tokio::time::timeout(COMMAND_DEADLINE, rx).await.ok(),
        _ => None,
    };
    match answered {
        Some(Ok(n)) => n,
        _ => {
            tracing::warn!("swarm loop busy: peers not disconnected this round");
            0
        }
    }
}

/// Closes unauthenticated inbound connections; returns how many.
async fn close_unauthenticated(commands: &mpsc::Sender<Command>) -> usize {
    let (reply, rx) = oneshot::channel();
    let asked = tokio::time::timeout(
        COMMAND_DEADLINE,
        commands.send(Command::CloseUnauthenticated { reply }),
    )
    .await;
    if !matches!(asked, Ok(Ok(()))) {
        return 0;
    }
    tokio::time::timeout(COMMAND_DEADLINE, rx)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0)
}

/// Runs the trim loop until `cancel` fires.
pub(crate) async fn run(
    shared: Arc<Shared>,
    control: Control,
    commands: mpsc::Sender<Command>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if shared.drain.is_requested() {
            continue;
        }
        let (high, low) = (shared.sizing.high_watermark, shared.sizing.low_watermark);
        let plan = trim::plan(&candidates(&shared), high, low);
        if plan.is_empty() {
            continue;
        }
        let closed = close_unauthenticated(&commands).await;
        let m = &shared.metrics;
        m.trimmed
            .get_or_create(&[("reason", TrimReason::Unauthenticated.as_str())])
            .inc_by(closed as u64);
        for (_, reason) in &plan {
            m.trimmed
                .get_or_create(&[("reason", reason.as_str())])
                .inc();
        }
        tracing::warn!(
            high,
            low,
            members = plan.len(),
            unauthenticated = closed,
            "high watermark reached: trimming"
        );
        let peers: Vec<PeerId> = plan.into_iter().map(|(p, _)| p).collect();
        sender::send_all(&shared, &control, peers.clone(), Reason::Overloaded).await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(shared.config.trim_close_grace) => {}
        }
        // Whoever has not moved yet is closed now. The swarm loop drops the
        // admission and marks the connections closing in one step, so the
        // peer stops counting at once (the next check does not pick it
        // again) and is never counted as missing the auth deadline.
        disconnect(&commands, peers).await;
    }
}
