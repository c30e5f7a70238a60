//! HTTP: `/info` (routers, keys, revocations, the policy in force as
//! JSON), `/policy` (read-only: the policy's version, epoch, text and
//! summary), `/metrics`, `/healthz` (process up) and `/readyz` (every
//! long-lived task runs and the database answers).

use std::{sync::Arc, time::Instant};

use agentmesh_proto::{identity::PeerId, revocations::peek_list, unix_now};
use axum::{
    Json, Router,
    extract::{Query, State as AxState},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::{Engine, engine::general_purpose::STANDARD};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use tokio::{net::TcpListener, sync::watch};

use crate::{
    config::HttpConfig,
    readiness::{DbHealth, DbVerdict},
    state::State,
    status::to_status,
    supervisor::{TaskFailure, Tasks},
};

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// Server state.
    pub state: Arc<State>,
    /// The metrics registry.
    pub registry: Arc<Registry>,
    /// The supervisor's record of a task that stopped (then not ready).
    pub failure: watch::Receiver<Option<TaskFailure>>,
    /// The database's health as `/readyz` saw it (the grace rule).
    pub db_health: Arc<DbHealth>,
}

/// Serves the HTTP listener as the task `http` until the stop signal;
/// `registry` is final here (every other subsystem registered first).
pub fn spawn(
    config: &HttpConfig,
    listener: TcpListener,
    state: Arc<State>,
    registry: Arc<Registry>,
    tasks: &mut Tasks,
) {
    let app = router(HttpState {
        state,
        registry,
        failure: tasks.failure(),
        db_health: Arc::new(DbHealth::new(config.db_unready_after)),
    });
    let mut stop = tasks.stop_signal();
    tasks.spawn("http", async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| format!("HTTP server: {e}"))
    });
}

/// The HTTP router.
pub fn router(s: HttpState) -> Router {
    Router::new()
        .route("/info", get(info))
        .route("/policy", get(policy))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(s)
}

fn peer_string(bytes: &[u8]) -> String {
    PeerId::from_bytes(bytes)
        .map(|p| p.to_string())
        .unwrap_or_else(|_| hex::encode(bytes))
}

async fn info(AxState(s): AxState<HttpState>) -> Response {
    let dir = match s.state.get_directory().await {
        Ok(d) => d,
        Err(e) => {
            let st = to_status(&e);
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "error": st.message() })),
            )
                .into_response();
        }
    };
    let keys = s.state.keys.key_set(unix_now());
    let routers: Vec<Value> = dir
        .routers
        .iter()
        .map(|r| {
            let load = r.load.unwrap_or_default();
            json!({
                "peer_id": peer_string(&r.peer_id),
                "addrs": r.addrs,
                "labels": agentmesh_proto::credential::labels_to_map(&r.labels),
                "load": {
                    "attached_members": load.attached_members,
                    "transit_connections": load.transit_connections,
                    "high_watermark": load.high_watermark,
                    "low_watermark": load.low_watermark,
                },
                "draining": r.draining,
                "lease_expires_at_unix_secs": r.lease_expires_at_unix_secs,
            })
        })
        .collect();
    let keys: Vec<Value> = keys
        .keys
        .iter()
        .map(|k| {
            json!({
                "key_id": k.key_id,
                "ed25519": STANDARD.encode(&k.ed25519),
                "active_from_unix_secs": k.active_from_unix_secs,
                "verify_until_unix_secs": k.verify_until_unix_secs,
            })
        })
        .collect();
    // Our own signed list, read without verifying; entries in force only.
    let list = dir
        .revocations
        .as_ref()
        .and_then(peek_list)
        .unwrap_or_default();
    let now = unix_now();
    let revocations: Vec<Value> = list
        .entries
        .iter()
        .filter(|r| r.until_unix_secs >= now)
        .map(|r| {
            json!({
                "peer_id": peer_string(&r.peer_id),
                "token_id": r.token_id,
                "until_unix_secs": r.until_unix_secs,
                "reason": r.reason,
            })
        })
        .collect();
    Json(json!({
        "public_url": s.state.public_url,
        "generated_at_unix_secs": dir.generated_at_unix_secs,
        "routers": routers,
        "keys": keys,
        "revocations": revocations,
        "revocations_epoch": list.epoch,
        "revocations_generation": list.generation,
        "next_key_rotation_unix_secs": s.state.keys.next_rotation_at(),
        "policy": crate::policy::page::info(&s.state),
    }))
    .into_response()
}

/// `?version=N` of `/policy`.
#[derive(Debug, serde::Deserialize)]
struct PolicyQuery {
    version: Option<u64>,
}

async fn policy(AxState(s): AxState<HttpState>, Query(q): Query<PolicyQuery>) -> Response {
    let (code, body) = crate::policy::page::page(&s.state, q.version).await;
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(body)).into_response()
}

async fn metrics(AxState(s): AxState<HttpState>) -> Response {
    for (table, stats) in s.state.limits.source_tables() {
        s.state.metrics.set_source_table(table, stats);
    }
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn readyz(AxState(s): AxState<HttpState>) -> Response {
    if let Some(f) = s.failure.borrow().clone() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {f}\n")).into_response();
    }
    let ping = s.state.db.run(s.state.db.store().ping()).await;
    match (s.db_health.observe(ping.is_ok(), Instant::now()), ping) {
        (DbVerdict::Ready, _) | (_, Ok(())) => (StatusCode::OK, "ready\n").into_response(),
        (DbVerdict::Failing { for_ }, Err(e)) => (
            StatusCode::OK,
            format!(
                "ready: database failing for {:.1} s (not ready after --db-unready-after-secs): {e}\n",
                for_.as_secs_f64()
            ),
        )
            .into_response(),
        (DbVerdict::Unready { for_ }, Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: database failing for {:.1} s: {e}\n",
                for_.as_secs_f64()
            ),
        )
            .into_response(),
    }
}
