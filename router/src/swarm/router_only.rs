//! A behaviour wrapper that runs the inner behaviour (Kademlia, identify)
//! only on connections to known routers; every other connection gets a dummy
//! handler, so members' Kademlia streams are refused ("protocol not
//! supported"), members never see or feed the router DHT, and the inner
//! behaviour keeps no per-member state (its tables would keep the capacity
//! of the largest fleet the router ever held).
//!
//! Which peers are routers is decided when a connection is established, from
//! the router set (the directory's routers and those admitted as routers). A
//! router connection that came in before either named it has no Kademlia;
//! the mesh dials such a router again once the directory lists it.

use std::collections::HashMap;
use std::task::{Context, Poll};

use libp2p::PeerId;
use libp2p::core::transport::PortUse;
use libp2p::core::{Endpoint, Multiaddr};
use libp2p::swarm::behaviour::{ConnectionClosed, ConnectionEstablished};
use libp2p::swarm::{
    ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, NotifyHandler, THandler,
    THandlerInEvent, THandlerOutEvent, ToSwarm, dummy,
};
// libp2p implements `ConnectionHandler` for the `either` crate's `Either`;
// this is its public re-export.
use libp2p::swarm::derive_prelude::Either;

use crate::directory::RouterSet;

/// Runs `B` on router connections only.
pub(crate) struct RouterOnly<B> {
    inner: B,
    routers: RouterSet,
    /// Connections that carry the inner handler, by peer, oldest first.
    conns: HashMap<PeerId, Vec<ConnectionId>>,
}

impl<B> RouterOnly<B> {
    /// Wraps `inner`; `routers` decides which connections carry it.
    pub(crate) fn new(inner: B, routers: RouterSet) -> Self {
        Self {
            inner,
            routers,
            conns: HashMap::new(),
        }
    }

    /// The wrapped behaviour.
    pub(crate) fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Whether some connection to `peer` carries the inner behaviour.
    pub(crate) fn has_connection(&self, peer: &PeerId) -> bool {
        self.conns.get(peer).is_some_and(|c| !c.is_empty())
    }

    /// Whether connection `id` to `peer` carries the inner behaviour.
    pub(crate) fn is_inner(&self, peer: &PeerId, id: &ConnectionId) -> bool {
        self.conns.get(peer).is_some_and(|c| c.contains(id))
    }

    fn others(&self, peer: &PeerId, id: &ConnectionId) -> usize {
        self.conns
            .get(peer)
            .map_or(0, |c| c.iter().filter(|x| *x != id).count())
    }
}

impl<B> NetworkBehaviour for RouterOnly<B>
where
    B: NetworkBehaviour,
{
    type ConnectionHandler = Either<THandler<B>, dummy::ConnectionHandler>;
    type ToSwarm = B::ToSwarm;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        self.inner
            .handle_pending_inbound_connection(connection_id, local_addr, remote_addr)
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        local_addr: &Multiaddr,
        remote_addr: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if !self.routers.read().contains(&peer) {
            return Ok(Either::Right(dummy::ConnectionHandler));
        }
        let h = self.inner.handle_established_inbound_connection(
            connection_id,
            peer,
            local_addr,
            remote_addr,
        )?;
        self.conns.entry(peer).or_default().push(connection_id);
        Ok(Either::Left(h))
    }

    fn handle_pending_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        maybe_peer: Option<PeerId>,
        addresses: &[Multiaddr],
        effective_role: Endpoint,
    ) -> Result<Vec<Multiaddr>, ConnectionDenied> {
        self.inner.handle_pending_outbound_connection(
            connection_id,
            maybe_peer,
            addresses,
            effective_role,
        )
    }

    fn handle_established_outbound_connection(
        &mut self,
        connection_id: ConnectionId,
        peer: PeerId,
        addr: &Multiaddr,
        role_override: Endpoint,
        port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if !self.routers.read().contains(&peer) {
            return Ok(Either::Right(dummy::ConnectionHandler));
        }
        let h = self.inner.handle_established_outbound_connection(
            connection_id,
            peer,
            addr,
            role_override,
            port_use,
        )?;
        self.conns.entry(peer).or_default().push(connection_id);
        Ok(Either::Left(h))
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionEstablished(e) => {
                if !self.is_inner(&e.peer_id, &e.connection_id) {
                    return;
                }
                let other_established = self.others(&e.peer_id, &e.connection_id);
                self.inner.on_swarm_event(FromSwarm::ConnectionEstablished(
                    ConnectionEstablished {
                        other_established,
                        ..e
                    },
                ));
            }
            FromSwarm::ConnectionClosed(e) => {
                if !self.is_inner(&e.peer_id, &e.connection_id) {
                    return;
                }
                if let Some(c) = self.conns.get_mut(&e.peer_id) {
                    c.retain(|id| *id != e.connection_id);
                    if c.is_empty() {
                        self.conns.remove(&e.peer_id);
                    }
                }
                let remaining_established = self.conns.get(&e.peer_id).map_or(0, |c| c.len());
                self.inner
                    .on_swarm_event(FromSwarm::ConnectionClosed(ConnectionClosed {
                        remaining_established,
                        ..e
                    }));
            }
            FromSwarm::AddressChange(e) => {
                if self.is_inner(&e.peer_id, &e.connection_id) {
                    self.inner.on_swarm_event(FromSwarm::AddressChange(e));
                }
            }
            other => self.inner.on_swarm_event(other),
        }
    }

    fn on_connection_handler_event(
        &mut self,
        peer_id: PeerId,
        connection_id: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {
            Either::Left(ev) => self
                .inner
                .on_connection_handler_event(peer_id, connection_id, ev),
            Either::Right(never) => libp2p::core::util::unreachable(never),
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        loop {
            let ev = match self.inner.poll(cx) {
                Poll::Ready(ev) => ev,
                Poll::Pending => return Poll::Pending,
            };
            // Events for "any connection" of a peer must reach one that
            // carries the inner handler: the newest, which is the one most
            // likely to carry it on the remote side too.
            if let ToSwarm::NotifyHandler {
                peer_id,
                handler: NotifyHandler::Any,
                event,
            } = ev
            {
                match self.conns.get(&peer_id).and_then(|c| c.last()) {
                    Some(id) => {
                        return Poll::Ready(ToSwarm::NotifyHandler {
                            peer_id,
                            handler: NotifyHandler::One(*id),
                            event: Either::Left(event),
                        });
                    }
                    None => {
                        tracing::debug!(%peer_id, "dropping an event for a router without a connection that carries the behaviour");
                        continue;
                    }
                }
            }
            return Poll::Ready(ev.map_in(Either::Left));
        }
    }
}
