//! The bare rust-libp2p floors: a swarm with the transport stack our
//! programs use (TCP with `TCP_NODELAY` + noise + yamux, libp2p's default
//! yamux settings; the relay client's transport beside it) and raw streams
//! from `libp2p-stream`, no agentmesh logic; or, for the direct floor
//! like for like with a member ([`Mux::Member`]), the member's own yamux
//! with its window and buffer limits in place of libp2p-yamux). One swarm type serves every
//! role: a listener (direct, or reachable through a relay circuit; serving
//! the bench protocol, or splicing each stream to TCP), a relay v2 server
//! with its limits lifted, and a dialer (the client, or the forwarder).

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;
use libp2p::core::multiaddr::Protocol;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, noise, relay, tcp, yamux};
use tokio::sync::mpsc;

/// The raw stream protocol of the bench.
pub(super) const PROTOCOL: StreamProtocol = StreamProtocol::new("/agentmesh-bench/1");
/// Connections stay open while the bench runs, streams or not.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Every role's behaviours; the relay server only in the relay role.
#[derive(NetworkBehaviour)]
pub(super) struct Behaviour {
    stream: libp2p_stream::Behaviour,
    relay_client: relay::client::Behaviour,
    relay: Toggle<relay::Behaviour>,
}

/// Relay v2 server limits lifted: no rate limits, no byte or time cap
/// worth the name, room for every circuit the bench opens.
fn relay_config() -> relay::Config {
    relay::Config {
        max_reservations: 1024,
        max_reservations_per_peer: 64,
        reservation_duration: IDLE_TIMEOUT,
        reservation_rate_limiters: Vec::new(),
        max_circuits: 1024,
        max_circuits_per_peer: 1024,
        max_circuit_duration: IDLE_TIMEOUT,
        max_circuit_bytes: 0,
        circuit_src_rate_limiters: Vec::new(),
    }
}

/// The stream muxer of a bare swarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Mux {
    /// libp2p-yamux with its defaults (the floors recorded since issue 19).
    #[default]
    Libp2p,
    /// The muxer a member puts on its connections
    /// ([`agentmesh_node::member_yamux`]: the yamux crate behind
    /// agentmesh-streams' upgrade, the member's default receive-window
    /// limits and inbound-stream buffer): the direct floor like for like.
    Member,
}

/// Builds a swarm; `relay_server` adds the relay v2 server behaviour.
pub(super) fn swarm(relay_server: bool, mux: Mux) -> anyhow::Result<Swarm<Behaviour>> {
    match mux {
        Mux::Libp2p => libp2p_swarm(relay_server),
        Mux::Member => member_swarm(relay_server),
    }
}

/// Every role's behaviours for `key`.
fn behaviour(
    key: &libp2p::identity::Keypair,
    relay_client: relay::client::Behaviour,
    relay_server: bool,
) -> Behaviour {
    Behaviour {
        stream: libp2p_stream::Behaviour::new(),
        relay_client,
        relay: Toggle::from(
            relay_server.then(|| relay::Behaviour::new(key.public().to_peer_id(), relay_config())),
        ),
    }
}

/// The same transports as [`libp2p_swarm`] (TCP with `TCP_NODELAY` and
/// the relay client's, each upgraded with noise and a muxer), the muxer
/// the member's.
fn member_swarm(relay_server: bool) -> anyhow::Result<Swarm<Behaviour>> {
    use libp2p::core::Transport as _;
    use libp2p::core::muxing::StreamMuxerBox;
    use libp2p::core::upgrade::Version;
    let key = libp2p::identity::Keypair::generate_ed25519();
    let me = key.public().to_peer_id();
    let mux = agentmesh_node::member_yamux(&agentmesh_node::config::ConnectionConfig::default())
        .map_err(|e| anyhow::anyhow!("the member's yamux: {e}"))?;
    let (relay_transport, relay_client) = relay::client::new(me);
    let transport = relay_transport
        .or_transport(tcp::tokio::Transport::new(
            tcp::Config::default().nodelay(true),
        ))
        .upgrade(Version::V1Lazy)
        .authenticate(noise::Config::new(&key)?)
        .multiplex(mux)
        .map(|(p, m), _| (p, StreamMuxerBox::new(m)))
        .boxed();
    Ok(Swarm::new(
        transport,
        behaviour(&key, relay_client, relay_server),
        me,
        libp2p::swarm::Config::with_tokio_executor().with_idle_connection_timeout(IDLE_TIMEOUT),
    ))
}

/// A swarm from libp2p's builder with libp2p-yamux's defaults.
fn libp2p_swarm(relay_server: bool) -> anyhow::Result<Swarm<Behaviour>> {
    let swarm = libp2p::SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )?
        .with_relay_client(noise::Config::new, yamux::Config::default)?
        .with_behaviour(|key, relay_client| behaviour(key, relay_client, relay_server))
        .map_err(|e| anyhow::anyhow!("behaviour: {e}"))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(IDLE_TIMEOUT))
        .build();
    Ok(swarm)
}

/// A stream control for opening and accepting raw streams.
pub(super) fn control(swarm: &Swarm<Behaviour>) -> libp2p_stream::Control {
    swarm.behaviour().stream.new_control()
}

/// What a driven swarm reports: its listen addresses (with `/p2p/ID`) and
/// connections.
#[derive(Debug)]
pub(super) enum Event {
    /// A new listen address, `/p2p/<own id>` appended.
    Listening(Multiaddr),
    /// A connection to `peer` is up.
    Connected(PeerId),
    /// A dial or listener failed.
    Failed(String),
}

/// Polls `swarm` for ever on a task, reporting [`Event`]s on the channel
/// (bounded; a slow reader only delays reports, never the data path,
/// which runs on the streams). The relay role announces its listen
/// addresses as external, so reservations carry them.
pub(super) fn drive(mut swarm: Swarm<Behaviour>, relay_server: bool) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(64);
    let me = *swarm.local_peer_id();
    tokio::spawn(async move {
        loop {
            let report = match swarm.select_next_some().await {
                SwarmEvent::NewListenAddr { address, .. } => {
                    if relay_server {
                        swarm.add_external_address(address.clone());
                    }
                    // Circuit addresses already end in our id; direct ones do not.
                    let full = if matches!(address.iter().last(), Some(Protocol::P2p(_))) {
                        address
                    } else {
                        address.with(Protocol::P2p(me))
                    };
                    Some(Event::Listening(full))
                }
                SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                    Some(Event::Connected(peer_id))
                }
                SwarmEvent::OutgoingConnectionError { error, .. } => {
                    Some(Event::Failed(format!("dial: {error}")))
                }
                SwarmEvent::ListenerClosed { reason, .. } => {
                    Some(Event::Failed(format!("listener closed: {reason:?}")))
                }
                _ => None,
            };
            if let Some(r) = report {
                // Nobody listening any more is fine: the swarm keeps serving.
                let _ = tx.try_send(r);
            }
        }
    });
    rx
}

/// Waits for the first event `want` accepts, failing on [`Event::Failed`]
/// or when `deadline` passes.
pub(super) async fn wait_for<T>(
    events: &mut mpsc::Receiver<Event>,
    deadline: Duration,
    mut want: impl FnMut(&Event) -> Option<T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(deadline, async {
        while let Some(e) = events.recv().await {
            if let Some(t) = want(&e) {
                return Ok(t);
            }
            if let Event::Failed(why) = e {
                anyhow::bail!("{why}");
            }
        }
        anyhow::bail!("swarm task ended")
    })
    .await
    .map_err(|_| anyhow::anyhow!("no such swarm event within {deadline:?}"))?
}

/// Serves every inbound raw stream with the bench protocol, each on a task.
pub(super) fn serve_streams(control: libp2p_stream::Control) -> anyhow::Result<()> {
    on_each_stream(control, |stream| async move {
        if let Err(e) = super::proto::serve(stream).await {
            tracing::warn!(error = %e, "bench stream failed");
        }
    })
}

/// Splices every inbound raw stream with a new TCP connection to
/// `backend`, each on a task, as a node's `--expose` serves a call: connect
/// once the stream is in, `TCP_NODELAY`, then [`super::peer::splice`].
pub(super) fn splice_streams(
    control: libp2p_stream::Control,
    backend: SocketAddr,
) -> anyhow::Result<()> {
    on_each_stream(control, move |mut stream| async move {
        let mut tcp = match tokio::net::TcpStream::connect(backend).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "connecting to the backend failed");
                return;
            }
        };
        let _ = tcp.set_nodelay(true);
        if let Err(e) = super::proto::splice(&mut stream, &mut tcp).await {
            tracing::debug!(error = %e, "spliced stream ended with an error");
        }
    })
}

/// Accepts the bench protocol's inbound raw streams and hands each to
/// `handle` on a task of its own.
fn on_each_stream<F, Fut>(mut control: libp2p_stream::Control, handle: F) -> anyhow::Result<()>
where
    F: Fn(tokio_util::compat::Compat<libp2p::Stream>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio_util::compat::FuturesAsyncReadCompatExt as _;
    let mut incoming = control
        .accept(PROTOCOL)
        .map_err(|e| anyhow::anyhow!("accept: {e}"))?;
    tokio::spawn(async move {
        while let Some((_peer, stream)) = incoming.next().await {
            tokio::spawn(handle(stream.compat()));
        }
    });
    Ok(())
}

/// The peer an address ends in (`…/p2p/ID`).
pub(super) fn last_peer(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().fold(None, |last, p| match p {
        Protocol::P2p(id) => Some(id),
        _ => last,
    })
}
