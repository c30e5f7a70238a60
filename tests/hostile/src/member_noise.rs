//! Attack: refused streams to a member, as fast as they open.
//!
//! A member takes policy pushes (`/agentmesh/policy/1`) and go-aways
//! (`/agentmesh/goaway/1`) only from routers it is attached to; from any
//! other peer it drops the stream unread, counts it and logs why. An
//! enrolled member, admitted for transit, opens one relayed circuit to the
//! target member and opens push and go-away streams over it, `streams` of
//! each, `in_flight` at once, sending nothing on them. The member's log
//! must not grow with them: it logs each kind about one peer at most once
//! a minute (and counts the rest).
//!
//! Bounded: `streams` of each protocol and `duration` in all. What it did
//! is returned as counts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::Purpose;
use agentmesh_proto::protocols::{GOAWAY, POLICY};
use futures::StreamExt as _;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::time::Instant;

use crate::member::{EnrollArgs, Member, router_of};

/// Deadline of each set-up step (connect, auth, circuit).
const STEP_DEADLINE: Duration = Duration::from_secs(10);
/// Deadline of one stream's negotiation.
const OPEN_DEADLINE: Duration = Duration::from_secs(10);

/// What to attack and how hard.
#[derive(Debug, Clone)]
pub struct Attack {
    /// The router whose relay carries the circuit.
    pub router: PeerId,
    /// Its address (with or without `/p2p/ROUTER`).
    pub router_addr: Multiaddr,
    /// The member attacked.
    pub target: PeerId,
    /// Streams opened per protocol (push and go-away).
    pub streams: usize,
    /// Streams being opened at once.
    pub in_flight: usize,
    /// How long the attack runs at most.
    pub duration: Duration,
}

crate::counts::counts! {
    /// What the attack did.
    pub struct Report (live Counts, attack "member-noise") {
        /// Circuits to the target established (1 unless it was dropped).
        circuits,
        /// Policy push streams negotiated.
        pushes,
        /// Go-away streams negotiated.
        goaways,
        /// Streams that failed to open (refused, reset, timed out).
        failed,
    }
}

/// Live counts of a running attack.
pub type Progress = crate::counts::Progress<Counts>;

/// Runs the attack as the member with `key` and its `credential`; returns
/// once every stream was opened (or failed), `attack.duration` passed, or
/// [`Progress::stop`] was called. Fails only if the set-up fails (router
/// unreachable, not admitted, no circuit to the target).
pub async fn run(
    attack: &Attack,
    key: Keypair,
    credential: Credential,
    progress: Arc<Progress>,
) -> anyhow::Result<Report> {
    let end = Instant::now() + attack.duration;
    let member = Member::new(key)?;
    member
        .connect(attack.router, attack.router_addr.clone(), STEP_DEADLINE)
        .await?;
    member
        .authenticate(attack.router, credential, Purpose::Transit, STEP_DEADLINE)
        .await?;
    member
        .connect_through(
            attack.router,
            &attack.router_addr,
            attack.target,
            STEP_DEADLINE,
        )
        .await?;
    progress.counts.circuits.fetch_add(1, Ordering::Relaxed);
    let control = member.control();
    let target = attack.target;
    // Push, go-away, push, ...: both kinds arrive all along.
    let opens = (0..attack.streams * 2).map(|i| {
        let mut control = control.clone();
        let progress = progress.clone();
        let push = i % 2 == 0;
        async move {
            let proto = StreamProtocol::new(if push { POLICY } else { GOAWAY });
            let c = &progress.counts;
            match tokio::time::timeout(OPEN_DEADLINE, control.open_stream(target, proto)).await {
                // Negotiated; dropped at once without a byte sent.
                Ok(Ok(_stream)) => {
                    let n = if push { &c.pushes } else { &c.goaways };
                    n.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "hostile member: stream not opened");
                    c.failed.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    c.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    let mut opens = futures::stream::iter(opens).buffer_unordered(attack.in_flight.max(1));
    let mut stop = progress.stopped();
    loop {
        tokio::select! {
            next = opens.next() => if next.is_none() { break },
            _ = tokio::time::sleep_until(end) => break,
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    Ok(progress.report())
}

/// `agentmesh-hostile member-noise`: enroll with a member token, then open
/// policy push and go-away streams to a member over one circuit.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to enroll.
    #[command(flatten)]
    pub enroll: EnrollArgs,
    /// The router to relay through, a multiaddr ending in /p2p/ROUTER_ID.
    #[arg(long)]
    pub router: Multiaddr,
    /// The member to attack, a PeerId.
    #[arg(long)]
    pub target: PeerId,
    /// Streams opened per protocol, streams.
    #[arg(long, default_value_t = 20_000)]
    pub streams: usize,
    /// Streams being opened at once, streams.
    #[arg(long, default_value_t = 32)]
    pub in_flight: usize,
    /// How long the attack runs at most, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
}

impl Args {
    /// Enrolls a fresh key with the token and runs the attack.
    pub async fn run(self) -> anyhow::Result<Report> {
        let router = router_of(&self.router)?;
        let (key, credential) = self.enroll.enroll().await?;
        let attack = Attack {
            router,
            router_addr: self.router.clone(),
            target: self.target,
            streams: self.streams,
            in_flight: self.in_flight,
            duration: Duration::from_secs(self.duration_secs),
        };
        run(&attack, key, credential, Arc::new(Progress::default())).await
    }
}
