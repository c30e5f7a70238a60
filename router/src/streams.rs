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

use std::future::Future;
use std::sync::Arc;

use agentmesh_streams::{ConnectionInfo, IncomingStreams};
use futures::StreamExt;
use libp2p::Stream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::resources::ResourceManager;
use crate::resources::slots::{FairBudget, SlotRefusalReason};
use crate::resources::source::ip_of;

/// What the loop of one protocol works with.
pub(crate) struct Accept {
    /// The protocol's fair budget of streams served at once.
    pub(crate) slots: FairBudget,
    /// For the per-source log limiter.
    pub(crate) resources: Arc<ResourceManager>,
}

/// Serves streams from `incoming`: each that `gate` lets through and that
/// gets a slot of `a.slots` is served by `serve` until it ends or its slot
/// is taken for another source.
pub(crate) async fn accept_loop<G, F, Fut>(
    a: Accept,
    mut incoming: IncomingStreams,
    cancel: CancellationToken,
    gate: G,
    serve: F,
) where
    G: Fn(&ConnectionInfo) -> Result<(), SlotRefusalReason>,
    F: Fn(ConnectionInfo, Stream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let protocol = a.slots.label();
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
                    continue;
                }
                match a.slots.try_acquire(ip) {
                    Ok(slot) => {
                        let peer = info.peer;
                        let fut = serve(info, stream);
                        tasks.spawn(async move {
                            tokio::select! {
                                biased;
                                () = slot.revoked() => {
                                    tracing::debug!(%peer, protocol, "slot taken for a source holding fewer; stream closed");
                                }
                                () = fut => {}
                            }
                            drop(slot);
                        });
                    }
                    Err(r) => {
                        let key = r.source.to_string();
                        if a.resources.log_due(&key) {
                            tracing::warn!(
                                source = key,
                                peer = %info.peer,
                                protocol,
                                held = r.held,
                                fair_share = r.fair_share,
                                "stream refused: every slot is taken and this source holds \
                                 its share (logged at most once a minute per source)"
                            );
                        }
                        drop(stream);
                    }
                }
            }
        }
    }
    tasks.shutdown().await;
}
