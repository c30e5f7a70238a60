//! The metrics listener: `/metrics` (Prometheus text), `/healthz` (the
//! process runs), `/readyz` (DESIGN.md "Readiness", with the reason) and,
//! in the binary, `/debug/allocator` (jemalloc's statistics report).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::state::Shared;

#[derive(Clone)]
struct HttpState {
    registry: Arc<Registry>,
    shared: Arc<Shared>,
}

/// Serves the metrics listener until `cancel` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/drain", post(drain))
        .route("/debug/allocator", get(allocator))
        .with_state(HttpState { registry, shared });
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "metrics listener failed");
    }
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics failed: {e}\n"),
        ),
    }
}

/// `GET /debug/allocator`: jemalloc's full statistics (where resident bytes
/// sit: per arena, per size class, dirty and muzzy pages). Only in the
/// binary (the process-wide switch that also shows
/// `agentmesh_runtime_allocator_*`); 404 in embedded routers, whose
/// allocator may not be jemalloc.
async fn allocator(State(s): State<HttpState>) -> impl IntoResponse {
    if !s.shared.config.runtime_watchdog {
        return (
            StatusCode::NOT_FOUND,
            "no allocator report here\n".to_string(),
        );
    }
    match tokio::task::spawn_blocking(agentmesh_runtime::allocator::report).await {
        Ok(Ok(text)) => (StatusCode::OK, text),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("allocator report failed: {e}\n"),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("allocator report task failed: {e}\n"),
        ),
    }
}

/// `POST /drain`: starts draining (see `RouterHandle::drain`); 202 Accepted.
async fn drain(State(s): State<HttpState>) -> impl IntoResponse {
    if s.shared.drain.request() {
        tracing::info!("drain requested over HTTP");
    }
    (StatusCode::ACCEPTED, "draining\n")
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    match s.shared.readiness().reason() {
        None => (StatusCode::OK, "ready\n".to_string()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}
