//! A compromised router: a peer holding a real router credential (enrolled
//! with a router token), in the directory with a lease, to which members
//! attach like to any other router. It admits every member that shows a
//! credential and lies about the revocation list: its admission answers
//! carry the list it is told to tell (`Admitted.policy.revocations`), and
//! [`LyingRouter::push`] pushes that list to an admitted member on
//! `/agentmesh/policy/1` and reads the member's ack, which says what the
//! member holds afterwards and why it refused the list.
//!
//! What it tells is up to the caller: a list signed by a key that is not
//! the control plane's (a forgery naming an honest member), one with no
//! signature at all, or a genuine list of an older generation (a rollback
//! that omits a revocation in force).
//!
//! It serves nothing else (no relay, no catalog): members find their
//! reservations and lookups refused and keep their other routers.
//! Bounded: every exchange has a deadline, pushes retry within one, the
//! lease renews every [`LEASE_EVERY`] until the router is dropped.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::controlplane::RouterLoad;
use agentmesh_proto::pb::credential::SignedRevocations;
use agentmesh_proto::pb::mesh::{AuthRefusal, PolicyAck, PolicyPush};
use agentmesh_proto::protocols::AUTH;
use agentmesh_wire::{auth, policy};
use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId, StreamProtocol};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::counts::{Live as _, inc};
use crate::member::Member;

/// How often the lease is renewed (well within the control plane's TTL).
pub const LEASE_EVERY: Duration = Duration::from_secs(2);
/// A push the member dropped unread (it had not counted us admitted yet)
/// is sent again after this pause.
const PUSH_RETRY: Duration = Duration::from_millis(100);

/// Where the router enrolls and listens.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The control plane's gRPC URL (must match its `--public-url`).
    pub control_plane: String,
    /// A router enrollment token.
    pub token: String,
    /// The address to listen on (any of 127.0.0.0/8 on loopback).
    pub listen_ip: IpAddr,
    /// Deadline of each step (enrollment, listening, one exchange).
    pub step_deadline: Duration,
}

crate::counts::counts! {
    /// What the lying router did.
    pub struct Report (live Counters, attack "lying-router") {
        /// Leases accepted by the control plane.
        leases,
        /// Members admitted (each answer carried the list told, if any).
        admitted,
        /// Auth requests that could not be read or answered.
        auth_failed,
        /// Push streams written.
        pushes,
        /// Pushes the member answered with an ack.
        acks,
        /// Acks saying the member refused the list pushed.
        acks_refusing_list,
        /// Auth requests refused as revoked (a lie: see
        /// [`LyingRouter::refuse_as_revoked`]).
        refused_as_revoked,
    }
}

/// A running lying router; its tasks end when it is dropped.
pub struct LyingRouter {
    /// Its PeerId (the subject of its router credential).
    pub peer_id: PeerId,
    /// The address it listens on and leased.
    pub addr: Multiaddr,
    member: Member,
    lie: watch::Sender<Option<SignedRevocations>>,
    /// Every auth is refused as revoked while set.
    refuse: Arc<std::sync::atomic::AtomicBool>,
    admitted: watch::Receiver<Vec<PeerId>>,
    counters: Arc<Counters>,
    tasks: tokio::task::JoinSet<()>,
}

impl LyingRouter {
    /// Enrolls with the router token, listens, leases its address once (so
    /// the directory names it when this returns), and from then on renews
    /// the lease and admits whoever authenticates, answering with `lie`.
    pub async fn start(setup: Setup, lie: Option<SignedRevocations>) -> anyhow::Result<Self> {
        let client = Client::new(ClientConfig {
            url: setup.control_plane.clone(),
            retry_budget: setup.step_deadline,
            ..Default::default()
        })?;
        let key = Keypair::generate_ed25519();
        let credential = client
            .enroll(setup.token.trim(), &key)
            .await?
            .credential
            .context("enrollment returned no credential")?;
        let member = Member::new(key.clone())?;
        let peer_id = member.peer_id;
        let on = Multiaddr::empty()
            .with(setup.listen_ip.into())
            .with(Protocol::Tcp(0));
        let addr = member.listen(on, setup.step_deadline).await?;
        let mut incoming = member
            .control()
            .accept(StreamProtocol::new(AUTH))
            .context("accept auth streams")?;
        let counters = Arc::new(Counters::default());
        let load = RouterLoad {
            attached_members: 0,
            transit_connections: 0,
            high_watermark: 1000,
            low_watermark: 850,
        };
        let lease = {
            let (client, key, credential, addr) = (
                client.clone(),
                key.clone(),
                credential.clone(),
                addr.clone(),
            );
            move || {
                let (client, key, credential, addr) = (
                    client.clone(),
                    key.clone(),
                    credential.clone(),
                    addr.clone(),
                );
                async move {
                    client
                        .router_lease(
                            &credential,
                            &key,
                            vec![addr.to_string()],
                            Vec::new(),
                            load,
                            false,
                        )
                        .await
                }
            }
        };
        lease().await.context("first lease")?;
        inc(&counters.leases);

        let (lie, told) = watch::channel(lie);
        let (admitted_tx, admitted) = watch::channel(Vec::new());
        let mut tasks = tokio::task::JoinSet::new();
        let c = counters.clone();
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(LEASE_EVERY).await;
                match lease().await {
                    Ok(_) => inc(&c.leases),
                    Err(e) => tracing::warn!(error = %e, "lying router: lease failed"),
                }
            }
        });
        let (c, deadline) = (counters.clone(), setup.step_deadline);
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refusing = refuse.clone();
        tasks.spawn(async move {
            let mut answering = tokio::task::JoinSet::new();
            while let Some((info, mut stream)) = incoming.next().await {
                let (c, told, admitted) = (c.clone(), told.clone(), admitted_tx.clone());
                let refusing = refusing.load(std::sync::atomic::Ordering::Relaxed);
                answering.spawn(async move {
                    if refusing {
                        let refused = async {
                            auth::read_request(&mut stream, deadline).await?;
                            let why = "lying router: revoked".to_string();
                            auth::write_refused(&mut stream, AuthRefusal::Revoked, why, deadline)
                                .await
                        };
                        match refused.await {
                            Ok(()) => inc(&c.refused_as_revoked),
                            Err(_) => inc(&c.auth_failed),
                        }
                        return;
                    }
                    let answered = async {
                        auth::read_request(&mut stream, deadline).await?;
                        let push = told.borrow().clone().map(|list| PolicyPush {
                            policy: None,
                            revocations: Some(list),
                        });
                        let until = agentmesh_proto::unix_now() + 3600;
                        auth::write_admitted(&mut stream, until, push, deadline).await
                    };
                    match answered.await {
                        Ok(()) => {
                            inc(&c.admitted);
                            admitted.send_modify(|a| a.push(info.peer));
                        }
                        Err(e) => {
                            tracing::debug!(peer = %info.peer, error = %e, "lying router: auth not answered");
                            inc(&c.auth_failed);
                        }
                    }
                });
                // Reap the finished ones so the set stays small.
                while answering.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            peer_id,
            addr,
            member,
            lie,
            refuse,
            admitted,
            counters,
            tasks,
        })
    }

    /// From now on, every member that authenticates is refused as revoked,
    /// whoever it is: a router lying to keep members away from the mesh.
    pub fn refuse_as_revoked(&self) {
        self.refuse
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// From now on, admission answers and [`LyingRouter::push`] tell `list`.
    pub fn tell(&self, list: SignedRevocations) {
        self.lie.send_replace(Some(list));
    }

    /// Waits until `member` was admitted here, up to `deadline`.
    pub async fn admitted(&self, member: PeerId, deadline: Duration) -> anyhow::Result<()> {
        let mut a = self.admitted.clone();
        tokio::time::timeout(deadline, a.wait_for(|a| a.contains(&member)))
            .await
            .with_context(|| format!("{member} not admitted within {deadline:?}"))?
            .map_err(|_| anyhow::anyhow!("the auth task ended"))?;
        Ok(())
    }

    /// Pushes the list told to `member` (no policy: a probe, as a fallback
    /// router sends) and returns its ack. A push the member drops unread
    /// (it had not counted us admitted yet) is sent again, within
    /// `deadline`.
    pub async fn push(&self, member: PeerId, deadline: Duration) -> anyhow::Result<PolicyAck> {
        let Some(list) = self.lie.borrow().clone() else {
            bail!("no list to tell");
        };
        let msg = PolicyPush {
            policy: None,
            revocations: Some(list),
        };
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{member} answered no push within {deadline:?}");
            }
            inc(&self.counters.pushes);
            match policy::push(self.member.control(), member, &msg, left).await {
                Ok(ack) => {
                    inc(&self.counters.acks);
                    if !ack.revocations_ignored.is_empty() {
                        inc(&self.counters.acks_refusing_list);
                    }
                    return Ok(ack);
                }
                Err(e) => {
                    tracing::debug!(%member, error = %e, "lying router: push not answered; again");
                    tokio::time::sleep(PUSH_RETRY.min(left)).await;
                }
            }
        }
    }

    /// What it did so far.
    pub fn report(&self) -> Report {
        self.counters.report()
    }

    /// Stops leasing and answering (the connections stay until dropped).
    pub fn stop(&mut self) {
        self.tasks.abort_all();
    }
}
