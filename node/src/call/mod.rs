//! Calls: outbound (lookup, pick a provider, connect through a router,
//! `/agentmesh/call/1`) and inbound (verify, allow, limit, splice to the
//! backend). A call, once accepted, is a plain byte stream both ways.

pub(crate) mod admission;
pub(crate) mod inbound;
pub(crate) mod outbound;
pub(crate) mod refusal;
pub(crate) mod slots;
pub(crate) mod splice;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentmesh_proto::pb::mesh::CallRefusal;
use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, Stream};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt as _};

use crate::metrics::{CallMetrics, DirectionLabel};
use crate::node::InFlight;
use crate::peer_calls::PeerCall;

/// Why an outbound call could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The node holds no router to look the service up through; carries
    /// why (its `/readyz` line).
    #[error("{0}")]
    NotReady(String),
    /// The node is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
    /// No router could answer the lookup.
    #[error("lookup of {service:?} failed: {detail}")]
    LookupFailed {
        /// The service.
        service: String,
        /// The last failure.
        detail: String,
    },
    /// Nobody provides the service.
    #[error("no provider of {0:?}")]
    NoProviders(String),
    /// A router refused the circuit by its access policy: final for this
    /// caller and service (not retried on other providers or routers);
    /// carries why, judged with the node's own copy of the policy.
    #[error("call to {service:?} refused: {detail}")]
    Denied {
        /// The service.
        service: String,
        /// The policy version, this caller's groups, what is missing.
        detail: String,
    },
    /// Every provider tried failed or refused; carries the last reason.
    #[error("call to {service:?} failed after {attempts} provider(s): {last}")]
    Failed {
        /// The service.
        service: String,
        /// Providers tried.
        attempts: usize,
        /// The last failure or refusal.
        last: String,
        /// Whether the last failure was a refusal by a provider (vs connect/timeout).
        refused: bool,
        /// The provider's refusal when it was one (`refused`): its typed
        /// reason, as the provider counts it.
        refusal: Option<CallRefusal>,
        /// Whether the last failure was a timeout.
        timed_out: bool,
    },
}

impl CallError {
    /// The `result` label counted for this failure.
    pub fn result_label(&self) -> &'static str {
        match self {
            Self::NotReady(_) => "not_ready",
            Self::Denied { .. } => "denied",
            Self::ShuttingDown => "shutting_down",
            Self::LookupFailed { .. } => "lookup_failed",
            Self::NoProviders(_) => "no_providers",
            Self::Failed { refused: true, .. } => "refused",
            Self::Failed {
                timed_out: true, ..
            } => "timeout",
            Self::Failed { .. } => "connect_failed",
        }
    }

    /// The typed reason of this failure: the provider's refusal as the
    /// provider counts it (`not_granted`, `not_allowed`, `revoked`,
    /// `too_many_calls`, `backend_unavailable`, ...) when a provider
    /// refused, else [`CallError::result_label`] (`denied` for a router's
    /// refusal by policy, `no_providers`, `timeout`, ...).
    pub fn reason(&self) -> String {
        match self {
            Self::Failed {
                refusal: Some(r), ..
            } => refusal_name(*r),
            other => other.result_label().to_string(),
        }
    }
}

/// `CALL_REFUSAL_NOT_GRANTED` as `not_granted`: the name the provider's
/// `agentmesh_node_calls_total{direction="inbound",result}` uses.
pub(crate) fn refusal_name(r: CallRefusal) -> String {
    let name = r.as_str_name();
    name.strip_prefix("CALL_REFUSAL_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}

impl CallError {
    /// Whether the call was refused (by a router's policy or by the
    /// provider), as opposed to failing to reach an answer.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Denied { .. } | Self::Failed { refused: true, .. }
        )
    }
}

/// How a call reached its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRoute {
    /// The provider.
    pub provider: PeerId,
    /// The router the call was routed through: its relay carries the
    /// circuit, unless the stream went on a direct connection.
    pub via_router: PeerId,
    /// Whether that router is one we reached with a transit connection
    /// (the provider shares none of our routers).
    pub transit: bool,
    /// Whether the stream went on a direct connection to the provider (a
    /// relayed one upgraded by a hole punch) rather than through the relay.
    pub direct: bool,
}

impl CallRoute {
    /// The kind of path the call took: `relayed` (a circuit through
    /// `via_router`) or `direct` (a connection between the two members,
    /// `docs/direct.md`); `agentmesh-node ping` reports this value as is.
    pub fn path(&self) -> &'static str {
        crate::metrics::direct_path_name(self.direct)
    }
}

/// An accepted call: raw bytes to and from the provider's backend, relayed
/// and end-to-end encrypted. Implements tokio's `AsyncRead + AsyncWrite`.
/// Shut down the write side to signal end of request.
pub struct CallStream {
    inner: Compat<Stream>,
    route: CallRoute,
    /// The connection to the provider carrying the stream.
    conn: ConnectionId,
    /// From sending the call request to reading the provider's answer.
    answered_in: Duration,
    sent: Counter,
    received: Counter,
    /// The same bytes, on the counters of the call's path.
    path_sent: Counter,
    path_received: Counter,
    _in_flight: InFlight,
    /// Keeps the relayed connection to the provider open while the call lives.
    _peer_call: PeerCall,
}

impl std::fmt::Debug for CallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStream")
            .field("route", &self.route)
            .finish()
    }
}

impl CallStream {
    pub(crate) fn new(
        stream: Stream,
        route: CallRoute,
        conn: ConnectionId,
        answered_in: Duration,
        (metrics, direct): (&CallMetrics, &crate::metrics::DirectMetrics),
        in_flight: InFlight,
        peer_call: PeerCall,
    ) -> Self {
        let (path_sent, path_received) = direct.path_bytes(route.direct);
        let bytes = |direction| {
            metrics
                .call_bytes
                .get_or_create(&DirectionLabel { direction })
                .clone()
        };
        let (sent, received) = (bytes("sent"), bytes("received"));
        Self {
            inner: stream.compat(),
            route,
            conn,
            answered_in,
            sent,
            received,
            path_sent,
            path_received,
            _in_flight: in_flight,
            _peer_call: peer_call,
        }
    }

    /// How this call reached its provider.
    pub fn route(&self) -> &CallRoute {
        &self.route
    }

    /// How long the provider took to answer the call request: one round
    /// trip over the route plus the provider's checks and its connect to
    /// its backend (what `agentmesh-node ping` reports as the round trip).
    pub fn answered_in(&self) -> Duration {
        self.answered_in
    }

    /// The connection to the provider that carries this call.
    pub(crate) fn connection(&self) -> ConnectionId {
        self.conn
    }
}

impl AsyncRead for CallStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.received.inc_by(n as u64);
            self.path_received.inc_by(n as u64);
        }
        r
    }
}

impl AsyncWrite for CallStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            self.sent.inc_by(*n as u64);
            self.path_sent.inc_by(*n as u64);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
