//! The metrics listener: `/metrics` (Prometheus text), `/healthz` (the
//! process runs), `/readyz` (readiness, with the reason when not ready),
//! `POST /drain` (loopback peers only unless `--drain-http-allow-remote`)
//! and, in the binary, `/debug/allocator` (jemalloc's statistics report).
//!
//! The listener is reachable by whatever may scrape metrics (Prometheus,
//! per the k8s NetworkPolicy), so the one endpoint that changes state,
//! `/drain`, checks the peer address itself: `kubectl port-forward` and a
//! shell in the pod arrive from loopback, a scraper does not.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::drain::DrainState;
use crate::metrics::Metrics;
use crate::readiness::ReadinessState;

/// What the metrics listener reads and drives.
#[derive(Clone)]
pub(crate) struct Http {
    pub(crate) config: Arc<Config>,
    pub(crate) metrics: Metrics,
    pub(crate) readiness: Arc<ReadinessState>,
    pub(crate) drain: Arc<DrainState>,
}

#[derive(Clone)]
struct HttpState {
    registry: Arc<Registry>,
    ctx: Http,
}

impl HttpState {
    fn new(registry: Arc<Registry>, ctx: Http) -> Self {
        Self { registry, ctx }
    }
}

/// Serves the metrics listener until `cancel` fires.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    ctx: Http,
    cancel: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/drain", post(drain))
        .route("/debug/allocator", get(allocator))
        .with_state(HttpState::new(registry, ctx));
    // The peer address reaches handlers as `ConnectInfo` (for `/drain`).
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
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
    if !s.ctx.config.runtime_watchdog {
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

/// Why `POST /drain` was refused (the `reason` label of
/// `agentmesh_router_http_requests_refused_total{endpoint="drain"}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainRefusal {
    /// The peer is not a loopback address and `--drain-http-allow-remote` is off.
    NotLoopback,
}

impl DrainRefusal {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NotLoopback => "not_loopback",
        }
    }
}

/// Whether a `POST /drain` from `peer` may start a drain: from a loopback
/// address always (an IPv4-mapped `::ffff:127.0.0.1`, as a dual-stack
/// listener sees IPv4 loopback, counts as loopback); from anywhere else
/// only with `allow_remote` (operators who protect the listener themselves).
pub(crate) fn drain_allowed(peer: IpAddr, allow_remote: bool) -> Result<(), DrainRefusal> {
    if allow_remote || peer.to_canonical().is_loopback() {
        Ok(())
    } else {
        Err(DrainRefusal::NotLoopback)
    }
}

/// `POST /drain`: starts draining (see `RouterHandle::drain`), 202
/// Accepted; 403 with the reason (counted) from a peer [`drain_allowed`]
/// refuses.
async fn drain(
    State(s): State<HttpState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> (StatusCode, String) {
    if let Err(why) = drain_allowed(peer.ip(), s.ctx.config.drain.http_allow_remote) {
        s.ctx.metrics.http_refused("drain", why.as_str());
        if let Some(suppressed) = s
            .ctx
            .metrics
            .log
            .pass(&peer.ip().to_string(), "drain_refused")
        {
            tracing::warn!(
                %peer,
                reason = why.as_str(),
                suppressed,
                "POST /drain refused: not from loopback (logged at most once a minute per address)"
            );
        }
        return (
            StatusCode::FORBIDDEN,
            format!(
                "drain refused: POST /drain is accepted only from a loopback address \
                 (kubectl port-forward, or a shell in the pod), and {} is not one; \
                 start the router with --drain-http-allow-remote to accept it from anywhere\n",
                peer.ip()
            ),
        );
    }
    if s.ctx.drain.request() {
        tracing::info!(%peer, "drain requested over HTTP");
    }
    (StatusCode::ACCEPTED, "draining\n".to_string())
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    match s.ctx.readiness.get().reason() {
        None => (StatusCode::OK, "ready\n".to_string()),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn drain_is_allowed_from_loopback_only_unless_remote_is_allowed() {
        for peer in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(drain_allowed(ip(peer), false), Ok(()), "{peer}");
        }
        for peer in [
            "10.0.0.7",
            "192.0.2.2",
            "fd00::2",
            "::ffff:10.0.0.7",
            "0.0.0.0",
        ] {
            assert_eq!(
                drain_allowed(ip(peer), false),
                Err(DrainRefusal::NotLoopback),
                "{peer}"
            );
            assert_eq!(
                drain_allowed(ip(peer), true),
                Ok(()),
                "{peer} with allow_remote"
            );
        }
    }

    fn http(adjust: impl FnOnce(&mut Config)) -> Http {
        let mut config = Config::default();
        adjust(&mut config);
        let metrics = Metrics::new(&mut Registry::default());
        Http {
            config: Arc::new(config),
            readiness: Arc::new(ReadinessState::new(metrics.ready.clone())),
            metrics,
            drain: Arc::default(),
        }
    }

    fn refusals(ctx: &Http) -> u64 {
        ctx.metrics
            .http_refused
            .get_or_create(&[("endpoint", "drain"), ("reason", "not_loopback")])
            .get()
    }

    async fn post_drain(ctx: &Http, from: &str) -> (StatusCode, String) {
        let state = HttpState::new(Arc::new(Registry::default()), ctx.clone());
        let peer = SocketAddr::new(ip(from), 40_000);
        drain(State(state), ConnectInfo(peer)).await
    }

    #[tokio::test]
    async fn a_remote_drain_is_refused_with_a_reason_and_counted_and_does_not_drain() {
        let ctx = http(|_| {});
        let (status, body) = post_drain(&ctx, "10.0.0.7").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("only from a loopback address"), "{body}");
        assert!(body.contains("10.0.0.7"), "{body}");
        assert!(body.contains("--drain-http-allow-remote"), "{body}");
        assert_eq!(refusals(&ctx), 1);
        assert!(
            !ctx.drain.is_requested(),
            "a refused request started a drain"
        );

        let (status, body) = post_drain(&ctx, "::ffff:127.0.0.1").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert!(ctx.drain.is_requested());
        assert_eq!(refusals(&ctx), 1, "an accepted drain is not a refusal");
    }

    #[tokio::test]
    async fn with_remote_allowed_any_peer_drains() {
        let ctx = http(|c| c.drain.http_allow_remote = true);
        let (status, body) = post_drain(&ctx, "10.0.0.7").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert!(ctx.drain.is_requested());
        assert_eq!(refusals(&ctx), 0);
    }
}
