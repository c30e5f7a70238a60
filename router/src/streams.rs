//! The accept loop shared by our own protocols: drain an `agentmesh_streams`
//! listener without ever waiting, serve each stream in its own task while
//! it holds a slot of the protocol's fair budget, and drop (and count)
//! streams refused.
//!
//! A stream's slot is charged to its connection's source (the address in
//! its `ConnectionInfo`). When every slot is taken, a stream from a source
//! holding fewer than the heaviest source takes that source's oldest slot,
//! and the task serving that one stops at once, closing its stream; a
//! stream from a source holding its share already is dropped. So strangers
//! from one address cannot hold every slot while anyone else asks, and any
//! one source may use them all while nobody else does.
//!
//! A protocol with a [`Queue`] (auth) does not drop a stream refused a
//! slot: the stream waits for one, holding a place of the queue's own fair
//! budget (so the queue is bounded and shared by source like the slots),
//! for at most the queue's wait, which is shorter than the member's own
//! deadline. Served in time, it is served like any other; otherwise (or when
//! its place is taken for a source holding fewer) it gets the queue's early
//! answer, a refusal with a retry-after, instead of silence until the
//! member gives up. While streams wait, newcomers queue behind them. A
//! stream that finds no place for its source is dropped as before.
//!
//! A stranger (a peer not admitted) whose streams are refused keeps paying
//! nothing for reopening them: negotiation is cheap for it and costs the
//! router a little each time, as fast as its link allows. So each stream
//! refused here counts against its connection ([`RefusedStreams`]); past
//! `--stranger-refused-streams-max` the connection is closed and counted as
//! a failed login of its source, which the failed-login guard turns into a
//! short block once it repeats. Members are never closed for this: under
//! contention their streams may be refused too, through no fault of theirs.
//! Nor are connections this router dialed: their peer is one we chose (a
//! router of the directory, which may open streams before its own auth to
//! us is through), not a stranger reaching in, and their remote address is
//! where we went, not a source to block. The resource manager exempts them
//! from the strangers' budgets by the same rule.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_streams::{ConnectionInfo, IncomingStreams};
use futures::StreamExt;
use futures::future::BoxFuture;
use libp2p::Stream;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::Admissions;
use crate::metrics::Metrics;
use crate::resources::ResourceManager;
use crate::resources::slots::{FairBudget, HeldSlot, SlotRefusalReason, WaitOutcome};
use crate::resources::source::ip_of;

/// The early answer to a stream that waited in vain: the stream, with the
/// retry-after to name.
pub(crate) type Answer =
    Arc<dyn Fn(ConnectionInfo, Stream, Duration) -> BoxFuture<'static, ()> + Send + Sync>;

/// Where streams refused a slot wait for one.
pub(crate) struct Queue {
    /// Places in the queue, shared fairly by source.
    pub(crate) places: FairBudget,
    /// Longest wait for a slot.
    pub(crate) wait: Duration,
    /// The retry-after the early answer names.
    pub(crate) retry_after: Duration,
    /// Writes the early answer.
    pub(crate) answer: Answer,
}

/// The reason label (of `agentmesh_router_connections_closed_total`, and
/// of `agentmesh_router_failed_logins_total`) of a stranger's connection
/// closed for its refused streams.
pub(crate) const REFUSED_STREAMS: &str = "refused_streams";

/// Bounds the streams refused on one connection of a stranger; shared by
/// every protocol's accept loop, the count lives with the connection in
/// the streams behaviour (`Control::count_refused`) and goes with it.
pub(crate) struct RefusedStreams {
    /// Counts refusals per connection and closes connections.
    pub(crate) control: agentmesh_streams::Control,
    /// Refused streams a stranger's connection may have; the next one
    /// closes it. 0: never closed for this.
    pub(crate) max: u32,
    /// Whether the peer is a member (members are never closed for this).
    pub(crate) admissions: Admissions,
    /// The failed-login guard, and the per-source log limiter.
    pub(crate) resources: Arc<ResourceManager>,
    /// `connections_closed{reason="refused_streams"}`.
    pub(crate) metrics: Metrics,
}

/// Whether a stranger's connection with `refused` streams refused so far
/// is past its budget `max` (0: no budget).
pub(crate) fn past_refusal_budget(refused: u32, max: u32) -> bool {
    max > 0 && refused > max
}

impl RefusedStreams {
    /// One stream of `info`'s connection was refused: counted if its peer
    /// is a stranger that connected to us, and its connection closed once
    /// past the budget (once: later refusals on it while it closes change
    /// nothing). Connections we dialed are never counted (module doc).
    pub(crate) fn refused(&self, info: &ConnectionInfo) {
        if self.max == 0
            || info.dialed
            || self
                .admissions
                .read()
                .is_admitted(&info.peer, agentmesh_proto::unix_now())
        {
            return;
        }
        let Some(n) = self.control.count_refused(info) else {
            return;
        };
        if !past_refusal_budget(n, self.max) || !self.control.close_connection(info) {
            return;
        }
        self.metrics
            .connections_closed
            .get_or_create(&[("reason", REFUSED_STREAMS)])
            .inc();
        let ip = ip_of(&info.remote_addr);
        self.resources.failed_login(ip, REFUSED_STREAMS);
        let key = ip.map_or_else(|| info.peer.to_string(), |ip| ip.to_string());
        if let Some(suppressed) = self.resources.log_pass(&key, "stranger_streams_closed") {
            tracing::warn!(
                source = key,
                peer = %info.peer,
                refused = n,
                suppressed,
                max = self.max,
                "stranger's connection closed: too many refused streams \
                 (--stranger-refused-streams-max; logged at most once a minute per source)"
            );
        }
    }
}

/// What the loop of one protocol works with.
pub(crate) struct Accept {
    /// The protocol's fair budget of streams served at once.
    pub(crate) slots: FairBudget,
    /// For the per-source log limiter.
    pub(crate) resources: Arc<ResourceManager>,
    /// Where streams refused a slot wait (none: they are dropped).
    pub(crate) queue: Option<Queue>,
    /// Counts the streams dropped here against their connection.
    pub(crate) refusals: Arc<RefusedStreams>,
}

/// Serves `fut` while `slot` holds; stops it when the slot is taken.
async fn serve_holding<Fut: Future<Output = ()>>(
    slot: HeldSlot,
    fut: Fut,
    peer: libp2p::PeerId,
    protocol: &'static str,
) {
    tokio::select! {
        biased;
        () = slot.revoked() => {
            tracing::debug!(%peer, protocol, "slot taken for a source holding fewer; stream closed");
        }
        () = fut => {}
    }
    drop(slot);
}

/// Serves streams from `incoming`: each that `gate` lets through and that
/// gets a slot of `a.slots` (at once, or after waiting in `a.queue`) is
/// served by `serve` until it ends or its slot is taken for another source.
pub(crate) async fn accept_loop<G, F, Fut>(
    a: Accept,
    mut incoming: IncomingStreams,
    cancel: CancellationToken,
    gate: G,
    serve: F,
) where
    G: Fn(&ConnectionInfo) -> Result<(), SlotRefusalReason>,
    F: Fn(ConnectionInfo, Stream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let protocol = a.slots.label();
    let serve = Arc::new(serve);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = incoming.next() => {
                let Some((info, stream)) = next else { break };
                let ip = ip_of(&info.remote_addr);
                if let Err(reason) = gate(&info) {
                    a.slots.refused(reason);
                    tracing::debug!(peer = %info.peer, protocol, reason = reason.as_str(), "stream refused");
                    drop(stream);
                    a.refusals.refused(&info);
                    continue;
                }
                // Behind streams already waiting, a newcomer waits too.
                let refusal = match &a.queue {
                    Some(_) if a.slots.has_waiters() => None,
                    // With a queue, a refusal is counted only if the
                    // stream is dropped after all (its wait is counted).
                    Some(_) => match a.slots.try_acquire_quiet(ip) {
                        Ok(slot) => {
                            let peer = info.peer;
                            let fut = serve(info, stream);
                            tasks.spawn(serve_holding(slot, fut, peer, protocol));
                            continue;
                        }
                        Err(r) => Some(r),
                    },
                    None => match a.slots.try_acquire(ip) {
                        Ok(slot) => {
                            let peer = info.peer;
                            let fut = serve(info, stream);
                            tasks.spawn(serve_holding(slot, fut, peer, protocol));
                            continue;
                        }
                        Err(r) => Some(r),
                    },
                };
                let Some(q) = &a.queue else {
                    if let Some(r) = refusal {
                        log_refused(&a.resources, &info, protocol, &r);
                    }
                    drop(stream);
                    a.refusals.refused(&info);
                    continue;
                };
                let Ok(place) = q.places.try_acquire(ip) else {
                    a.slots.count_wait(WaitOutcome::Full);
                    a.slots.refused(SlotRefusalReason::SourceShare);
                    if let Some(r) = refusal {
                        log_refused(&a.resources, &info, protocol, &r);
                    }
                    drop(stream);
                    a.refusals.refused(&info);
                    continue;
                };
                let slots = a.slots.clone();
                let until = Instant::now() + q.wait;
                let (retry_after, answer) = (q.retry_after, q.answer.clone());
                let serve = serve.clone();
                tasks.spawn(async move {
                    let peer = info.peer;
                    match slots.acquire_waiting(ip, until, &place).await {
                        Ok(slot) => {
                            drop(place);
                            serve_holding(slot, serve(info, stream), peer, protocol).await;
                        }
                        Err(why) => {
                            tracing::debug!(%peer, protocol, ?why, ?retry_after, "no slot in time: answered busy");
                            // The place is held while answering, so
                            // answers in progress stay bounded.
                            answer(info, stream, retry_after).await;
                            drop(place);
                        }
                    }
                });
            }
        }
    }
    tasks.shutdown().await;
}

/// Logs a stream refused a slot, at most once a minute per source.
fn log_refused(
    resources: &ResourceManager,
    info: &ConnectionInfo,
    protocol: &'static str,
    r: &agentmesh_fair::SlotRefusal,
) {
    let key = r.source.to_string();
    if let Some(suppressed) = resources.log_pass(&key, "stream_slot_refused") {
        tracing::warn!(
            source = key,
            peer = %info.peer,
            protocol,
            suppressed,
            held = r.held,
            fair_share = r.fair_share,
            "stream refused: every slot is taken and this source holds \
             its share (logged at most once a minute per source)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::past_refusal_budget;

    #[test]
    fn a_connection_is_past_its_budget_only_beyond_it_and_never_without_one() {
        assert!(!past_refusal_budget(1, 32));
        assert!(!past_refusal_budget(32, 32), "the budget itself is allowed");
        assert!(past_refusal_budget(33, 32));
        assert!(!past_refusal_budget(u32::MAX, 0), "0: no budget");
    }
}
