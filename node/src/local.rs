//! What the node's local listeners (the Unix socket, the `--forward`
//! listeners) share: a bound on the connections they hold open, with a
//! gauge and a count of the connections that had to wait for it, and one
//! accept loop that pauses after a failed `accept()` instead of spinning.
//!
//! Every `--forward` listener takes from one total
//! (`--max-forward-connections`), so adding listeners does not multiply the
//! file descriptors and calls a node may hold; the Unix socket has a bound
//! of the same size of its own, so `/readyz` probes and `agentmesh-node
//! call` never queue behind forwarded TCP connections. A bound that bites
//! is counted: `agentmesh_node_local_connection_waits_total{listener}`.

use std::future::Future;
use std::sync::Arc;

use agentmesh_runtime::accept::AcceptBackoff;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::metrics::{ListenerLabel, Metrics};
use crate::node::Node;

/// A listener of ours: what `accept()` hands out.
pub(crate) trait Listener: Send + 'static {
    /// One accepted connection (with its peer address where there is one).
    type Conn: Send + 'static;
    /// Waits for the next connection.
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Conn = (tokio::net::TcpStream, std::net::SocketAddr);
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send {
        self.accept()
    }
}

impl Listener for tokio::net::UnixListener {
    type Conn = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Conn> {
        self.accept().await.map(|(c, _)| c)
    }
}

/// A bound on the connections open at once across the listeners sharing it.
#[derive(Debug)]
pub(crate) struct Limit {
    slots: Arc<Semaphore>,
    active: Gauge,
    waits: Counter,
}

impl Limit {
    /// At most `max` (at least 1) connections, gauged and counted under
    /// `listener` (one of [`crate::metrics::LISTENERS`]).
    pub(crate) fn new(max: usize, listener: &'static str, metrics: &Metrics) -> Arc<Self> {
        let label = ListenerLabel { listener };
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max.max(1))),
            active: metrics
                .local
                .local_connections_active
                .get_or_create(&label)
                .clone(),
            waits: metrics
                .local
                .local_connection_waits
                .get_or_create(&label)
                .clone(),
        })
    }

    /// A slot, at once if one is free; otherwise counts a wait and waits
    /// (without a deadline of its own: until a connection ends, or the
    /// node stops and the caller drops this).
    pub(crate) async fn acquire(&self) -> Slot {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.waits.inc();
                tracing::debug!("local connection bound reached: waiting for a connection to end");
                match self.slots.clone().acquire_owned().await {
                    Ok(p) => p,
                    // Never closed; should it be, wait for the node to stop.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        self.active.inc();
        Slot {
            _permit: permit,
            active: self.active.clone(),
        }
    }
}

/// One open connection's share of a [`Limit`]; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    active: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.active.dec();
    }
}

/// Accepts on `listener` until the node stops; every connection runs
/// `handle` while holding a slot of `limit`. A connection accepted while
/// `limit` is full waits for a slot before the next accept, so each
/// listener holds at most one connection beyond the bound (the rest stay in
/// the listen backlog). A failed accept (e.g. out of file descriptors) is
/// counted in `agentmesh_node_accept_errors_total{listener}` and followed by
/// an [`AcceptBackoff`] pause. On stop the listener closes first, then
/// connections in progress get `--shutdown-grace-secs` to finish.
pub(crate) async fn serve<L, H, F>(
    node: Arc<Node>,
    name: &'static str,
    listener: L,
    limit: Arc<Limit>,
    handle: H,
) where
    L: Listener,
    H: Fn(L::Conn) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let errors = node
        .metrics
        .local
        .accept_errors
        .get_or_create(&ListenerLabel { listener: name })
        .clone();
    let mut backoff = AcceptBackoff::new();
    let mut conns = JoinSet::new();
    let mut shutdown = node.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            r = listener.next() => r,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let conn = match accepted {
            Ok(c) => {
                backoff.succeeded();
                c
            }
            Err(e) => {
                errors.inc();
                let pause = backoff.failed();
                tracing::warn!(listener = name, error = %e, failures = backoff.failures(), ?pause, "accept failed: pausing before the next");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => continue,
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
        };
        let slot = tokio::select! {
            s = limit.acquire() => s,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        while conns.try_join_next().is_some() {}
        let work = handle(conn);
        conns.spawn(
            async move {
                let _slot = slot;
                work.await;
            }
            .in_current_span(),
        );
    }
    // Stopping: accept nothing new; connections in progress finish within the grace.
    drop(listener);
    let grace = node.config.shutdown_grace;
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    #[test]
    fn a_full_limit_counts_the_wait_and_the_gauge_follows_open_slots() {
        let m = Metrics::new();
        let limit = Limit::new(1, "forward", &m);
        let label = ListenerLabel {
            listener: "forward",
        };
        let first = limit.acquire().now_or_never().expect("a free slot");
        assert_eq!(
            m.local.local_connections_active.get_or_create(&label).get(),
            1
        );
        assert_eq!(
            m.local.local_connection_waits.get_or_create(&label).get(),
            0
        );

        let mut second = Box::pin(limit.acquire());
        assert!(
            (&mut second).now_or_never().is_none(),
            "over the bound: waits"
        );
        assert_eq!(
            m.local.local_connection_waits.get_or_create(&label).get(),
            1
        );
        drop(first);
        let second = second.now_or_never().expect("the freed slot");
        assert_eq!(
            m.local.local_connections_active.get_or_create(&label).get(),
            1
        );
        drop(second);
        assert_eq!(
            m.local.local_connections_active.get_or_create(&label).get(),
            0
        );
        // The other listener's series is its own.
        let socket = ListenerLabel { listener: "socket" };
        assert_eq!(
            m.local
                .local_connections_active
                .get_or_create(&socket)
                .get(),
            0
        );
    }
}
