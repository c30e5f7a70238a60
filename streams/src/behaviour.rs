//! The network behaviour: creates a [`Handler`] per connection, dials peers
//! that `open_stream` asked for, fails their requests when every dial to
//! the peer failed (see [`crate::in_flight`]),
//! closes connections its caller asked to close
//! ([`Control::close_connection`]), and forgets connections when they close.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::core::Endpoint;
use libp2p::core::transport::PortUse;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{
    CloseConnection, ConnectionClosed, ConnectionDenied, ConnectionId, DialError, DialFailure,
    FromSwarm, NetworkBehaviour, THandler, THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{Multiaddr, PeerId};
use prometheus_client::registry::Registry;

use crate::control::Control;
use crate::handler::Handler;
use crate::in_flight::InFlight;
use crate::info::ConnectionInfo;
use crate::shared::{DebugSizes, Next, Shared};
use crate::{Config, PendingOpenLimits};

/// Raw streams of our own protocols; see the crate doc.
pub struct Behaviour {
    shared: Arc<Shared>,
    /// Outbound dials under way per peer (only the swarm's events write it).
    dials: InFlight,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self::new()
    }
}

impl Behaviour {
    /// A behaviour with the default [`Config`].
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    /// A behaviour with explicit settings and the default
    /// [`PendingOpenLimits`].
    pub fn with_config(config: Config) -> Self {
        Self::with_limits(config, PendingOpenLimits::default())
    }

    /// A behaviour with explicit settings and bounds of the opens waiting
    /// for a dial.
    pub fn with_limits(config: Config, pending: PendingOpenLimits) -> Self {
        Self {
            shared: Arc::new(Shared::new(config.inbound_queue_per_protocol, pending)),
            dials: InFlight::default(),
        }
    }

    /// A handle to open and accept streams through this behaviour.
    pub fn new_control(&self) -> Control {
        Control::new(self.shared.clone())
    }

    /// Registers `agentmesh_streams_inbound_dropped_total{protocol,reason}`
    /// (inbound streams dropped after negotiation; label values exist from
    /// the moment a protocol is accepted) and
    /// `agentmesh_streams_pending_opens_refused_total{limit}` (opens refused
    /// because too many waited for a dial; every `limit` from the start).
    /// Both live here, so every embedder that calls this counts them.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "agentmesh_streams_inbound_dropped",
            "Inbound streams dropped after negotiation, by protocol and reason (queue_full: the accept loop is behind and the stream's peer holds the most of its queue; preempted: a queued stream of the peer holding the most, dropped for a peer holding fewer; not_accepted: nobody accepts the protocol any more)",
            self.shared.dropped.clone(),
        );
        registry.register(
            "agentmesh_streams_pending_opens_refused",
            "Stream opens refused at once because too many already waited for a dial, by limit (per_peer: to that peer; total: to all peers together)",
            self.shared.refused.clone(),
        );
    }

    /// Sizes of the internal maps (see [`Control::debug_sizes`]).
    #[doc(hidden)]
    pub fn debug_sizes(&self) -> DebugSizes {
        self.shared.debug_sizes()
    }

    fn handler(&self, info: ConnectionInfo) -> Handler {
        let (conn, peer) = (info.connection, info.peer);
        let (requests, waiting) = self.shared.connection_up(conn, peer, info.relayed);
        Handler::new(info, self.shared.clone(), requests, waiting)
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = Handler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        conn: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(self.handler(ConnectionInfo::accepted(
            peer,
            conn,
            local_addr,
            remote_addr.clone(),
        )))
    }

    fn handle_pending_outbound_connection(
        &mut self,
        conn: ConnectionId,
        peer: Option<PeerId>,
        _: &[Multiaddr],
        _: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        if let Some(peer) = peer {
            self.dials.started(peer, conn);
        }
        Ok(Vec::new())
    }

    fn handle_established_outbound_connection(
        &mut self,
        conn: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        self.dials.ended(peer, conn);
        Ok(self.handler(ConnectionInfo::new(peer, conn, addr.clone(), true)))
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionClosed(ConnectionClosed { connection_id, .. }) => {
                self.shared.connection_down(connection_id);
            }
            // Refused only because the peer is already being dialed: that
            // other dial's outcome settles the waiting requests. Any other
            // failure fails them only when no other dial to the peer is
            // still under way (a failed punch beside a caller's dial).
            FromSwarm::DialFailure(DialFailure {
                peer_id: Some(peer),
                error,
                connection_id,
            }) => {
                let others = self.dials.ended(peer, connection_id);
                if !others && !matches!(error, DialError::DialPeerConditionFalse(_)) {
                    self.shared.dial_failed(peer, &error.to_string());
                }
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<ToSwarm<Infallible, THandlerInEvent<Self>>> {
        match self.shared.next(cx.waker()) {
            Some(Next::Close(peer_id, connection)) => Poll::Ready(ToSwarm::CloseConnection {
                peer_id,
                connection: CloseConnection::One(connection),
            }),
            Some(Next::Dial(peer)) => Poll::Ready(ToSwarm::Dial {
                opts: DialOpts::peer_id(peer)
                    .condition(PeerCondition::DisconnectedAndNotDialing)
                    .build(),
            }),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::labels::PendingLimit;

    #[test]
    fn refusal_counters_exist_at_zero_from_the_start() {
        let behaviour = Behaviour::new();
        let mut registry = Registry::default();
        behaviour.register_metrics(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        for limit in PendingLimit::ALL {
            let series = format!(
                "agentmesh_streams_pending_opens_refused_total{{limit=\"{}\"}} 0",
                limit.as_str()
            );
            assert!(out.contains(&series), "{series} missing: {out}");
        }
    }
}
