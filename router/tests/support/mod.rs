//! Test harness: a real control plane, routers started through `spawn`, and
//! a raw libp2p test peer (TCP + noise + yamux, relay client, streams) that
//! speaks the router's protocols by hand.

#![allow(dead_code)]

pub(crate) mod cp;

use std::time::Duration;

use agentmesh_proto::framing::{read_frame, write_frame};
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{
    AuthRequest, AuthResponse, CatalogRequest, CatalogResponse, Purpose,
};
use agentmesh_proto::protocols::{AUTH, CATALOG, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES};
use futures::{AsyncWriteExt, StreamExt};
use libp2p::identity::Keypair;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder, noise, relay, tcp, yamux};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Generous deadline for every wait in these tests.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// Installs a test log subscriber once (`RUST_LOG` filters it).
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,integration=info,agentmesh_router=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `f` every 100 ms until it returns `Some`, panicking after [`DEADLINE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of one metric line (`name{labels}`) in Prometheus text, or 0.
pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == series).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub(crate) struct PeerBehaviour {
    relay: relay::client::Behaviour,
    stream: libp2p_stream::Behaviour,
}

/// What the test peer's swarm reported.
#[derive(Debug, Clone)]
pub(crate) enum Ev {
    Connected { peer: PeerId, relayed: bool },
    Closed { peer: PeerId, remaining: u32 },
    ListenAddr(Multiaddr),
    ListenerClosed(String),
    Other,
}

type Cmd = Box<dyn FnOnce(&mut Swarm<PeerBehaviour>) + Send>;

/// A raw libp2p peer driven from the test.
pub(crate) struct TestPeer {
    pub(crate) key: Keypair,
    pub(crate) peer_id: PeerId,
    control: libp2p_stream::Control,
    cmd: mpsc::Sender<Cmd>,
    events: mpsc::Receiver<Ev>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestPeer {
    /// A fresh peer with a new key.
    pub(crate) fn new() -> Self {
        Self::with_key(Keypair::generate_ed25519())
    }

    /// A peer with `key`.
    pub(crate) fn with_key(key: Keypair) -> Self {
        let mut swarm = SwarmBuilder::with_existing_identity(key.clone())
            .with_tokio()
            .with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                yamux::Config::default,
            )
            .expect("tcp")
            // Members dial routers announced by name (`/dns4/...`).
            .with_dns()
            .expect("dns")
            .with_relay_client(noise::Config::new, yamux::Config::default)
            .expect("relay client")
            .with_behaviour(|_, relay| PeerBehaviour {
                relay,
                stream: libp2p_stream::Behaviour::new(),
            })
            .expect("behaviour")
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        let control = swarm.behaviour().stream.new_control();
        let (cmd_tx, mut cmd_rx) = mpsc::channel::<Cmd>(64);
        let (ev_tx, ev_rx) = mpsc::channel(4096);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = swarm.select_next_some() => {
                        let ev = match ev {
                            SwarmEvent::ConnectionEstablished { peer_id, endpoint, .. } => Ev::Connected {
                                peer: peer_id,
                                relayed: endpoint.is_relayed(),
                            },
                            SwarmEvent::ConnectionClosed { peer_id, num_established, .. } => Ev::Closed {
                                peer: peer_id,
                                remaining: num_established,
                            },
                            SwarmEvent::NewListenAddr { address, .. } => Ev::ListenAddr(address),
                            SwarmEvent::ListenerClosed { reason, .. } => Ev::ListenerClosed(format!("{reason:?}")),
                            _ => Ev::Other,
                        };
                        if !matches!(ev, Ev::Other) {
                            let _ = ev_tx.try_send(ev);
                        }
                    }
                    cmd = cmd_rx.recv() => match cmd {
                        Some(c) => c(&mut swarm),
                        None => break,
                    }
                }
            }
        });
        Self {
            peer_id: key.public().to_peer_id(),
            key,
            control,
            cmd: cmd_tx,
            events: ev_rx,
            task,
        }
    }

    /// Runs `f` on the swarm and returns its result.
    pub(crate) async fn with_swarm<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Swarm<PeerBehaviour>) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Box::new(move |s| {
                let _ = tx.send(f(s));
            }))
            .await
            .expect("peer task alive");
        rx.await.expect("peer task answered")
    }

    /// Dials `addr` and waits until connected to `peer`.
    pub(crate) async fn connect(&mut self, peer: PeerId, addr: Multiaddr) {
        self.with_swarm(move |s| s.dial(addr).expect("dial")).await;
        self.wait(
            &format!("connected to {peer}"),
            |e| matches!(e, Ev::Connected { peer: p, .. } if *p == peer),
        )
        .await;
    }

    /// Waits for an event matching `f`.
    pub(crate) async fn wait(&mut self, what: &str, f: impl Fn(&Ev) -> bool) -> Ev {
        let end = Instant::now() + DEADLINE;
        loop {
            match tokio::time::timeout_at(end, self.events.recv()).await {
                Ok(Some(e)) if f(&e) => return e,
                Ok(Some(_)) => {}
                Ok(None) => panic!("peer task ended while waiting for: {what}"),
                Err(_) => panic!("timed out waiting for: {what}"),
            }
        }
    }

    /// Whether the swarm is connected to `peer`.
    pub(crate) async fn is_connected(&self, peer: PeerId) -> bool {
        self.with_swarm(move |s| s.is_connected(&peer)).await
    }

    /// Sends an auth request and returns the router's answer.
    pub(crate) async fn auth(
        &self,
        router: PeerId,
        credential: Option<Credential>,
        purpose: Purpose,
    ) -> AuthResponse {
        let req = AuthRequest {
            credential,
            purpose: purpose as i32,
            attached_routers: vec![],
        };
        let mut s = self
            .control
            .clone()
            .open_stream(router, StreamProtocol::new(AUTH))
            .await
            .expect("open auth stream");
        write_frame(&mut s, &req).await.expect("write auth");
        let resp = read_frame(&mut s, MAX_FRAME_BYTES)
            .await
            .expect("read auth");
        let _ = s.close().await;
        resp
    }

    /// Tries to open a stream of `protocol`; the error names why not.
    pub(crate) async fn try_open(
        &self,
        peer: PeerId,
        protocol: &'static str,
    ) -> Result<(), String> {
        self.control
            .clone()
            .open_stream(peer, StreamProtocol::new(protocol))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Sends raw bytes on a new auth stream and reads whatever comes back.
    pub(crate) async fn auth_raw(&self, router: PeerId, bytes: &[u8]) -> Vec<u8> {
        use futures::AsyncReadExt;
        let mut s = self
            .control
            .clone()
            .open_stream(router, StreamProtocol::new(AUTH))
            .await
            .expect("open auth stream");
        s.write_all(bytes).await.expect("write");
        let _ = s.close().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut out)).await;
        out
    }

    /// Sends a catalog request and returns the answer.
    pub(crate) async fn catalog(&self, router: PeerId, req: CatalogRequest) -> CatalogResponse {
        let mut s = self
            .control
            .clone()
            .open_stream(router, StreamProtocol::new(CATALOG))
            .await
            .expect("open catalog stream");
        write_frame(&mut s, &req).await.expect("write catalog");
        let resp = read_frame(&mut s, MAX_CATALOG_FRAME_BYTES)
            .await
            .expect("read catalog");
        let _ = s.close().await;
        resp
    }

    /// Accepts streams of `protocol` and echoes them (for relayed calls).
    pub(crate) fn serve_echo(&self, protocol: &'static str) -> tokio::task::JoinHandle<()> {
        let mut incoming = self
            .control
            .clone()
            .accept(StreamProtocol::new(protocol))
            .expect("register echo");
        tokio::spawn(async move {
            while let Some((_, mut s)) = incoming.next().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = futures::AsyncReadExt::split(&mut s);
                    let _ = futures::io::copy(&mut r, &mut w).await;
                });
            }
        })
    }

    /// Opens a `protocol` stream to `peer`, writes `data` while reading it
    /// back (both at once, so flow-control windows never deadlock).
    pub(crate) async fn echo(&self, peer: PeerId, protocol: &'static str, data: &[u8]) -> Vec<u8> {
        use futures::AsyncReadExt;
        let s = self
            .control
            .clone()
            .open_stream(peer, StreamProtocol::new(protocol))
            .await
            .expect("open echo stream");
        let (mut r, mut w) = s.split();
        let mut out = vec![0u8; data.len()];
        let write = async {
            w.write_all(data).await.expect("write");
            w.flush().await.expect("flush");
        };
        let read = async { r.read_exact(&mut out).await.expect("read back") };
        futures::join!(write, read);
        out
    }
}
