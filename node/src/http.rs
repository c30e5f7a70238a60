//! `--metrics-addr`: `/metrics` (Prometheus text) and `/readyz`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::node::Node;

#[derive(Clone)]
struct AppState {
    node: Arc<Node>,
    registry: Arc<Registry>,
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let st = s.node.status.borrow().clone();
    let code = if st.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, st.readyz_line())
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("cannot encode metrics: {e}\n"),
        ),
    }
}

/// Serves until the node stops.
pub(crate) async fn serve(node: Arc<Node>, registry: Arc<Registry>, listener: TcpListener) {
    let mut shutdown = node.shutdown.clone();
    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState { node, registry });
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "metrics listener failed");
    }
}
