//! `--forward LISTEN_ADDR=NAME`: a local TCP listener whose every accepted
//! connection becomes a call to service NAME, spliced both ways until both
//! are done, the call is idle for `--call-idle-timeout-secs`, or its
//! connection to the provider closes (see `call::splice`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::local::Limit;
use crate::node::Node;

/// Accepts on `listener` until the node stops; at most
/// `--max-forward-connections` forwarded connections at once across every
/// `--forward` listener (`limit`, shared; see [`crate::local`]).
pub(crate) async fn serve(
    node: Arc<Node>,
    listener: TcpListener,
    service: String,
    limit: Arc<Limit>,
) {
    let conns = node.clone();
    crate::local::serve(node, "forward", listener, limit, move |(tcp, from)| {
        let node = conns.clone();
        let service = service.clone();
        async move { forward_one(&node, tcp, from, &service).await }
    })
    .await;
}

async fn forward_one(
    node: &Arc<Node>,
    mut tcp: tokio::net::TcpStream,
    from: SocketAddr,
    service: &str,
) {
    let _ = tcp.set_nodelay(true);
    match crate::call::outbound::call(node, service).await {
        Ok(mut stream) => {
            let out = crate::call::splice::outbound(node, &mut tcp, &mut stream).await;
            tracing::debug!(%from, service, reason = out.end.label(), error = ?out.error, "forwarded connection ended");
        }
        Err(e) => {
            tracing::warn!(%from, service, error = %e, "forwarded connection: call failed");
        }
    }
}
