//! `--forward LISTEN_ADDR=NAME`: a local TCP listener whose every accepted
//! connection becomes a call to service NAME, spliced both ways.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::shared::Shared;

/// Accepts on `listener` until the node stops; at most
/// `--max-forward-connections` forwarded connections at once (more wait in
/// the listen backlog).
pub(crate) async fn serve(shared: Arc<Shared>, listener: TcpListener, service: String) {
    let limit = Arc::new(Semaphore::new(shared.config.max_forward_connections.max(1)));
    let mut conns = JoinSet::new();
    let mut shutdown = shared.shutdown.clone();
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (tcp, from) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "forward accept failed");
                    continue;
                }
            },
            _ = shutdown.wait_for(|s| *s) => break,
        };
        while conns.try_join_next().is_some() {}
        let shared = shared.clone();
        let service = service.clone();
        conns.spawn(
            async move {
                let _permit = permit;
                forward_one(&shared, tcp, from, &service).await;
            }
            .in_current_span(),
        );
    }
    // Stopping: accept nothing new; connections in progress finish within the grace.
    drop(listener);
    let grace = std::time::Duration::from_secs(shared.config.shutdown_grace_secs);
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
}

async fn forward_one(
    shared: &Arc<Shared>,
    mut tcp: tokio::net::TcpStream,
    from: SocketAddr,
    service: &str,
) {
    let _ = tcp.set_nodelay(true);
    match crate::call::outbound::call(shared, service).await {
        Ok(mut stream) => {
            if let Err(e) = tokio::io::copy_bidirectional(&mut tcp, &mut stream).await {
                tracing::debug!(%from, service, error = %e, "forwarded connection ended with an error");
            }
        }
        Err(e) => {
            tracing::warn!(%from, service, error = %e, "forwarded connection: call failed");
        }
    }
}
