//! Attack: circuits to one provider.
//!
//! A router caps the relayed circuits to one destination
//! (`--circuits-per-destination`) so a popular provider cannot take all of
//! its memory. An enrolled member, admitted for transit, holds as many
//! circuits to one provider as it can through that router (each a relayed
//! connection of its own), dialing new ones as the provider or the router
//! closes them, until `duration` has passed or [`CircuitProgress::stop`] is
//! called. Against a cap with no per-source share it takes every circuit to
//! the provider and other members cannot reach it through that router;
//! against a share it holds only its share.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::Purpose;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

use crate::member::{EnrollArgs, Member, circuit_addr, router_of};

/// Deadline of each set-up step (connect, auth).
const STEP_DEADLINE: Duration = Duration::from_secs(10);
/// How often the held circuits are counted and topped up.
const TICK: Duration = Duration::from_millis(50);

/// What to attack and how hard.
#[derive(Debug, Clone)]
pub struct CircuitAttack {
    /// The router whose relay carries the circuits.
    pub router: PeerId,
    /// Its address (with or without `/p2p/ROUTER`).
    pub router_addr: Multiaddr,
    /// The provider.
    pub provider: PeerId,
    /// Circuits to hold at once (at least the router's cap, to take them all).
    pub circuits: usize,
    /// Circuit dials in flight at once.
    pub dials_in_flight: usize,
    /// Pause before dialing again after a dial was denied.
    pub renew_pause: Duration,
    /// How long the attack runs at most.
    pub duration: Duration,
}

crate::counts::counts! {
    /// What the circuit attack did.
    pub struct CircuitReport (live CircuitCounts, attack "provider-circuits") {
        /// Circuits dialed.
        dialed,
        /// Circuits established.
        established,
        /// Circuit dials that failed (denied by the relay, mostly).
        denied,
        /// Circuits held now, as the attacker's swarm counts them.
        held,
        /// The most circuits held at once, as the attacker's swarm counts them
        /// (it may still count circuits the router already closed).
        held_max,
    }
}

/// Live counts of a running circuit attack.
pub type CircuitProgress = crate::counts::Progress<CircuitCounts>;

/// Runs the attack as the member with `key` and its `credential`; returns
/// once `attack.duration` passed or [`CircuitProgress::stop`] was called.
/// Fails only if the set-up fails (router unreachable, not admitted).
pub async fn run(
    attack: &CircuitAttack,
    key: Keypair,
    credential: Credential,
    progress: Arc<CircuitProgress>,
) -> anyhow::Result<CircuitReport> {
    let end = Instant::now() + attack.duration;
    let member = Member::new(key)?;
    member
        .connect(attack.router, attack.router_addr.clone(), STEP_DEADLINE)
        .await?;
    member
        .authenticate(attack.router, credential, Purpose::Transit, STEP_DEADLINE)
        .await?;
    let addr = circuit_addr(attack.router, &attack.router_addr, attack.provider);
    let mut stop = progress.stopped();
    let mut dialed = 0u64;
    let mut seen_denied = 0u64;
    let mut next_dial = Instant::now();
    loop {
        let (open, established, denied) = member.connections(&attack.provider);
        let c = &progress.counts;
        c.held.store(u64::from(open), Ordering::Relaxed);
        c.held_max.fetch_max(u64::from(open), Ordering::Relaxed);
        c.established.store(established, Ordering::Relaxed);
        c.denied.store(denied, Ordering::Relaxed);
        let now = Instant::now();
        if denied > seen_denied {
            seen_denied = denied;
            next_dial = now + attack.renew_pause;
        }
        let mut in_flight = dialed.saturating_sub(established + denied);
        while now >= next_dial
            && (u64::from(open) + in_flight) < attack.circuits as u64
            && in_flight < attack.dials_in_flight.max(1) as u64
        {
            match member.dial(attack.provider, addr.clone()).await {
                Ok(()) => {
                    dialed += 1;
                    in_flight += 1;
                    progress.counts.dialed.store(dialed, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "hostile member: circuit dial not started");
                    next_dial = now + attack.renew_pause;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    Ok(progress.report())
}

/// `agentmesh-hostile provider-circuits`: enroll with a member token, then
/// hold circuits to a provider through one router.
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
    /// Circuits held at once, circuits.
    #[arg(long, default_value_t = 256)]
    pub circuits: usize,
    /// Circuit dials in flight at once, dials.
    #[arg(long, default_value_t = 8)]
    pub dials_in_flight: usize,
    /// Pause before dialing again after a denied dial, milliseconds.
    #[arg(long, default_value_t = 200)]
    pub renew_pause_ms: u64,
    /// How long the attack runs, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
}

impl Args {
    /// Enrolls a fresh key with the token and runs the attack.
    pub async fn run(self) -> anyhow::Result<CircuitReport> {
        let router = router_of(&self.router)?;
        let (key, credential) = self.enroll.enroll().await?;
        let attack = CircuitAttack {
            router,
            router_addr: self.router.clone(),
            provider: self.provider,
            circuits: self.circuits,
            dials_in_flight: self.dials_in_flight,
            renew_pause: Duration::from_millis(self.renew_pause_ms),
            duration: Duration::from_secs(self.duration_secs),
        };
        run(
            &attack,
            key,
            credential,
            Arc::new(CircuitProgress::default()),
        )
        .await
    }
}
