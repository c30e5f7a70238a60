//! The gRPC server subsystem: the ControlPlane service behind its request
//! limits, health and reflection, on the bound listener with TLS, HTTP/2
//! keepalive, connection age, and the connection and stream bounds of
//! [`crate::grpc_limits`]. Runs as the supervised task `grpc`.

use std::{net::SocketAddr, sync::Arc};

use agentmesh_proto::pb::{
    FILE_DESCRIPTOR_SET, controlplane::control_plane_server::ControlPlaneServer,
};
use tokio::net::TcpListener;
use tonic::{
    service::Routes,
    transport::{Identity, Server, ServerTlsConfig},
};

use crate::{
    config::GrpcServerConfig,
    grpc_limits::{BoundedIncoming, Handshakes, StreamLimit},
    malformed::Malformed,
    service::Service,
    spawn_error::{SpawnError, read_file},
    state::State,
    supervisor::Tasks,
};

/// Largest gRPC answer sent: tonic clients (ours among them) refuse to decode
/// more than 4 MiB by default, so a larger answer could never be read.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Descriptors kept aside for the database, the HTTP listener and the rest.
const FD_HEADROOM: u64 = 256;

/// The gRPC listener, bound before the state is built (the public URL
/// names its address), with the TLS identity if one is configured.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    tls: Option<Identity>,
}

impl Bound {
    /// Binds `--grpc-addr` and reads the TLS files.
    pub async fn bind(config: &GrpcServerConfig) -> Result<Self, SpawnError> {
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|source| SpawnError::Bind {
                addr: config.addr,
                source,
            })?;
        let tls = match &config.tls {
            Some((c, k)) => Some(Identity::from_pem(read_file(c).await?, read_file(k).await?)),
            None => None,
        };
        Ok(Self { listener, tls })
    }

    /// The bound address.
    pub fn local_addr(&self, config: &GrpcServerConfig) -> Result<SocketAddr, SpawnError> {
        self.listener
            .local_addr()
            .map_err(|source| SpawnError::Bind {
                addr: config.addr,
                source,
            })
    }

    /// Whether clients must speak TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// Warns when the open-files limit cannot hold `--grpc-max-connections`:
/// accepting then fails with `EMFILE` first (counted and survived, but
/// clients see refused connections below the configured bound). Reads the
/// soft limit from `/proc/self/limits` (Linux; elsewhere it says nothing).
async fn warn_if_fd_limit_below(max_connections: usize) {
    let Ok(limits) = tokio::fs::read_to_string("/proc/self/limits").await else {
        return;
    };
    let soft: Option<u64> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    let need = (max_connections as u64).saturating_add(FD_HEADROOM);
    if let Some(soft) = soft.filter(|s| *s < need) {
        tracing::warn!(
            open_files_limit = soft,
            grpc_max_connections = max_connections,
            "the open-files limit is below --grpc-max-connections + {FD_HEADROOM}: raise it \
             (ulimit -n) or lower the flag; accept errors show in grpc_accept_errors_total"
        );
    }
}

/// The transport: stream bound, HTTP/2 keepalive, connection age, TLS.
fn builder(config: &GrpcServerConfig, tls: Option<Identity>) -> Result<Server, SpawnError> {
    let max_streams = config.max_streams_per_connection;
    // HTTP/2 keepalive closes a connection whose peer stopped answering
    // PINGs (vanished laptop, dropped NAT mapping), freeing its slot. TCP
    // keepalive is not set: tonic applies it only to listeners it binds
    // itself, and the PINGs find the same dead peers sooner, through TLS.
    let mut builder = Server::builder()
        .max_concurrent_streams(Some(
            u32::try_from(max_streams.saturating_mul(2)).unwrap_or(u32::MAX),
        ))
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .http2_keepalive_timeout(Some(config.keepalive_timeout));
    // Idle members' connections are what the control plane holds per
    // member (see DEFAULT_GRPC_MAX_CONNECTION_AGE_SECS); no grace: a
    // connection with a call in flight (a router's Watch) stays until the
    // call ends, which a Watch does at --watch-max-age-secs at the latest
    // (or its credential's expiry, if sooner).
    if let Some(age) = config.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(identity) = tls {
        crate::tls::ensure_crypto_provider();
        builder = builder
            .tls_config(
                ServerTlsConfig::new()
                    .identity(identity)
                    .timeout(config.handshake_timeout),
            )
            .map_err(|e| SpawnError::Tls(e.to_string()))?;
    }
    Ok(builder)
}

/// The services: ControlPlane (behind [`Malformed`]), health, reflection.
async fn routes(config: &GrpcServerConfig, state: &Arc<State>) -> Result<Routes, SpawnError> {
    let (health, health_svc) = tonic_health::server::health_reporter();
    health.set_serving::<ControlPlaneServer<Service>>().await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| SpawnError::Config(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| SpawnError::Config(format!("reflection: {e}")))?;
    // Requests are refused past --grpc-max-message-bytes before they are
    // read (OUT_OF_RANGE); answers are held to what tonic clients decode by
    // default, so an oversized answer fails here with a clear status.
    let max_request = config.max_message_bytes;
    let control_plane = ControlPlaneServer::new(Service::new(state.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    // Requests tonic refuses before a handler (undecodable, too large) are
    // answered, counted and charged to their source there.
    let control_plane = Malformed::new(control_plane, state.clone());
    Ok(Routes::new(control_plane)
        .add_service(
            health_svc
                .max_decoding_message_size(max_request)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            reflection_v1
                .max_decoding_message_size(max_request)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            reflection_v1alpha
                .max_decoding_message_size(max_request)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .prepare())
}

/// Serves `bound` as the task `grpc` until the stop signal.
pub async fn spawn(
    config: &GrpcServerConfig,
    bound: Bound,
    state: &Arc<State>,
    tasks: &mut Tasks,
) -> Result<(), SpawnError> {
    let builder = builder(config, bound.tls)?;
    let routes = routes(config, state).await?;
    let handshakes = Arc::new(Handshakes::default());
    let grpc = StreamLimit::new(
        routes,
        config.max_streams_per_connection,
        handshakes.clone(),
        state.metrics.clone(),
    );
    warn_if_fd_limit_below(config.max_connections).await;
    let incoming = BoundedIncoming::new(
        bound.listener,
        state.limits.connection_slots(),
        config.handshake_timeout,
        handshakes,
        state.metrics.clone(),
        state.limits.refusal_log(),
    );
    let mut stop = tasks.stop_signal();
    tasks.spawn("grpc", async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        builder
            .serve_with_incoming_shutdown(grpc, incoming, shutdown)
            .await
            .map_err(|e| format!("gRPC server: {e}"))
    });
    Ok(())
}
