//! The tables the swarm loop owns, and the commands by which every other
//! task changes them.
//!
//! One writer per table (docs/architecture.md, "Who owns the router's
//! state"): the admission table, the trust set (the control plane's keys
//! and revocations), the router set (the peers that get the router DHT)
//! and the catalog's record store are written only by the swarm loop,
//! which holds [`Owner`]; it also publishes the live-circuit count. The
//! auth server, the catalog server, the policy tasks and the control-plane
//! loop hold a [`Handle`] and ask: each command carries a
//! reply channel and a deadline (`--state-command-deadline-ms`) over a
//! bounded queue. A command not answered in time is an error the caller
//! logs and `agentmesh_router_state_commands_total{command,
//! result="timeout"}` counts; a command the owner reaches after its asker
//! gave up is skipped (`result="expired"`), so a stale command does not
//! change a table long after its caller moved on. A key set older than the
//! one held (a control-plane replica that has not reloaded its keys yet)
//! is answered and not installed (`result="stale"`,
//! `agentmesh_proto::order::key_set_replaces`). Readers use the [`Views`]
//! (see `crate::owned`).
//!
//! This mirrors rust-libp2p's relay, whose behaviour alone holds
//! reservations and circuits and answers its handlers with commands.

mod catalog;
mod metrics;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::credential::{KeySet, Revocation};
use libp2p::PeerId;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::admission::gate::{self, Conditions, NotAdmitted};
use crate::admission::{Admission, AdmissionTable, Purpose};
use crate::catalog::store::{CatalogStore, Publish, RecordFilter, StoreError};
use crate::owned::{Owned, View};
pub(crate) use metrics::CommandMetrics;

/// Commands queued to the owner at most: a full queue makes the asker wait
/// (within its deadline), never the owner.
pub(crate) const COMMAND_QUEUE: usize = 256;

/// A change to one of the owner's tables.
#[derive(Debug)]
pub(crate) enum Command {
    /// Record `peer`'s admission unless the gate refuses it (see
    /// `admission::gate`); replies the gate's answer.
    Admit {
        peer: PeerId,
        admission: Box<Admission>,
        when: Conditions,
    },
    /// Install the control plane's key set unless it is older than the one
    /// held (see `Trust::offer_keys`); replies [`Reply::Stale`] then.
    SetKeys(KeySet),
    /// Install the revocation list the policy state holds.
    SetRevocations(Arc<Vec<Revocation>>),
    /// Recompute every admitted peer's groups under a policy just applied.
    Regroup(Arc<Policy>),
    /// The directory's routers (self excluded) were fetched: the router set
    /// becomes them plus the routers admitted now.
    SetDirectoryRouters(Vec<PeerId>),
    /// Store a member's verified record if the member may still publish
    /// (admitted to attach); replies [`Reply::Published`].
    Publish(Box<Publish>),
    /// Drop a member's record.
    Withdraw(PeerId),
    /// Drop every record the filter says no to (a policy change: records
    /// no longer owned); replies [`Reply::Dropped`].
    DropRecords(RecordFilter),
}

impl Command {
    /// Its metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Admit { .. } => "admit",
            Self::SetKeys(_) => "set_keys",
            Self::SetRevocations(_) => "set_revocations",
            Self::Regroup(_) => "regroup",
            Self::SetDirectoryRouters(_) => "set_directory_routers",
            Self::Publish(_) => "publish",
            Self::Withdraw(_) => "withdraw",
            Self::DropRecords(_) => "drop_records",
        }
    }
}

/// What the owner answered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The gate's answer to an [`Command::Admit`].
    Admitted(Result<(), NotAdmitted>),
    /// Any other command was applied.
    Done,
    /// A key set older than the one held: not installed.
    Stale,
    /// The store's answer to a [`Command::Publish`]: when the record
    /// expires here.
    Published(Result<i64, StoreError>),
    /// Records a [`Command::DropRecords`] dropped.
    Dropped(usize),
}

/// A command on its way to the owner.
#[derive(Debug)]
pub(crate) struct Request {
    command: Command,
    /// When the asker stops waiting: past it the owner skips the command.
    deadline: Instant,
    reply: oneshot::Sender<Reply>,
}

/// Why a command got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AskError {
    /// Not queued and answered within the deadline.
    #[error("the swarm loop did not answer {command} within {deadline:?}")]
    Timeout {
        /// The command's label.
        command: &'static str,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// The owner is gone (the router is stopping).
    #[error("the swarm loop is gone: {command} not applied")]
    Closed {
        /// The command's label.
        command: &'static str,
    },
}

/// The read side of the owner's tables, for every other task.
#[derive(Debug, Clone)]
pub(crate) struct Views {
    /// The admitted peers.
    pub(crate) admissions: View<AdmissionTable>,
    /// The control plane's keys and revocations.
    pub(crate) trust: View<Trust>,
    /// Circuits relayed now (the relay's events, counted by the swarm loop).
    pub(crate) circuits: watch::Receiver<usize>,
    /// The peers whose connections get the router DHT (Kademlia, identify).
    pub(crate) router_set: View<HashSet<PeerId>>,
    /// The records of this router's members.
    pub(crate) catalog: View<CatalogStore>,
}

/// The tables themselves, written only by their owner.
#[derive(Debug)]
pub(crate) struct Tables {
    /// The admitted peers.
    pub(crate) admissions: Owned<AdmissionTable>,
    /// The control plane's keys and revocations.
    pub(crate) trust: Owned<Trust>,
    /// The directory's routers plus the routers admitted.
    pub(crate) router_set: Owned<HashSet<PeerId>>,
    /// The records of this router's members.
    pub(crate) catalog: Owned<CatalogStore>,
    /// A command changed the services the store holds since the loop
    /// last looked ([`Tables::take_catalog_changed`]).
    catalog_changed: bool,
    circuits: watch::Sender<usize>,
    metrics: CommandMetrics,
}

impl Tables {
    /// Applies one request and answers it; skips (and counts) one whose
    /// asker stopped waiting.
    pub(crate) fn apply(&mut self, req: Request) {
        let label = req.command.label();
        if Instant::now() >= req.deadline || req.reply.is_closed() {
            self.metrics.count(label, "expired");
            return;
        }
        let reply = match req.command {
            Command::Admit {
                peer,
                admission,
                when,
            } => {
                let router = admission.purpose == Purpose::Router;
                let gate =
                    gate::admit_or_refuse(&mut self.admissions.write(), peer, *admission, when);
                if router && gate.is_ok() {
                    // Its next connections get the router DHT even before
                    // the directory names it.
                    self.router_set.write().insert(peer);
                }
                Reply::Admitted(gate)
            }
            Command::SetKeys(keys) => {
                // Judged under the read lock (the owner is the one writer,
                // so nothing changes before the write): a stale set never
                // makes the hot-path readers wait.
                let (held, takes) = {
                    let trust = self.trust.read();
                    (trust.key_order(), trust.takes_keys(&keys))
                };
                if takes {
                    self.trust.write().set_keys(&keys);
                    Reply::Done
                } else {
                    tracing::info!(
                        ?held,
                        offered = ?(keys.epoch, keys.generation),
                        "a key set older than the one held was not installed (a control-plane replica behind the others)"
                    );
                    Reply::Stale
                }
            }
            Command::SetRevocations(entries) => {
                self.trust.write().set_revocations(&entries);
                Reply::Done
            }
            Command::Regroup(policy) => {
                self.admissions.write().regroup(&policy);
                Reply::Done
            }
            Command::SetDirectoryRouters(routers) => {
                let admitted: Vec<PeerId> = self.admissions.read().routers().copied().collect();
                *self.router_set.write() = routers.into_iter().chain(admitted).collect();
                Reply::Done
            }
            Command::Publish(p) => self.publish(*p),
            Command::Withdraw(peer) => self.withdraw(&peer),
            Command::DropRecords(filter) => self.drop_records(filter),
        };
        // The asker may give up between the check above and here: the
        // change stands (it was asked for), the answer is lost.
        let _ = req.reply.send(reply);
    }

    /// Publishes how many circuits the relay runs now.
    pub(crate) fn set_circuits(&self, n: usize) {
        self.circuits
            .send_if_modified(|v| std::mem::replace(v, n) != n);
    }
}

/// The owner: the tables and the queue of commands to them. Held by the
/// swarm loop (tests hold it themselves).
#[derive(Debug)]
pub(crate) struct Owner {
    pub(crate) tables: Tables,
    commands: mpsc::Receiver<Request>,
}

impl Owner {
    /// Empty tables (a record store of at most `max_records`), their views
    /// and a handle to change them, each command answered within
    /// `deadline`; registers the command counters.
    pub(crate) fn new(
        registry: &mut Registry,
        deadline: Duration,
        max_records: usize,
    ) -> (Self, Views, Handle) {
        let metrics = CommandMetrics::register(registry);
        let (tx, commands) = mpsc::channel(COMMAND_QUEUE);
        let (circuits, circuits_rx) = watch::channel(0);
        let tables = Tables {
            admissions: Owned::default(),
            trust: Owned::default(),
            router_set: Owned::default(),
            catalog: Owned::new(CatalogStore::new(max_records)),
            catalog_changed: false,
            circuits,
            metrics: metrics.clone(),
        };
        let views = Views {
            admissions: tables.admissions.view(),
            trust: tables.trust.view(),
            circuits: circuits_rx,
            router_set: tables.router_set.view(),
            catalog: tables.catalog.view(),
        };
        let handle = Handle {
            tx,
            deadline,
            metrics,
        };
        (Self { tables, commands }, views, handle)
    }

    /// The next command (cancel-safe); `None` once every handle is gone.
    pub(crate) async fn next(&mut self) -> Option<Request> {
        self.commands.recv().await
    }

    /// Serves commands while `fut` runs, as the swarm loop would (tests
    /// that drive the router's parts without a swarm loop).
    #[cfg(test)]
    pub(crate) async fn serve_while<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return out,
                Some(req) = self.commands.recv() => self.tables.apply(req),
            }
        }
    }
}

/// Asks the owner to change its tables; every ask within one deadline.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    tx: mpsc::Sender<Request>,
    deadline: Duration,
    metrics: CommandMetrics,
}

impl Handle {
    /// Asks for an admission through the gate; the gate's answer.
    pub(crate) async fn admit(
        &self,
        peer: PeerId,
        admission: Admission,
        when: Conditions,
    ) -> Result<Result<(), NotAdmitted>, AskError> {
        let command = Command::Admit {
            peer,
            admission: Box::new(admission),
            when,
        };
        match self.ask(command).await? {
            Reply::Admitted(r) => Ok(r),
            _ => Ok(Ok(())),
        }
    }

    /// Installs the control plane's key set unless it is older than the
    /// one held; returns whether it did.
    pub(crate) async fn set_keys(&self, keys: KeySet) -> Result<bool, AskError> {
        Ok(self.ask(Command::SetKeys(keys)).await? != Reply::Stale)
    }

    /// Installs a revocation list.
    pub(crate) async fn set_revocations(
        &self,
        entries: Arc<Vec<Revocation>>,
    ) -> Result<(), AskError> {
        self.ask(Command::SetRevocations(entries)).await.map(drop)
    }

    /// Regroups every admitted peer under `policy`.
    pub(crate) async fn regroup(&self, policy: Arc<Policy>) -> Result<(), AskError> {
        self.ask(Command::Regroup(policy)).await.map(drop)
    }

    /// Makes the router set the directory's `routers` plus those admitted.
    pub(crate) async fn set_directory_routers(&self, routers: Vec<PeerId>) -> Result<(), AskError> {
        self.ask(Command::SetDirectoryRouters(routers))
            .await
            .map(drop)
    }

    /// Queues `command` and waits for its answer, both within the deadline;
    /// counts the outcome and logs a failure.
    pub(super) async fn ask(&self, command: Command) -> Result<Reply, AskError> {
        let label = command.label();
        let deadline = Instant::now() + self.deadline;
        let (reply, rx) = oneshot::channel();
        let req = Request {
            command,
            deadline,
            reply,
        };
        let answered = tokio::time::timeout_at(deadline, async {
            self.tx.send(req).await.ok()?;
            rx.await.ok()
        })
        .await;
        let result = match answered {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(AskError::Closed { command: label }),
            Err(_) => Err(AskError::Timeout {
                command: label,
                deadline: self.deadline,
            }),
        };
        match &result {
            Ok(Reply::Stale) => self.metrics.count(label, "stale"),
            Ok(_) => self.metrics.count(label, "ok"),
            Err(e @ AskError::Timeout { .. }) => {
                self.metrics.count(label, "timeout");
                tracing::warn!(error = %e, "state command not answered");
            }
            Err(e @ AskError::Closed { .. }) => {
                self.metrics.count(label, "closed");
                tracing::debug!(error = %e, "state command not applied");
            }
        }
        result
    }
}
