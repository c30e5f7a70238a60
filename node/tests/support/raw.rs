//! A raw libp2p peer (TCP + noise + yamux, relay client, streams) that
//! speaks auth and call by hand, so tests can present any credential.

use std::time::Duration;

use agentmesh_proto::framing::{read_frame, write_frame};
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::{
    AuthRequest, AuthResponse, CallRequest, CallResponse, GoAway, GoAwayAck, GoAwayReason, Purpose,
};
use agentmesh_proto::protocols::{AUTH, CALL, GOAWAY, MAX_FRAME_BYTES};
use futures::{AsyncReadExt as _, AsyncWriteExt as _, StreamExt as _};
use libp2p::identity::Keypair;
use libp2p::swarm::NetworkBehaviour;
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm, SwarmBuilder, noise, relay, tcp, yamux};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::DEADLINE;

#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
pub struct RawBehaviour {
    relay: relay::client::Behaviour,
    stream: libp2p_stream::Behaviour,
}

type Cmd = Box<dyn FnOnce(&mut Swarm<RawBehaviour>) + Send>;

/// The peer; its swarm runs in a task aborted on drop.
pub struct RawPeer {
    pub key: Keypair,
    pub peer_id: PeerId,
    control: libp2p_stream::Control,
    cmd: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawPeer {
    pub fn new(key: Keypair) -> Self {
        let mut swarm = SwarmBuilder::with_existing_identity(key.clone())
            .with_tokio()
            .with_tcp(
                tcp::Config::default(),
                noise::Config::new,
                yamux::Config::default,
            )
            .expect("tcp")
            .with_relay_client(noise::Config::new, yamux::Config::default)
            .expect("relay client")
            .with_behaviour(|_, relay| RawBehaviour {
                relay,
                stream: libp2p_stream::Behaviour::new(),
            })
            .expect("behaviour")
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
            .build();
        let control = swarm.behaviour().stream.new_control();
        let (cmd_tx, mut cmd_rx) = mpsc::channel::<Cmd>(64);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = swarm.select_next_some() => {}
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
            task,
        }
    }

    async fn with_swarm<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Swarm<RawBehaviour>) -> T + Send + 'static,
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
    pub async fn connect(&self, peer: PeerId, addr: Multiaddr) {
        self.with_swarm(move |s| s.dial(addr).expect("dial")).await;
        let end = Instant::now() + DEADLINE;
        while !self.with_swarm(move |s| s.is_connected(&peer)).await {
            assert!(Instant::now() < end, "never connected to {peer}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn auth(
        &self,
        router: PeerId,
        credential: Credential,
        purpose: Purpose,
    ) -> AuthResponse {
        let mut s = self
            .control
            .clone()
            .open_stream(router, StreamProtocol::new(AUTH))
            .await
            .expect("open auth");
        let req = AuthRequest {
            credential: Some(credential),
            purpose: purpose as i32,
            attached_routers: vec![],
        };
        write_frame(&mut s, &req).await.expect("write auth");
        read_frame(&mut s, MAX_FRAME_BYTES)
            .await
            .expect("read auth")
    }

    /// Opens a call stream and writes `bytes` as the request frame body
    /// source; returns the answer (if the provider sent one) and the stream.
    async fn call_raw(
        &self,
        provider: PeerId,
        frame: Frame,
    ) -> (Option<CallResponse>, libp2p::Stream) {
        let mut s = self
            .control
            .clone()
            .open_stream(provider, StreamProtocol::new(CALL))
            .await
            .expect("open call");
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

    /// A call request; returns the provider's answer.
    pub async fn call(&self, provider: PeerId, req: CallRequest) -> CallResponse {
        self.call_raw(provider, Frame::Request(req))
            .await
            .0
            .expect("provider answered")
    }

    /// Garbage instead of a request; returns the answer, if any.
    pub async fn call_garbage(&self, provider: PeerId, bytes: Vec<u8>) -> Option<CallResponse> {
        self.call_raw(provider, Frame::Garbage(bytes)).await.0
    }

    /// A call that is accepted, then `data` echoed back.
    pub async fn call_echo(&self, provider: PeerId, req: CallRequest, data: &[u8]) -> Vec<u8> {
        let (resp, mut s) = self.call_raw(provider, Frame::Request(req)).await;
        assert!(resp.expect("answer").accepted, "call refused");
        s.write_all(data).await.expect("write");
        s.close().await.expect("half-close");
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.expect("read");
        back
    }
}

impl RawPeer {
    /// Sends a go-away to `peer`; returns whether it was acknowledged.
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

enum Frame {
    Request(CallRequest),
    Garbage(Vec<u8>),
}
