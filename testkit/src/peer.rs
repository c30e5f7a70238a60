//! A raw libp2p peer (TCP + DNS + noise + yamux, relay client, streams)
//! driven from the test. It speaks auth, catalog, call and go-away by hand,
//! so tests can present any credential, send malformed frames, and watch
//! connection events the way a member's swarm would see them.

use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{
    AuthRequest, AuthResponse, CallRequest, CallResponse, CatalogRequest, CatalogResponse, GoAway,
    GoAwayAck, GoAwayReason, Purpose,
};
use agentmesh_proto::protocols::{
    AUTH, CALL, CATALOG, GOAWAY, MAX_CATALOG_FRAME_BYTES, MAX_FRAME_BYTES,
};
use agentmesh_wire::frame::{read_frame, write_frame};
use futures::{AsyncReadExt as _, AsyncWriteExt as _, StreamExt as _};
use libp2p::identity::Keypair;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder, noise, relay, tcp, yamux};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::DEADLINE;

/// The test peer's behaviour: a relay client (to reach members through a
/// router's circuit) and raw streams. Public so tests can drive the swarm
/// through [`TestPeer::with_swarm`].
#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub struct PeerBehaviour {
    relay: relay::client::Behaviour,
    stream: agentmesh_streams::Behaviour,
}

/// What the test peer's swarm reported.
#[derive(Debug, Clone)]
pub enum Ev {
    /// A connection to `peer` was established (through a relay if `relayed`).
    Connected {
        /// The remote peer.
        peer: PeerId,
        /// Whether it runs over a relay circuit.
        relayed: bool,
    },
    /// A connection to `peer` closed; `remaining` are still open.
    Closed {
        /// The remote peer.
        peer: PeerId,
        /// Connections to it still established.
        remaining: u32,
    },
    /// The swarm listens on this address (e.g. a relay reservation).
    ListenAddr(Multiaddr),
    /// A listener closed, with the reason (debug-formatted).
    ListenerClosed(String),
    /// A dial to `peer` failed, with the error (display-formatted).
    DialFailed {
        /// The peer dialed, if the dial named one.
        peer: Option<PeerId>,
        /// What went wrong.
        error: String,
    },
    /// Anything else (never queued).
    Other,
}

type Cmd = Box<dyn FnOnce(&mut Swarm<PeerBehaviour>) + Send>;
/// A freeze request: confirm on the first, resume when the second resolves.
type FreezeReq = (oneshot::Sender<()>, oneshot::Receiver<()>);

/// While held, the peer's swarm is not polled (see [`TestPeer::freeze`]).
pub struct Frozen(#[allow(dead_code)] oneshot::Sender<()>);

/// A raw libp2p peer driven from the test; its swarm runs in a task that
/// is aborted on drop, and connection events queue (bounded) for [`Self::wait`].
pub struct TestPeer {
    /// The peer's identity key (to enroll it and sign with it).
    pub key: Keypair,
    /// Its peer id.
    pub peer_id: PeerId,
    control: agentmesh_streams::Control,
    cmd: mpsc::Sender<Cmd>,
    freeze: mpsc::Sender<FreezeReq>,
    events: mpsc::Receiver<Ev>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Default for TestPeer {
    fn default() -> Self {
        Self::new()
    }
}

impl TestPeer {
    /// A fresh peer with a new key.
    pub fn new() -> Self {
        Self::with_key(Keypair::generate_ed25519())
    }

    /// A peer with `key`.
    pub fn with_key(key: Keypair) -> Self {
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
                stream: agentmesh_streams::Behaviour::new(),
            })
            .expect("behaviour")
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        let control = swarm.behaviour().stream.new_control();
        let (cmd_tx, mut cmd_rx) = mpsc::channel::<Cmd>(64);
        let (freeze_tx, mut freeze_rx) = mpsc::channel::<FreezeReq>(1);
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
                            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => Ev::DialFailed {
                                peer: peer_id,
                                error: error.to_string(),
                            },
                            _ => Ev::Other,
                        };
                        if !matches!(ev, Ev::Other) {
                            let _ = ev_tx.try_send(ev);
                        }
                    }
                    cmd = cmd_rx.recv() => match cmd {
                        Some(c) => c(&mut swarm),
                        None => break,
                    },
                    Some((frozen, until)) = freeze_rx.recv() => {
                        let _ = frozen.send(());
                        // Either outcome (released or dropped) resumes.
                        let _ = until.await;
                    }
                }
            }
        });
        Self {
            peer_id: key.public().to_peer_id(),
            key,
            control,
            cmd: cmd_tx,
            freeze: freeze_tx,
            events: ev_rx,
            task,
        }
    }

    /// A fresh peer enrolled with `token` at `cp` and then connected to
    /// `router`, with its credential: how router tests get a member that
    /// can present a valid credential.
    #[cfg(feature = "router")]
    pub async fn enrolled_and_connected(
        cp: &crate::Cp,
        token: &str,
        router: &crate::TestRouter,
    ) -> (Self, Credential) {
        let mut peer = Self::new();
        let credential = cp.enroll(token, &peer.key).await;
        peer.connect(router.id(), router.addr.clone()).await;
        (peer, credential)
    }

    /// Runs `f` on the swarm and returns its result.
    pub async fn with_swarm<T: Send + 'static>(
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

    /// Stops polling the peer's swarm until the returned guard drops: its
    /// connections stay open but it answers nothing (a member too busy to
    /// answer, e.g. the destination of circuits whose handshakes must stay
    /// in flight). Returns once the swarm task is frozen.
    pub async fn freeze(&self) -> Frozen {
        let (frozen_tx, frozen_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        self.freeze
            .send((frozen_tx, resume_rx))
            .await
            .expect("peer task alive");
        frozen_rx.await.expect("peer task froze");
        Frozen(resume_tx)
    }

    /// Dials `to` through the relay `circuit` (`…/p2p/RELAY/p2p-circuit`):
    /// a new circuit each time, even when one to `to` exists.
    pub async fn dial_through(&self, circuit: &Multiaddr, to: PeerId) {
        let addr = circuit.clone().with(libp2p::multiaddr::Protocol::P2p(to));
        self.with_swarm(move |s| {
            s.dial(
                libp2p::swarm::dial_opts::DialOpts::peer_id(to)
                    .addresses(vec![addr])
                    .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
                    .build(),
            )
            .expect("dial through relay")
        })
        .await;
    }

    /// Dials `addr` and waits until connected to `peer`.
    pub async fn connect(&mut self, peer: PeerId, addr: Multiaddr) {
        self.with_swarm(move |s| s.dial(addr).expect("dial")).await;
        self.wait(
            &format!("connected to {peer}"),
            |e| matches!(e, Ev::Connected { peer: p, .. } if *p == peer),
        )
        .await;
    }

    /// Waits for an event matching `f`.
    pub async fn wait(&mut self, what: &str, f: impl Fn(&Ev) -> bool) -> Ev {
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
    pub async fn is_connected(&self, peer: PeerId) -> bool {
        self.with_swarm(move |s| s.is_connected(&peer)).await
    }

    /// Sends an auth request (`credential` may be absent) and returns the
    /// router's answer.
    pub async fn auth(
        &self,
        router: PeerId,
        credential: impl Into<Option<Credential>>,
        purpose: Purpose,
    ) -> AuthResponse {
        let req = AuthRequest {
            credential: credential.into(),
            purpose: purpose as i32,
            attached_routers: vec![],
            ..Default::default()
        };
        self.request(router, AUTH, &req, MAX_FRAME_BYTES).await
    }

    /// Opens a `protocol` stream to `peer` (the panic names the protocol).
    pub async fn open(&self, peer: PeerId, protocol: &'static str) -> libp2p::Stream {
        self.control
            .clone()
            .open_stream(peer, StreamProtocol::new(protocol))
            .await
            .unwrap_or_else(|e| panic!("open {protocol} stream: {e}"))
    }

    /// One framed request and its framed answer on a new `protocol`
    /// stream, which is then closed.
    async fn request<Q: prost::Message, A: prost::Message + Default>(
        &self,
        peer: PeerId,
        protocol: &'static str,
        req: &Q,
        max_answer_bytes: usize,
    ) -> A {
        let mut s = self.open(peer, protocol).await;
        write_frame(&mut s, req)
            .await
            .unwrap_or_else(|e| panic!("write {protocol}: {e}"));
        let resp = read_frame(&mut s, max_answer_bytes)
            .await
            .unwrap_or_else(|e| panic!("read {protocol}: {e}"));
        let _ = s.close().await;
        resp
    }

    /// One catalog request, or why there was no answer (the router closed
    /// the stream, as it does for peers not admitted).
    pub async fn try_catalog(
        &self,
        router: PeerId,
        req: CatalogRequest,
    ) -> Result<CatalogResponse, String> {
        let mut s = self.open(router, CATALOG).await;
        write_frame(&mut s, &req)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let resp = read_frame(&mut s, MAX_CATALOG_FRAME_BYTES)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let _ = s.close().await;
        Ok(resp)
    }

    /// Tries to open a stream of `protocol`; the error names why not.
    pub async fn try_open(&self, peer: PeerId, protocol: &'static str) -> Result<(), String> {
        self.control
            .clone()
            .open_stream(peer, StreamProtocol::new(protocol))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Sends raw bytes on a new auth stream and reads whatever comes back.
    pub async fn auth_raw(&self, router: PeerId, bytes: &[u8]) -> Vec<u8> {
        let mut s = self.open(router, AUTH).await;
        s.write_all(bytes).await.expect("write");
        let _ = s.close().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut out)).await;
        out
    }

    /// Sends a catalog request and returns the answer.
    pub async fn catalog(&self, router: PeerId, req: CatalogRequest) -> CatalogResponse {
        self.request(router, CATALOG, &req, MAX_CATALOG_FRAME_BYTES)
            .await
    }

    /// Accepts streams of `protocol` and echoes them (for relayed calls).
    pub fn serve_echo(&self, protocol: &'static str) -> tokio::task::JoinHandle<()> {
        let mut incoming = self
            .control
            .clone()
            .accept(StreamProtocol::new(protocol))
            .expect("register echo");
        tokio::spawn(async move {
            while let Some((_, mut s)) = incoming.next().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = (&mut s).split();
                    let _ = futures::io::copy(&mut r, &mut w).await;
                });
            }
        })
    }

    /// Opens a `protocol` stream to `peer`, writes `data` while reading it
    /// back (both at once, so flow-control windows never deadlock).
    pub async fn echo(&self, peer: PeerId, protocol: &'static str, data: &[u8]) -> Vec<u8> {
        let s = self.open(peer, protocol).await;
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

    /// Opens a call stream and writes `frame`; returns the answer (if the
    /// provider sent one) and the stream.
    async fn call_raw(
        &self,
        provider: PeerId,
        frame: Frame,
    ) -> (Option<CallResponse>, libp2p::Stream) {
        let mut s = self.open(provider, CALL).await;
        match frame {
            Frame::Request(req) => write_frame(&mut s, &req).await.expect("write call"),
            Frame::Garbage(bytes) => {
                s.write_all(&bytes).await.expect("write garbage");
                s.flush().await.expect("flush");
            }
        }
        let resp = read_frame(&mut s, MAX_FRAME_BYTES).await.ok();
        (resp, s)
    }

    /// Sends a call request straight to `provider`; returns its answer.
    pub async fn call(&self, provider: PeerId, req: CallRequest) -> CallResponse {
        self.call_raw(provider, Frame::Request(req))
            .await
            .0
            .expect("provider answered")
    }

    /// Sends garbage instead of a call request; returns the answer, if any.
    pub async fn call_garbage(&self, provider: PeerId, bytes: Vec<u8>) -> Option<CallResponse> {
        self.call_raw(provider, Frame::Garbage(bytes)).await.0
    }

    /// A call that must be accepted, then `data` sent, the stream
    /// half-closed and everything echoed back read.
    pub async fn call_echo(&self, provider: PeerId, req: CallRequest, data: &[u8]) -> Vec<u8> {
        let (resp, mut s) = self.call_raw(provider, Frame::Request(req)).await;
        assert!(resp.expect("answer").accepted, "call refused");
        s.write_all(data).await.expect("write");
        s.close().await.expect("half-close");
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.expect("read");
        back
    }

    /// Sends a go-away (draining) to `peer`; returns whether it was acknowledged.
    pub async fn send_goaway(&self, peer: PeerId) -> bool {
        let Ok(mut s) = self
            .control
            .clone()
            .open_stream(peer, StreamProtocol::new(GOAWAY))
            .await
        else {
            return false;
        };
        let g = GoAway {
            reason: GoAwayReason::Draining as i32,
            retry_after_secs: 60,
            alternatives: vec![],
        };
        if write_frame(&mut s, &g).await.is_err() {
            return false;
        }
        read_frame::<GoAwayAck, _>(&mut s, MAX_FRAME_BYTES)
            .await
            .is_ok()
    }
}

/// What [`TestPeer::call_raw`] writes first on a call stream.
enum Frame {
    Request(CallRequest),
    Garbage(Vec<u8>),
}
