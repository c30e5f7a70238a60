//! `agentmesh-ladder bench-peer`: one process of a bench floor (or the
//! bench's backend and client for every path), so each process's CPU time
//! can be read from `/proc` on its own.
//!
//! A server prints `listening <addr>` once it can be reached; a client
//! prints `ready` once its connection is up, then answers one JSON
//! [`Request`] per stdin line with one JSON [`Response`] line. Every role
//! exits when its stdin closes, so a coordinator that dies takes its
//! peers with it.
//!
//! The floor with TCP ends splices like a node: a `forward` peer turns each
//! accepted TCP connection into a raw stream through the circuit (a node's
//! `--forward`), and a `serve-p2p --splice-to ADDR` listener turns each
//! inbound raw stream into a TCP connection to the backend (a node's
//! `--expose`); both with [`proto::splice`], the node's splice.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio_util::compat::FuturesAsyncReadCompatExt as _;

use super::proto::splice;
use super::{p2p, proto};

/// Deadline for a libp2p dial, listener or reservation to come up.
const UP_DEADLINE: Duration = Duration::from_secs(30);

/// What a peer process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// The backend: the bench protocol on a loopback TCP listener.
    ServeTcp,
    /// A bare libp2p listener serving raw streams (directly, or through `--relay`).
    ServeP2p,
    /// A bare relay v2 server, limits lifted.
    Relay,
    /// The measuring client: connects to `--target`, then runs requests.
    Client,
    /// A bare libp2p forwarder: connects to the libp2p `--target`, then
    /// splices each connection accepted on a loopback TCP listener to a new
    /// raw stream to it (like a node's `--forward`).
    Forward,
}

/// The flags of `bench-peer`.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerConfig {
    /// What this process is.
    #[arg(long, value_enum)]
    pub role: Role,
    /// serve-p2p: listen through a circuit on this relay (`/ip4/…/tcp/…/p2p/ID`)
    /// instead of on TCP directly (default: directly).
    #[arg(long)]
    pub relay: Option<Multiaddr>,
    /// serve-p2p: splice each inbound raw stream to a new TCP connection to
    /// this address (like a node's `--expose`) instead of serving the bench
    /// protocol on it.
    #[arg(long)]
    pub splice_to: Option<SocketAddr>,
    /// client: `tcp:IP:PORT`, or a libp2p address ending in `/p2p/ID`;
    /// forward: a libp2p address ending in `/p2p/ID`.
    #[arg(long)]
    pub target: Option<String>,
    /// Mux libp2p connections with the member's yamux and its limits
    /// instead of libp2p-yamux's defaults, true|false (default: false).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub member_yamux: bool,
}

/// One measurement a client runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// One stream, `bytes` one way.
    Sink {
        /// Bytes sent.
        bytes: u64,
    },
    /// One stream, one-byte round trips.
    Echo {
        /// Unrecorded round trips first.
        warmup: u32,
        /// Recorded round trips.
        count: u32,
    },
    /// `streams` streams at once, `bytes_each` one way on each.
    Concurrent {
        /// Bytes per stream.
        bytes_each: u64,
        /// Streams at once.
        streams: u32,
    },
}

/// A client's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// Wall time of a sink or concurrent request, seconds.
    Secs(f64),
    /// Each recorded round trip, microseconds.
    RttsMicros(Vec<f64>),
    /// Why the request failed.
    Error(String),
}

/// Runs a peer until its stdin closes.
pub async fn run(cfg: PeerConfig) -> anyhow::Result<()> {
    let mux = if cfg.member_yamux {
        p2p::Mux::Member
    } else {
        p2p::Mux::Libp2p
    };
    match cfg.role {
        Role::ServeTcp => {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding the backend")?;
            say(&format!("listening {}", l.local_addr()?)).await?;
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    let _ = s.set_nodelay(true);
                    tokio::spawn(async move {
                        if let Err(e) = proto::serve(s).await {
                            tracing::warn!(error = %e, "backend connection failed");
                        }
                    });
                }
            });
            until_stdin_closes(None).await
        }
        Role::ServeP2p | Role::Relay => {
            let relay_server = cfg.role == Role::Relay;
            let mut swarm = p2p::swarm(relay_server, mux)?;
            match cfg.splice_to.filter(|_| !relay_server) {
                Some(backend) => p2p::splice_streams(p2p::control(&swarm), backend)?,
                None => p2p::serve_streams(p2p::control(&swarm))?,
            }
            let circuit = cfg.relay.clone().filter(|_| !relay_server);
            match &circuit {
                Some(relay) => {
                    swarm.listen_on(relay.clone().with(libp2p::multiaddr::Protocol::P2pCircuit))?
                }
                None => swarm.listen_on("/ip4/127.0.0.1/tcp/0".parse()?)?,
            };
            let mut events = p2p::drive(swarm, relay_server);
            let want_circuit = circuit.is_some();
            let addr = p2p::wait_for(&mut events, UP_DEADLINE, |e| match e {
                p2p::Event::Listening(a)
                    if a.iter()
                        .any(|p| matches!(p, libp2p::multiaddr::Protocol::P2pCircuit))
                        == want_circuit =>
                {
                    Some(a.clone())
                }
                _ => None,
            })
            .await
            .context("listening")?;
            say(&format!("listening {addr}")).await?;
            until_stdin_closes(None).await
        }
        Role::Client => {
            let target = cfg.target.as_deref().context("client needs --target")?;
            let target = Target::connect(target, mux).await?;
            say("ready").await?;
            until_stdin_closes(Some(&target)).await
        }
        Role::Forward => {
            let target = cfg.target.as_deref().context("forward needs --target")?;
            let Target::P2p { control, peer } = Target::connect(target, mux).await? else {
                anyhow::bail!("forward needs a libp2p --target, not {target:?}");
            };
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding the forward")?;
            say(&format!("listening {}", l.local_addr()?)).await?;
            tokio::spawn(async move {
                while let Ok((tcp, _)) = l.accept().await {
                    tokio::spawn(forward_one(tcp, control.clone(), peer));
                }
            });
            until_stdin_closes(None).await
        }
    }
}

/// One forwarded connection, as a node's `--forward` serves it: a new raw
/// stream to `peer`, spliced with the connection.
async fn forward_one(
    mut tcp: tokio::net::TcpStream,
    mut control: libp2p_stream::Control,
    peer: PeerId,
) {
    let _ = tcp.set_nodelay(true);
    match control.open_stream(peer, p2p::PROTOCOL).await {
        Ok(stream) => {
            if let Err(e) = splice(&mut tcp, &mut stream.compat()).await {
                tracing::debug!(error = %e, "forwarded connection ended with an error");
            }
        }
        Err(e) => tracing::warn!(error = %e, "forwarded connection: opening a stream failed"),
    }
}

/// Writes one line to stdout and flushes it (the coordinator waits on it).
async fn say(line: &str) -> anyhow::Result<()> {
    let mut out = tokio::io::stdout();
    out.write_all(format!("{line}\n").as_bytes()).await?;
    out.flush().await?;
    Ok(())
}

/// Reads stdin lines until EOF; a client answers each as a [`Request`].
async fn until_stdin_closes(client: Option<&Target>) -> anyhow::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let Some(target) = client else { continue };
        let response = match serde_json::from_str::<Request>(&line) {
            Ok(req) => target
                .run(req)
                .await
                .unwrap_or_else(|e| Response::Error(format!("{e:#}"))),
            Err(e) => Response::Error(format!("bad request {line:?}: {e}")),
        };
        say(&serde_json::to_string(&response)?).await?;
    }
    Ok(())
}

/// Something a stream of the bench protocol runs over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Where a client's streams go.
enum Target {
    /// A new TCP connection per stream (the backend, or a node's `--forward`).
    Tcp(SocketAddr),
    /// A new raw stream per stream on one libp2p connection.
    P2p {
        control: libp2p_stream::Control,
        peer: PeerId,
    },
}

impl Target {
    /// Parses `tcp:ADDR` or a libp2p address, and for libp2p dials it and
    /// waits for the connection (a circuit address goes through its relay).
    async fn connect(target: &str, mux: p2p::Mux) -> anyhow::Result<Self> {
        if let Some(addr) = target.strip_prefix("tcp:") {
            return Ok(Self::Tcp(addr.parse().context("--target tcp:ADDR")?));
        }
        let addr: Multiaddr = target.parse().context("--target multiaddr")?;
        let peer = p2p::last_peer(&addr).context("--target must end in /p2p/ID")?;
        let mut swarm = p2p::swarm(false, mux)?;
        let control = p2p::control(&swarm);
        swarm.dial(addr.clone())?;
        let mut events = p2p::drive(swarm, false);
        p2p::wait_for(&mut events, UP_DEADLINE, |e| match e {
            p2p::Event::Connected(p) if *p == peer => Some(()),
            _ => None,
        })
        .await
        .with_context(|| format!("connecting to {addr}"))?;
        Ok(Self::P2p { control, peer })
    }

    /// A new stream, its mode acknowledged by the server.
    async fn open(&self, mode: u8) -> anyhow::Result<Box<dyn Io>> {
        let mut s = self.new_stream().await?;
        proto::hello(&mut s, mode)
            .await
            .context("the server's ack")?;
        Ok(s)
    }

    async fn new_stream(&self) -> anyhow::Result<Box<dyn Io>> {
        match self {
            Self::Tcp(addr) => {
                let s = tokio::net::TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("connecting to {addr}"))?;
                s.set_nodelay(true)?;
                Ok(Box::new(s))
            }
            Self::P2p { control, peer } => {
                let s = control
                    .clone()
                    .open_stream(*peer, p2p::PROTOCOL)
                    .await
                    .map_err(|e| anyhow::anyhow!("opening a stream: {e}"))?;
                Ok(Box::new(s.compat()))
            }
        }
    }

    async fn run(&self, req: Request) -> anyhow::Result<Response> {
        Ok(match req {
            Request::Sink { bytes } => {
                let s = self.open(proto::MODE_SINK).await?;
                Response::Secs(proto::sink(s, bytes).await?.as_secs_f64())
            }
            Request::Echo { warmup, count } => {
                let s = self.open(proto::MODE_ECHO).await?;
                let rtts = proto::echo(s, warmup, count).await?;
                Response::RttsMicros(rtts.iter().map(|d| d.as_secs_f64() * 1e6).collect())
            }
            Request::Concurrent {
                bytes_each,
                streams,
            } => {
                let mut opened = Vec::with_capacity(streams as usize);
                for _ in 0..streams {
                    opened.push(self.open(proto::MODE_SINK).await?);
                }
                let start = Instant::now();
                let runs = opened.into_iter().map(|s| proto::sink(s, bytes_each));
                for r in futures::future::join_all(runs).await {
                    r?;
                }
                Response::Secs(start.elapsed().as_secs_f64())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_as_json_lines() {
        let r = Request::Concurrent {
            bytes_each: 5,
            streams: 16,
        };
        let line = serde_json::to_string(&r).expect("encode");
        assert_eq!(line, r#"{"op":"concurrent","bytes_each":5,"streams":16}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).expect("decode"), r);
        let a = Response::RttsMicros(vec![1.5]);
        let line = serde_json::to_string(&a).expect("encode");
        assert_eq!(serde_json::from_str::<Response>(&line).expect("decode"), a);
    }
}
