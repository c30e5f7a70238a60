//! The node's libp2p swarm: a TCP transport (optionally bound to a
//! source IP: `agentmesh_streams::dial::DialTcp`) plus the relay-client transport, noise and yamux on both, and
//! QUIC for routers that announce it (dial only, from the source IP too:
//! see [`quic`]);
//! the direct-connection gate and upgrade (`crate::direct`), the relay
//! client, `agentmesh-streams` (our protocols) and ping as behaviours.
//!
//! With `--direct=false` a member never listens: everything reaches it
//! through a relayed circuit on one of its routers, so TCP only dials.
//! With `--direct=true` (the default) TCP is [`reuse::ReuseTcp`]: one listening
//! port, and every dial leaves from it; with `--direct-transport=quic` QUIC
//! listens instead ([`quic::DialQuic::listening`]: one UDP socket, every
//! QUIC dial from it) and TCP only dials. The listening transport's
//! inbound handshakes are shared fairly by source, the least progressed
//! shed for a newcomer ([`handshakes`]).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use agentmesh_streams::dial::DialTcp;
use libp2p::core::Transport;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::core::transport::timeout::{TransportTimeout, TransportTimeoutError};
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{Swarm, noise, ping, relay};
use prometheus_client::metrics::counter::Counter;

mod handshakes;
mod muxer;
mod quic;
pub(crate) mod reuse;

pub(crate) use muxer::WindowLimits;

/// The node's behaviours. `direct` comes first: it refuses inbound
/// direct connections from strangers before any other behaviour keeps
/// state for them.
#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub(crate) struct Behaviour {
    pub(crate) direct: crate::direct::Behaviour,
    pub(crate) relay: relay::client::Behaviour,
    pub(crate) stream: agentmesh_streams::Behaviour,
    pub(crate) ping: ping::Behaviour,
}

/// Why the swarm could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// The noise configuration could not be made from the key.
    #[error("noise: {0}")]
    Noise(#[from] noise::Error),
    /// The yamux limits cannot be used.
    #[error("yamux: {0}")]
    Yamux(#[from] muxer::LimitsError),
    /// The direct-connection port could not be bound.
    #[error("listen on {0} for direct connections: {1}")]
    Listen(SocketAddr, String),
    /// The task building the transport failed.
    #[error("transport set-up task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

type Direct = libp2p::core::transport::Boxed<(libp2p::PeerId, StreamMuxerBox)>;

/// How TCP listens and dials when direct connections are on: the log of
/// dials that could not reuse the port, and their counter.
#[derive(Clone, Debug)]
pub(crate) struct Reuse {
    /// Where dials that fell back to a fresh port are noted.
    pub(crate) log: reuse::ReuseLog,
    /// `agentmesh_node_port_reuse_fallbacks_total`.
    pub(crate) fallbacks: Counter,
    /// `TCP_USER_TIMEOUT` of every socket (`None`: the kernel's default).
    pub(crate) user_timeout: Option<std::time::Duration>,
    /// `agentmesh_node_port_reuse_adopted_total`.
    pub(crate) adopted: Counter,
}

/// Where the member's connections leave from, and whether it listens.
#[derive(Clone, Debug, Default)]
pub(crate) struct Dialing {
    /// `--dial-source-ip`.
    pub(crate) source_ip: Option<IpAddr>,
    /// Direct connections on: the address to listen on (`--listen-ip`,
    /// `--listen-port`) and the fallback log. `None`: dial only.
    pub(crate) listen: Option<(SocketAddr, reuse::ReuseLog)>,
    /// What direct connections count (used even when off: refusals).
    pub(crate) metrics: crate::metrics::DirectMetrics,
    /// Pauses between punches to one peer after failures (least, most).
    pub(crate) punch_backoff: crate::direct::Backoffs,
    /// Inbound direct handshakes at once: in total, from one source (the
    /// listener's handshake table, `handshakes.rs`).
    pub(crate) max_pending_inbound: (usize, usize),
    /// `TCP_USER_TIMEOUT` of the listening port's sockets, when listening.
    pub(crate) tcp_user_timeout: Option<std::time::Duration>,
    /// Every QUIC connection's idle timeout (zero: libp2p's, 10 s).
    pub(crate) quic_idle_timeout: Duration,
    /// How long the peer of a direct connection has to authenticate.
    pub(crate) auth_timeout: Duration,
    /// Punches may dial loopback (`--direct-allow-loopback-targets`).
    pub(crate) loopback_targets: bool,
    /// `--direct-transport=quic`: the listening socket is QUIC's, not TCP's.
    pub(crate) quic: bool,
    /// Direct connections to members open at once.
    pub(crate) max_connections: usize,
}

/// Plain TCP: dial-only [`DialTcp`], or with `reuse` [`reuse::ReuseTcp`]
/// for IP addresses ([`DialTcp`] still resolving `/dns` ones).
fn tcp(
    source_ip: Option<IpAddr>,
    reuse: Option<Reuse>,
) -> libp2p::core::transport::Boxed<libp2p::tcp::tokio::TcpStream> {
    let dial = DialTcp { source_ip };
    match reuse {
        None => dial.boxed(),
        Some(r) => reuse::ReuseTcp::new(source_ip, r.log, r.fallbacks)
            .with_user_timeout(r.user_timeout)
            .with_adopted(r.adopted)
            .or_transport(dial)
            .map(|s, _| s.into_inner())
            .map_err(|e| e.into_inner())
            .boxed(),
    }
}

/// How the member's QUIC runs.
#[derive(Clone, Copy, Debug)]
struct Quic {
    /// It listens (`--direct-transport=quic`), else dials only.
    listens: bool,
    /// See [`quic_config`].
    idle_timeout: Duration,
}

/// libp2p's QUIC config with `idle_timeout` (zero: libp2p's 10 s): a
/// connection that hears nothing from its peer for that long is closed,
/// which is how a dead QUIC path is noticed (the TCP user timeout's
/// counterpart; `direct::close_reason` counts it `timed_out`). quinn then
/// sends a keep-alive every half of it, so an idle path that still carries
/// bytes is never taken for a dead one.
pub(crate) fn quic_config(key: &Keypair, idle_timeout: Duration) -> libp2p::quic::Config {
    let mut c = libp2p::quic::Config::new(key);
    if !idle_timeout.is_zero() {
        let idle = idle_timeout.max(crate::config::MIN_TIMEOUT);
        c.max_idle_timeout = u32::try_from(idle.as_millis()).unwrap_or(u32::MAX);
        c.keep_alive_interval = idle / 2;
    }
    c
}

/// `t` with noise and the member's yamux, boxed.
fn upgraded<T>(t: T, noise: noise::Config, yamux: muxer::YamuxUpgrade) -> Direct
where
    T: Transport + Send + Unpin + 'static,
    T::Output: futures::AsyncRead + futures::AsyncWrite + Unpin + Send + 'static,
    T::Error: Send + Sync + 'static,
    T::Dial: Send + 'static,
    T::ListenerUpgrade: Send + 'static,
{
    t.upgrade(Version::V1Lazy)
        .authenticate(noise)
        .multiplex(yamux)
        .map(|(p, m), _| (p, StreamMuxerBox::new(m)))
        .boxed()
}

/// TCP (with the relay client's transport) or QUIC, upgraded; and the
/// relay client behaviour paired with it.
/// `yamux` is the member's bounded yamux for TCP and relayed connections
/// alike (QUIC has its own flow control). `handshakes`, given when the
/// member listens, guards the listening transport (TCP with `reuse`, or
/// QUIC listening): each inbound connection is admitted to its
/// handshake as it is accepted ([`handshakes`]). Dial-only transports and
/// the relay client's, whose inbound circuits come over a router's
/// connection, are not guarded.
fn direct(
    key: &Keypair,
    source_ip: Option<IpAddr>,
    reuse: Option<Reuse>,
    quic: Quic,
    yamux: muxer::YamuxUpgrade,
    handshakes: Option<&agentmesh_fair::handshakes::Handshakes>,
) -> Result<(Direct, relay::client::Behaviour), noise::Error> {
    let peer_id = key.public().to_peer_id();
    let noise = noise::Config::new(key)?;
    let (relay_transport, relay_client) = relay::client::new(peer_id);
    let relayed = upgraded(relay_transport, noise.clone(), yamux.clone());
    let tcp_listens = reuse.is_some();
    let raw = tcp(source_ip, reuse);
    let tcp = match handshakes.filter(|_| tcp_listens) {
        // Progress watched on the raw socket, under noise.
        Some(h) => h
            .tcp(raw, |watched| upgraded(watched, noise, yamux))
            .boxed(),
        None => upgraded(raw, noise, yamux),
    };
    // QUIC (dial only, from the source IP when given): routers may announce
    // it beside TCP (the swarm dials both at once; the first handshake wins).
    // Listening with `--direct-transport=quic` (routers then dialled over
    // QUIC where they offer it: `select::direct_attach_addrs`).
    let quic = if quic.listens {
        let listening = quic::DialQuic::listening(quic_config(key, quic.idle_timeout))
            .map(|(p, c), _| (p, StreamMuxerBox::new(c)));
        match handshakes {
            // Its packets share one socket: handshakes give way oldest first.
            Some(h) => h.guard(listening).boxed(),
            None => listening.boxed(),
        }
    } else {
        quic::DialQuic::new(quic_config(key, quic.idle_timeout), source_ip)
            .map(|(p, c), _| (p, StreamMuxerBox::new(c)))
            .boxed()
    };
    let direct = relayed
        .or_transport(tcp)
        .map(|either, _| either.into_inner())
        .or_transport(quic)
        .map(|either, _| either.into_inner())
        .boxed();
    Ok((direct, relay_client))
}

/// The yamux receive-window limits the connection section asks for.
pub(crate) fn window_limits(config: &crate::config::ConnectionConfig) -> WindowLimits {
    WindowLimits {
        max_streams: config.yamux_max_streams,
        connection_window_bytes: config.yamux_connection_window_kib.saturating_mul(1024),
    }
}

/// The yamux upgrade of a member with `connections`: its receive-window
/// limits and inbound-stream buffer (drops counted nowhere). For the
/// ladder's bench, whose bare libp2p floor must mux as a member does.
pub(crate) fn member_yamux(
    connections: &crate::config::ConnectionConfig,
) -> Result<muxer::YamuxUpgrade, muxer::LimitsError> {
    muxer::yamux_upgrade(window_limits(connections), Counter::default())
}

/// Builds the node's swarm from its config, `yamux_inbound_streams_dropped`
/// counting in `metrics`.
pub(crate) async fn build(
    config: &crate::config::Config,
    key: &Keypair,
    metrics: &crate::metrics::Metrics,
) -> Result<Swarm<Behaviour>, crate::SpawnError> {
    use crate::config::MIN_TIMEOUT;
    let yamux_dropped = metrics
        .yamux_inbound_streams_dropped
        .get_or_create(&crate::metrics::ReasonLabel {
            reason: "buffer_full",
        })
        .clone();
    let dialing = Dialing {
        source_ip: config.connections.dial_source_ip,
        listen: config.direct.enabled.then(|| {
            let at = SocketAddr::new(config.direct.listen_ip, config.direct.listen_port);
            (at, reuse::ReuseLog::default())
        }),
        metrics: metrics.direct.clone(),
        punch_backoff: crate::direct::Backoffs {
            min: config.direct.punch_backoff_min,
            max: config.direct.punch_backoff_max,
        },
        max_pending_inbound: (
            config.direct.max_pending_inbound,
            config.direct.max_pending_inbound_per_source,
        ),
        tcp_user_timeout: Some(config.direct.tcp_user_timeout).filter(|d| !d.is_zero()),
        quic_idle_timeout: config.direct.quic_idle_timeout,
        auth_timeout: config.direct.auth_timeout,
        loopback_targets: config.direct.allow_loopback_targets,
        quic: config.direct.transport == crate::config::DirectTransport::Quic,
        max_connections: config.direct.max_connections,
    };
    build_swarm(
        key,
        dialing,
        config.connect_timeout(),
        config.connections.idle.max(MIN_TIMEOUT),
        ping::Config::new()
            .with_interval(config.connections.ping_interval.max(MIN_TIMEOUT))
            .with_timeout(config.connections.ping_timeout.max(MIN_TIMEOUT)),
        agentmesh_streams::Config {
            inbound_queue_per_protocol: config.connections.stream_inbound_queue_per_protocol,
        },
        agentmesh_streams::PendingOpenLimits {
            max_pending_opens_per_peer: config.connections.stream_max_pending_opens_per_peer,
            max_pending_opens_total: config.connections.stream_max_pending_opens_total,
        },
        window_limits(&config.connections),
        yamux_dropped,
    )
    .await
    .map_err(|e| crate::SpawnError::Swarm(e.to_string()))
}

/// A dial that ran past the connect timeout as an `io::Error` of kind
/// `TimedOut`, other errors unchanged: the engine tells a timeout from a
/// failed route by that kind (`engine::connect::dial_failure`), where the
/// timeout's own error type is lost in the boxing.
fn timed_out_as_io<E>(e: TransportTimeoutError<E>) -> std::io::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    match e {
        TransportTimeoutError::Timeout => {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
        }
        other => std::io::Error::other(other),
    }
}

/// Builds the swarm for `key`. `idle` closes connections without streams or
/// reservations after that long (transit connections, finished circuits).
///
/// `/dns4`, `/dns6` and `/dns` addresses (routers announcing names, e.g. a
/// Kubernetes Service) are resolved by libp2p's DNS transport, for TCP and
/// QUIC alike and inside the connect timeout; it reads the system's
/// resolver configuration, so this runs on a blocking thread. Without one,
/// the node goes on without it (TCP dials still resolve names themselves).
/// `streams` bounds the inbound queues of our own protocols, `pending` the
/// opens waiting for a dial; `yamux` the receive window of every TCP and
/// relayed connection, `yamux_dropped` counts inbound streams dropped
/// past the muxer's buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn build_swarm(
    key: &Keypair,
    dialing: Dialing,
    connect_timeout: Duration,
    idle: Duration,
    ping: ping::Config,
    streams: agentmesh_streams::Config,
    pending: agentmesh_streams::PendingOpenLimits,
    yamux: WindowLimits,
    yamux_dropped: Counter,
) -> Result<Swarm<Behaviour>, BuildError> {
    let peer_id = key.public().to_peer_id();
    let k = key.clone();
    let upgrade = muxer::yamux_upgrade(yamux, yamux_dropped)?;
    tracing::debug!(?yamux, "yamux limits");
    let source_ip = dialing.source_ip;
    let quic = Quic {
        listens: dialing.quic && dialing.listen.is_some(),
        idle_timeout: dialing.quic_idle_timeout,
    };
    let reuse = dialing
        .listen
        .as_ref()
        .filter(|_| !quic.listens)
        .map(|(_, log)| Reuse {
            log: log.clone(),
            fallbacks: dialing.metrics.port_reuse_fallbacks.clone(),
            user_timeout: dialing.tcp_user_timeout,
            adopted: dialing.metrics.port_reuse_adopted.clone(),
        });
    // One table for the listener's handshakes (`handshakes.rs`).
    let handshakes = dialing.listen.as_ref().map(|_| {
        let (total, per_source) = dialing.max_pending_inbound;
        handshakes::table(total, per_source, dialing.metrics.clone())
    });
    let (transport, relay_client) = tokio::task::spawn_blocking(move || {
        let (inner, relay_client) = direct(
            &k,
            source_ip,
            reuse.clone(),
            quic,
            upgrade.clone(),
            handshakes.as_ref(),
        )?;
        let transport = match libp2p::dns::tokio::Transport::system(inner) {
            Ok(dns) => TransportTimeout::new(dns, connect_timeout)
                .map_err(timed_out_as_io)
                .boxed(),
            Err(e) => {
                tracing::warn!(error = %e, "no system DNS configuration: /dns addresses are dialed over TCP only");
                // `system` consumed the first transport: make another.
                let (inner, relay_client) = direct(
                    &k,
                    source_ip,
                    reuse,
                    quic,
                    upgrade,
                    handshakes.as_ref(),
                )?;
                return Ok::<_, BuildError>((
                    TransportTimeout::new(inner, connect_timeout)
                        .map_err(timed_out_as_io)
                        .boxed(),
                    relay_client,
                ));
            }
        };
        Ok((transport, relay_client))
    })
    .await??;
    let stream = agentmesh_streams::Behaviour::with_limits(streams, pending);
    let behaviour = Behaviour {
        direct: crate::direct::Behaviour::new(
            peer_id,
            dialing.listen.is_some(),
            dialing.metrics.clone(),
            dialing
                .listen
                .as_ref()
                .map(|(_, log)| log.clone())
                .unwrap_or_default(),
        )
        .with_backoff(dialing.punch_backoff)
        .with_loopback_targets(dialing.loopback_targets)
        .with_auth_timeout(dialing.auth_timeout)
        .with_quic(quic.listens)
        .with_max_connections(dialing.max_connections)
        .with_streams(stream.new_control()),
        relay: relay_client,
        stream,
        ping: ping::Behaviour::new(ping),
    };
    let mut swarm = Swarm::new(transport, behaviour, peer_id, swarm_config(idle));
    if let Some((mut at, _)) = dialing.listen {
        let addr = if quic.listens {
            // QUIC dials leave from the listening socket: with
            // `--dial-source-ip` and no `--listen-ip`, bind the source IP.
            if let (true, Some(ip)) = (at.ip().is_unspecified(), source_ip) {
                at.set_ip(ip);
            }
            crate::direct::quic_multiaddr(at)
        } else {
            reuse::tcp_multiaddr(at)
        };
        // Bound here, so a taken port fails the start.
        swarm
            .listen_on(addr)
            .map_err(|e| BuildError::Listen(at, e.to_string()))?;
        tracing::debug!(%at, quic = quic.listens, "listening for direct connections");
    }
    Ok(swarm)
}

/// The swarm's settings. Streams the member opens negotiate their protocol
/// optimistically (multistream-select `V1Lazy`): the protocol's name goes
/// out with the first bytes written, not a round trip earlier. A member
/// opens streams only to routers and members, which speak all of its
/// protocols (auth, catalog, calls, relay HOP, ping), so waiting for the
/// confirmation only costs time, and under load it cost more than a
/// router's `--auth-first-byte-timeout-ms`: a slow member looked like a
/// silent stranger and its source's failed logins grew. Sent this way,
/// the request reaches the router with the stream. A peer lacking a
/// protocol fails the first read rather than the open; nothing on the
/// member tells those apart.
fn swarm_config(idle: Duration) -> libp2p::swarm::Config {
    libp2p::swarm::Config::with_tokio_executor()
        .with_idle_connection_timeout(idle)
        .with_substream_upgrade_protocol_override(Version::V1Lazy)
}

#[cfg(test)]
mod tests_direct;
#[cfg(test)]
mod tests_handshakes;
#[cfg(test)]
mod tests_optimistic;
#[cfg(test)]
mod tests_quic_idle;
