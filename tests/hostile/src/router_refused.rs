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

use std::net::IpAddr;
use std::time::Duration;

use agentmesh_proto::protocols::CATALOG;
use agentmesh_streams::Control;
use anyhow::Context as _;
use futures::{AsyncReadExt as _, StreamExt as _};
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, StreamProtocol, Swarm};
use tokio::time::Instant;

use crate::stranger::{self, Dialed, Stranger, peer_of};

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

crate::counts::counts! {
    /// What one run did.
    pub struct Report (live Counters, attack "router-refused-streams") {
        /// Connections established.
        connections,
        /// Dials that did not end in a connection (refused, or timed out).
        dials_failed,
        /// Connections the router closed.
        connections_closed,
        /// Streams negotiated (then refused: the router closed them unanswered).
        streams_opened,
        /// Opens that failed (the connection was closing, or negotiation failed).
        opens_failed,
        /// Streams on which the router wrote something (never expected: a
        /// stranger gets no catalog answer).
        streams_answered,
        /// Most streams negotiated on one connection.
        most_on_one_connection,
    }
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
    let idle = a.duration + Duration::from_secs(1);
    let Stranger { mut swarm, control } =
        match stranger::dial(&a.router, router, a.source_ip, idle, deadline).await? {
            Dialed::Connected(s) => *s,
            Dialed::Failed => {
                r.dials_failed += 1;
                return Ok(false);
            }
            Dialed::Deadline => return Ok(true),
        };
    r.connections += 1;
    // The streams run in their own task; the swarm is driven here.
    let streams_per_connection = a.streams_per_connection;
    let (opened_tx, mut opened_rx) = tokio::sync::watch::channel(Opened::default());
    let streams = tokio::spawn(catalog_streams(
        control,
        router,
        streams_per_connection,
        deadline,
        opened_tx,
    ));
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
    let Opened {
        opened,
        failed,
        answered,
    } = *opened_rx.borrow();
    r.streams_opened += opened;
    r.opens_failed += failed;
    r.streams_answered += answered;
    r.most_on_one_connection = r.most_on_one_connection.max(opened);
    if closed {
        r.connections_closed += 1;
    }
    Ok(true)
}

/// What [`catalog_streams`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Opened {
    /// Streams negotiated.
    pub(crate) opened: u64,
    /// Opens that failed (the last one: it stops there).
    pub(crate) failed: u64,
    /// Reads that brought bytes (a stranger's catalog stream gets none).
    pub(crate) answered: u64,
}

/// Opens up to `n` catalog streams to `router`, one after another, each
/// read until the router closes it, and sends the counts after each; stops
/// at the first open that fails (the connection is closing) or at
/// `deadline`.
pub(crate) async fn catalog_streams(
    mut control: Control,
    router: PeerId,
    n: usize,
    deadline: Instant,
    tx: tokio::sync::watch::Sender<Opened>,
) {
    let mut o = Opened::default();
    for _ in 0..n {
        let open = control.open_stream(router, StreamProtocol::new(CATALOG));
        let Ok(Ok(mut s)) = tokio::time::timeout_at(deadline, open).await else {
            o.failed += 1;
            let _ = tx.send(o);
            return;
        };
        o.opened += 1;
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Err(_) => return,
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => o.answered += 1,
            }
        }
        let _ = tx.send(o);
    }
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
