//! Per connection: offers the registered protocols on inbound streams and
//! opens outbound streams for queued requests (several at once; each
//! request travels as the substream's open info). Holds no maps; its drop
//! removes the connection from the shared state.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use libp2p::swarm::handler::{
    ConnectionEvent, DialUpgradeError, FullyNegotiatedInbound, FullyNegotiatedOutbound,
};
use libp2p::swarm::{
    ConnectionHandler, ConnectionHandlerEvent, StreamUpgradeError, SubstreamProtocol,
};
use tokio::sync::mpsc;

use crate::error::OpenStreamError;
use crate::info::ConnectionInfo;
use crate::shared::{OpenRequest, Shared};
use crate::upgrade::Protocols;

/// See the module doc.
pub struct Handler {
    /// Handed out with every stream of this connection.
    info: ConnectionInfo,
    shared: Arc<Shared>,
    /// Requests made while the peer was being dialed.
    waiting: VecDeque<OpenRequest>,
    requests: mpsc::Receiver<OpenRequest>,
}

impl Handler {
    pub(crate) fn new(
        info: ConnectionInfo,
        shared: Arc<Shared>,
        requests: mpsc::Receiver<OpenRequest>,
        waiting: Vec<OpenRequest>,
    ) -> Self {
        Self {
            info,
            shared,
            waiting: waiting.into(),
            requests,
        }
    }

    fn next_request(&mut self, cx: &mut Context<'_>) -> Option<OpenRequest> {
        loop {
            let req = match self.waiting.pop_front() {
                Some(r) => r,
                None => match self.requests.poll_recv(cx) {
                    Poll::Ready(Some(r)) => r,
                    Poll::Ready(None) | Poll::Pending => return None,
                },
            };
            // A caller that gave up (timed out) needs no stream.
            if !req.reply.is_closed() {
                return Some(req);
            }
        }
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        self.shared.connection_down(self.info.connection);
    }
}

impl ConnectionHandler for Handler {
    type FromBehaviour = Infallible;
    type ToBehaviour = Infallible;
    type InboundProtocol = Protocols;
    type OutboundProtocol = Protocols;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = OpenRequest;

    fn listen_protocol(&self) -> SubstreamProtocol<Protocols> {
        SubstreamProtocol::new(Protocols(self.shared.supported()), ())
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Protocols, OpenRequest, Infallible>> {
        match self.next_request(cx) {
            Some(req) => {
                let offer = Protocols(vec![req.protocol.clone()]);
                Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest {
                    protocol: SubstreamProtocol::new(offer, req),
                })
            }
            None => Poll::Pending,
        }
    }

    fn on_behaviour_event(&mut self, event: Infallible) {
        match event {}
    }

    fn on_connection_event(
        &mut self,
        event: ConnectionEvent<Protocols, Protocols, (), OpenRequest>,
    ) {
        match event {
            ConnectionEvent::FullyNegotiatedInbound(FullyNegotiatedInbound {
                protocol: (stream, protocol),
                ..
            }) => self.shared.inbound(&self.info, stream, protocol),
            ConnectionEvent::FullyNegotiatedOutbound(FullyNegotiatedOutbound {
                protocol: stream,
                info: req,
            }) => {
                let _ = req.reply.send(Ok((self.info.clone(), stream)));
            }
            ConnectionEvent::DialUpgradeError(DialUpgradeError { info: req, error }) => {
                let e = match error {
                    StreamUpgradeError::NegotiationFailed => {
                        OpenStreamError::UnsupportedProtocol(req.protocol)
                    }
                    StreamUpgradeError::Timeout => OpenStreamError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "stream negotiation timed out",
                    )),
                    StreamUpgradeError::Io(e) => OpenStreamError::Io(e),
                    StreamUpgradeError::Apply(never) => match never {},
                };
                let _ = req.reply.send(Err(e));
            }
            _ => {}
        }
    }
}
