//! The accept loop shared by our own protocols: drain an `agentmesh_streams`
//! listener without ever waiting, serve each stream in its own task, and
//! drop (and count) streams beyond a bound.

use std::future::Future;
use std::sync::Arc;

use agentmesh_streams::IncomingStreams;
use futures::StreamExt;
use libp2p::{PeerId, Stream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Serves streams from `incoming` with at most `max_inflight` at once;
/// `protocol` names the metric label of refusals.
pub(crate) async fn accept_loop<F, Fut>(
    metrics: Metrics,
    mut incoming: IncomingStreams,
    max_inflight: usize,
    protocol: &'static str,
    cancel: CancellationToken,
    serve: F,
) where
    F: Fn(PeerId, Stream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(max_inflight.max(1)));
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            next = incoming.next() => {
                let Some((info, stream)) = next else { break };
                let peer = info.peer;
                match permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let fut = serve(peer, stream);
                        tasks.spawn(async move {
                            fut.await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        metrics.stream_refused(protocol);
                        tracing::debug!(%peer, protocol, "too many streams in flight; dropping one");
                        drop(stream);
                    }
                }
            }
        }
    }
    tasks.shutdown().await;
}
