//! A stranger reopening refused streams: one unauthenticated connection
//! at a time (a fresh PeerId each) that never shows a credential and opens
//! catalog streams in a loop, each of which a router refuses to a peer not
//! admitted, as fast as the link allows. Without a bound per connection
//! only CPU limits it; with one, the router closes the connection after
//! its budget of refusals, and the next connection starts over (until the
//! source is blocked for failed logins and its dials are refused).
//!
//! Bounded: at most `connections` connections, `streams_per_connection`
//! streams each, and `duration` in all. What it did is returned as counts.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use agentmesh_proto::protocols::CATALOG;
use anyhow::Context as _;
use futures::{AsyncReadExt as _, StreamExt as _};
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm};
use tokio::time::Instant;

use crate::source_tcp;

/// Pause after a dial that did not connect, before the next one.
const REDIAL_PAUSE: Duration = Duration::from_millis(100);

/// How long to wait for the router's close once the streams stopped (an
/// open fails while the close is on its way).
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Whether the connection closes within `wait`.
async fn closed_within(swarm: &mut Swarm<agentmesh_streams::Behaviour>, wait: Duration) -> bool {
    let until = Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, swarm.select_next_some()).await {
            Err(_) => return false,
            Ok(SwarmEvent::ConnectionClosed {
                num_established: 0, ..
            }) => return true,
            Ok(_) => {}
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
    /// Connections made at most, one after another.
    pub connections: usize,
    /// Streams opened at most on one connection.
    pub streams_per_connection: usize,
    /// How long the attack runs at most.
    pub duration: Duration,
}

/// What one run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Connections established.
    pub connections: u64,
    /// Dials that did not end in a connection (refused, or timed out).
    pub dials_failed: u64,
    /// Connections the router closed.
    pub connections_closed: u64,
    /// Streams negotiated (then refused: the router closed them unanswered).
    pub streams_opened: u64,
    /// Opens that failed (the connection was closing, or negotiation failed).
    pub opens_failed: u64,
    /// Streams on which the router wrote something (never expected: a
    /// stranger gets no catalog answer).
    pub streams_answered: u64,
    /// Most streams negotiated on one connection.
    pub most_on_one_connection: u64,
}

impl Report {
    /// The counts by name, for `--json`.
    pub fn counts(&self) -> crate::summary::Summary {
        crate::summary::Summary::new(
            "router-refused-streams",
            [
                ("connections", self.connections),
                ("dials_failed", self.dials_failed),
                ("connections_closed", self.connections_closed),
                ("streams_opened", self.streams_opened),
                ("opens_failed", self.opens_failed),
                ("streams_answered", self.streams_answered),
                ("most_on_one_connection", self.most_on_one_connection),
            ],
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "connections={} dials_failed={} connections_closed={} streams_opened={} \
             opens_failed={} streams_answered={} most_on_one_connection={}",
            self.connections,
            self.dials_failed,
            self.connections_closed,
            self.streams_opened,
            self.opens_failed,
            self.streams_answered,
            self.most_on_one_connection
        )
    }
}

/// The PeerId at the end of `addr`.
fn peer_of(addr: &Multiaddr) -> Option<PeerId> {
    addr.iter().find_map(|p| match p {
        Protocol::P2p(id) => Some(id),
        _ => None,
    })
}

/// Runs the attack until its bounds are reached; returns what it did.
pub async fn run(attack: Attack) -> anyhow::Result<Report> {
    let router = peer_of(&attack.router).context("the router address must end in /p2p/ID")?;
    let deadline = Instant::now() + attack.duration;
    let mut report = Report::default();
    for _ in 0..attack.connections {
        if Instant::now() >= deadline {
            break;
        }
        if !connection(&attack, router, deadline, &mut report).await? {
            tokio::time::sleep(REDIAL_PAUSE).await;
        }
    }
    Ok(report)
}

/// One connection: refused streams until the router closes it, the
/// per-connection bound or the deadline. False if it never connected.
async fn connection(
    a: &Attack,
    router: PeerId,
    deadline: Instant,
    r: &mut Report,
) -> anyhow::Result<bool> {
    let key = Keypair::generate_ed25519();
    let transport = source_tcp::transport(&key, a.source_ip).context("noise")?;
    let behaviour = agentmesh_streams::Behaviour::new();
    let mut control = behaviour.new_control();
    let config = libp2p::swarm::Config::with_tokio_executor()
        .with_idle_connection_timeout(a.duration + Duration::from_secs(1));
    let mut swarm = Swarm::new(transport, behaviour, key.public().to_peer_id(), config);
    let dial = DialOpts::peer_id(router)
        .addresses(vec![a.router.clone()])
        .condition(PeerCondition::Always)
        .build();
    if swarm.dial(dial).is_err() {
        r.dials_failed += 1;
        return Ok(false);
    }
    loop {
        let Ok(ev) = tokio::time::timeout_at(deadline, swarm.select_next_some()).await else {
            return Ok(true);
        };
        match ev {
            SwarmEvent::ConnectionEstablished { .. } => break,
            SwarmEvent::OutgoingConnectionError { .. } => {
                r.dials_failed += 1;
                return Ok(false);
            }
            _ => {}
        }
    }
    r.connections += 1;
    // The streams run in their own task; the swarm is driven here.
    let streams_per_connection = a.streams_per_connection;
    let (opened_tx, mut opened_rx) = tokio::sync::watch::channel((0u64, 0u64, 0u64));
    let streams = tokio::spawn(async move {
        let (mut opened, mut failed, mut answered) = (0u64, 0u64, 0u64);
        for _ in 0..streams_per_connection {
            let open = control.open_stream(router, StreamProtocol::new(CATALOG));
            let Ok(Ok(mut s)) = tokio::time::timeout_at(deadline, open).await else {
                failed += 1;
                let _ = opened_tx.send((opened, failed, answered));
                // A failed open on a closing connection: stop here.
                return;
            };
            opened += 1;
            let mut buf = [0u8; 64];
            loop {
                match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                    Err(_) => return,
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) => answered += 1,
                }
            }
            let _ = opened_tx.send((opened, failed, answered));
        }
    });
    let mut closed = false;
    loop {
        tokio::select! {
            ev = swarm.select_next_some() => {
                if let SwarmEvent::ConnectionClosed { num_established: 0, .. } = ev {
                    closed = true;
                    break;
                }
            }
            _ = tokio::time::sleep_until(deadline) => break,
            changed = opened_rx.changed() => {
                // The stream task ended: its bound is reached, or an open
                // failed because the router is closing the connection.
                if changed.is_err() {
                    closed = closed_within(&mut swarm, CLOSE_WAIT.min(deadline - Instant::now())).await;
                    break;
                }
            }
        }
    }
    streams.abort();
    let _ = streams.await;
    let (opened, failed, answered) = *opened_rx.borrow();
    r.streams_opened += opened;
    r.opens_failed += failed;
    r.streams_answered += answered;
    r.most_on_one_connection = r.most_on_one_connection.max(opened);
    if closed {
        r.connections_closed += 1;
    }
    Ok(true)
}

/// `agentmesh-hostile router-refused-streams`: the attack's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The router to attack: /ip4/A/tcp/P/p2p/ID.
    #[arg(long)]
    pub router: Multiaddr,
    /// Local address every connection leaves from (any of 127.0.0.0/8 on loopback).
    #[arg(long)]
    pub source_ip: IpAddr,
    /// Connections made at most, one after another, connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Refused streams opened at most on one connection, streams.
    #[arg(long, default_value_t = 10_000)]
    pub streams_per_connection: usize,
    /// How long the attack runs at most, seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_secs: u64,
}

impl Args {
    /// Runs the attack and returns its report.
    pub async fn run(self) -> anyhow::Result<Report> {
        run(Attack {
            router: self.router,
            source_ip: self.source_ip,
            connections: self.connections,
            streams_per_connection: self.streams_per_connection,
            duration: Duration::from_secs(self.duration_secs),
        })
        .await
    }
}
