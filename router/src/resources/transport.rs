//! The router's transport: TCP + noise + our bounded yamux, or QUIC with its
//! stream and data limits set, behind DNS resolution for dials; every
//! inbound connection admitted to its handshake as it is accepted (shared
//! fairly by source, shed by progress: `pending.rs`), every connection
//! admitted and charged by the resource manager once up, every stream
//! accounted (`muxer.rs`).
//!
//! DNS: operators announce `/dns4/<service>/tcp/4001` (one Kubernetes Service
//! per router pod), so router-to-router dials go through libp2p's DNS
//! transport, which resolves `/dns`, `/dns4`, `/dns6` and `/dnsaddr` and
//! hands TCP or QUIC an IP address. It wraps both below the accounting
//! layer: resolution changes nothing about what a connection is charged.

use std::sync::Arc;
use std::time::Duration;

use futures::future;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::{Boxed, Transport};
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::{PeerId, dns, noise, quic, tcp};

use super::ResourceManager;
use super::budget::Refusal;
use super::config::ResourceConfig;
use super::muxer::{Accounted, InboundBuffer, yamux_upgrade};

/// Deadline of the TCP security and muxer handshakes.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(20);
/// Streams per yamux connection above the budgets (the backstop margin).
const YAMUX_BACKSTOP_MARGIN: usize = 64;

/// A connection the resource manager refused.
#[derive(Debug, thiserror::Error)]
#[error("connection refused: {} budget ({} scope) exhausted", .0.resource.as_str(), .0.scope.as_str())]
pub(crate) struct ConnectionRefused(pub(crate) Refusal);

/// Why the transport could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransportError {
    /// Noise could not be configured with our key.
    #[error("noise: {0}")]
    Noise(#[from] noise::Error),
}

/// Wraps the transport `make` builds in DNS resolution for dials: with
/// the system's resolver configuration (`/etc/resolv.conf`), else (with a
/// warning) hickory's defaults, which still resolve `localhost` and the
/// hosts file. Listening is untouched.
fn with_dns<T>(make: impl Fn() -> T) -> dns::tokio::Transport<T> {
    dns::tokio::Transport::system(make()).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "no system DNS configuration: resolving with defaults (hosts file only)");
        dns::tokio::Transport::custom(
            make(),
            dns::ResolverConfig::default(),
            dns::ResolverOpts::default(),
        )
    })
}

/// Yamux's per-connection stream cap: above every per-peer budget, so our
/// budgets refuse first and the cap (which closes the connection) only backs
/// them up.
pub(crate) fn yamux_max_streams(r: &ResourceConfig) -> usize {
    (r.peer_stream_budget_total as usize)
        .saturating_add(r.circuits_per_destination as usize)
        .saturating_add(YAMUX_BACKSTOP_MARGIN)
}

/// The QUIC configuration with the limits from `r`.
pub(crate) fn quic_config(key: &Keypair, r: &ResourceConfig) -> quic::Config {
    let mut c = quic::Config::new(key);
    c.max_concurrent_stream_limit = r.transport.quic_max_concurrent_streams;
    c.max_stream_data = r.transport.quic_max_stream_data_bytes;
    c.max_connection_data = r.transport.quic_max_connection_data_bytes;
    c
}

/// TCP (noise, bounded yamux) or QUIC behind DNS resolution, each
/// connection admitted by `mgr`.
pub(crate) fn build(
    key: &Keypair,
    r: &ResourceConfig,
    mgr: Arc<ResourceManager>,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, TransportError> {
    let noise = noise::Config::new(key)?;
    let max_streams = yamux_max_streams(r);
    let inbound = InboundBuffer {
        max: usize::try_from(r.transport.yamux_max_buffered_inbound_streams)
            .unwrap_or(usize::MAX)
            .max(1),
        dropped: mgr.buffered_inbound_dropped(),
    };
    let quic_config = quic_config(key, r);
    let handshakes = mgr.handshakes().clone();
    let ip_transport = || {
        // Handshakes are admitted as each connection is accepted, shed by
        // progress on the raw socket (TCP) or oldest first (QUIC), and
        // closed at once when they give way (`pending.rs`).
        let raw = tcp::tokio::Transport::new(
            tcp::Config::default()
                .nodelay(true)
                .listen_backlog(r.transport.listen_backlog_connections),
        );
        let tcp = handshakes.tcp(raw, |watched| {
            watched
                .upgrade(Version::V1Lazy)
                .authenticate(noise.clone())
                .multiplex(yamux_upgrade(max_streams, inbound.clone()))
                .timeout(UPGRADE_TIMEOUT)
                .map(|(peer, m), _| (peer, StreamMuxerBox::new(m)))
        });
        let quic = handshakes.guard(
            quic::tokio::Transport::new(quic_config.clone())
                .map(|(peer, m), _| (peer, StreamMuxerBox::new(m))),
        );
        tcp.or_transport(quic).map(|either, _| either.into_inner())
    };
    let t = with_dns(ip_transport)
        .and_then(move |(peer, muxer), endpoint| {
            future::ready(
                mgr.open_connection(peer, &endpoint)
                    .map(|guard| (peer, StreamMuxerBox::new(Accounted::new(muxer, guard))))
                    .map_err(ConnectionRefused),
            )
        })
        .boxed();
    Ok(t)
}
