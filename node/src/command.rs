//! What a node's tasks ask of its engine ([`Command`], each with its reply
//! channel), what the engine answers, and the typed errors those answers
//! carry: [`ConnectError`] (a connection to a peer, with the relay's
//! [`CircuitRefusal`] when a router refused the circuit), [`TransitError`]
//! (a transit admission) and [`Unanswered`] (no answer at all). A call task
//! decides on them by variant, never by their text: what is retried on
//! another route, what is final, what counts as a timeout.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_wire::auth::{AuthError, AuthOutcome};
use libp2p::{Multiaddr, PeerId};
use tokio::sync::oneshot;

/// Queue of commands to the engine.
pub(crate) const COMMAND_QUEUE: usize = 256;

/// What other tasks ask of the engine (which owns the swarm). Each
/// carries its reply channel; the asker bounds its wait (see
/// [`crate::node::Node::ask`]), and a reply whose asker gave up is dropped.
#[derive(Debug)]
pub(crate) enum Command {
    /// Be connected to `peer` (dial `addrs` unless already connected).
    /// With `keep_via`, relayed connections to `peer` through other routers
    /// are closed first, and the reply waits until they are gone. With
    /// `listed` (the routers the peer's record names), a peer we reach only
    /// through other routers (ones it left or is leaving) is dialed anew
    /// and the reply waits for the new connection, which the next stream
    /// uses (`agentmesh-streams` opens on the newest); the old ones are left
    /// to finish their calls.
    Connect {
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        keep_via: Option<Vec<PeerId>>,
        listed: Option<Vec<PeerId>>,
        /// A call's stream just failed on this direct connection to
        /// `peer`: it is closed if still open (its path is suspect; the
        /// relayed ones, the fallback, are kept), punches to `peer` back
        /// off, and the reply waits until it is gone.
        suspect: Option<libp2p::swarm::ConnectionId>,
        reply: oneshot::Sender<Result<(), ConnectError>>,
    },
    /// The routers a call may use now (see [`Routes`]).
    Routes { reply: oneshot::Sender<Routes> },
    /// Be connected to `router` (at `addrs`) and admitted there for
    /// transit, unless it is one we hold (admitted for attach) or already
    /// admitted us for transit on this connection. The connect waits at
    /// most `connect_limit`, the auth exchange at most `auth_limit`.
    Transit {
        router: PeerId,
        addrs: Vec<Multiaddr>,
        connect_limit: Duration,
        auth_limit: Duration,
        reply: oneshot::Sender<Result<(), TransitError>>,
    },
    /// What the node holds, for `agentmesh-node status`.
    Report {
        reply: oneshot::Sender<crate::status::report::Report>,
    },
}

/// The engine's answer to [`Command::Routes`]: a snapshot for one call round.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routes {
    /// Routers with an active reservation, with the address we reached them at.
    pub(crate) attached: Vec<(PeerId, Multiaddr)>,
    /// Held routers that sent go-away (being replaced), and routers let go
    /// after it that stay connected for the calls through them
    /// (`engine::linger`): calls route around them when they can.
    pub(crate) leaving: HashSet<PeerId>,
    /// Router addresses from the directory (and go-away alternatives).
    pub(crate) directory: Arc<HashMap<PeerId, Vec<Multiaddr>>>,
}

/// How a relay refused to open a circuit: libp2p's
/// `relay::outbound::hop::ConnectError`, found inside a relayed dial's
/// nested transport error where the failure arises (`engine::connect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CircuitRefusal {
    /// The relay carries as many circuits as it allows.
    ResourceLimitExceeded,
    /// The relay could not open the circuit to the destination (its
    /// per-destination cap, or the destination is gone).
    ConnectionFailed,
    /// The destination holds no reservation on the relay (it moved).
    NoReservation,
    /// The relay refused by its access policy (PERMISSION_DENIED).
    PermissionDenied,
}

/// Why the engine could not connect a task to a peer
/// ([`Command::Connect`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The node is stopping.
    #[error("node is stopping")]
    Stopping,
    /// No connection within the asker's limit.
    #[error("no connection to {peer} within {after:?}")]
    TimedOut {
        /// The peer.
        peer: PeerId,
        /// The limit.
        after: Duration,
    },
    /// The engine holds as many connection waiters as it allows.
    #[error("too many connections pending")]
    TooManyPending,
    /// The dial failed. `detail` is libp2p's account, for people (it
    /// already names the peer); `circuit` says how a relay refused the
    /// circuit when one did.
    #[error("{detail}")]
    Dial {
        /// The peer dialed.
        peer: PeerId,
        /// The relay's refusal of the circuit, if that is what failed.
        circuit: Option<CircuitRefusal>,
        /// What libp2p said.
        detail: String,
    },
}

impl ConnectError {
    /// Whether a relay refused the circuit by its access policy.
    pub(crate) fn is_denied(&self) -> bool {
        matches!(
            self,
            Self::Dial {
                circuit: Some(CircuitRefusal::PermissionDenied),
                ..
            }
        )
    }

    /// Whether the failure is the route's (the dial failed or was
    /// refused), not a timeout and not the node stopping.
    pub(crate) fn is_route_failure(&self) -> bool {
        matches!(self, Self::Dial { .. } | Self::TooManyPending)
    }

    /// Whether it timed out.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, Self::TimedOut { .. })
    }

    /// The error of an ask the engine left unanswered.
    pub(crate) fn unanswered(peer: PeerId, e: Unanswered) -> Self {
        match e {
            Unanswered::Stopping => Self::Stopping,
            Unanswered::TimedOut(after) => Self::TimedOut { peer, after },
        }
    }
}

/// Why a transit admission failed (see [`Command::Transit`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransitError {
    /// No connection to the router.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The auth exchange failed.
    #[error(transparent)]
    Wire(#[from] AuthError),
    /// The router answered, and not with an admission.
    #[error("router {router} refused transit: {outcome:?}")]
    Refused {
        /// The router.
        router: PeerId,
        /// Its answer.
        outcome: Box<AuthOutcome>,
    },
    /// The engine did not answer within the asker's limit.
    #[error("no transit admission at {router} within {after:?}")]
    TimedOut {
        /// The router.
        router: PeerId,
        /// The limit.
        after: Duration,
    },
}

impl TransitError {
    /// The error of an ask the engine left unanswered.
    pub(crate) fn unanswered(router: PeerId, e: Unanswered) -> Self {
        match e {
            Unanswered::Stopping => Self::Connect(ConnectError::Stopping),
            Unanswered::TimedOut(after) => Self::TimedOut { router, after },
        }
    }
}

/// The engine gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unanswered {
    /// The command queue or the reply channel closed: the engine is stopping.
    #[error("node is stopping")]
    Stopping,
    /// No answer within the deadline.
    #[error("the node's engine did not answer within {0:?}")]
    TimedOut(Duration),
}
