//! The hello on a direct connection between two members
//! (`/agentmesh/direct-hello/1`): the connection handler that sends our
//! credential (the one our calls carry) on one outbound stream and reads
//! the peer's from the first inbound one, each as one frame of the `wire`
//! crate's framing of at most 64 KiB, and hands what it read to the
//! behaviour; the engine verifies it (`engine/direct_auth.rs`).
//!
//! Each side closes its stream once done (the sender after writing, the
//! reader after reading) and the sender keeps its stream until the reader's
//! close arrives (at most [`LINGER`]): over QUIC, dropping a stream whose
//! peer has not finished its protocol negotiation tells the peer to stop
//! sending, and its negotiation (which writes the protocol's
//! confirmation) fails before it reads the hello.
//!
//! One hello each way per connection: inbound streams after the first are
//! dropped unread. The handler keeps the connection open until the peer's
//! hello is read (or failed) and no longer after: an authenticated direct
//! connection then closes when idle like any other. It has no deadline of
//! its own: the behaviour closes a connection whose peer has not
//! authenticated within `--direct-auth-timeout-ms`, whatever the handler
//! is doing (`gate.rs`).

use std::task::{Context, Poll};

use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::protocols::{DIRECT_HELLO, MAX_FRAME_BYTES};
use agentmesh_wire::frame;
use futures::future::BoxFuture;
use futures::{AsyncReadExt as _, AsyncWriteExt as _, FutureExt as _};
use libp2p::StreamProtocol;
use libp2p::core::upgrade::ReadyUpgrade;
use libp2p::swarm::handler::{ConnectionEvent, FullyNegotiatedInbound, FullyNegotiatedOutbound};
use libp2p::swarm::{ConnectionHandler, ConnectionHandlerEvent, SubstreamProtocol};

/// The protocol's id.
pub(crate) const PROTOCOL: StreamProtocol = StreamProtocol::new(DIRECT_HELLO);

/// How long the sender of a hello waits for the reader's close before
/// dropping its stream.
const LINGER: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads `stream` to its end, discarding what comes (the reader sends
/// nothing but its close).
async fn until_closed(stream: &mut libp2p::Stream) {
    let mut buf = [0u8; 64];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// What the handler read from the peer.
#[derive(Debug)]
pub(crate) enum Heard {
    /// Its credential, not verified yet.
    Credential(Box<Credential>),
    /// Its hello could not be read (malformed, too large, the stream
    /// failed), and why.
    Unreadable(String),
}

/// See the module doc.
pub(crate) struct Handler {
    /// Our credential, until its stream is asked for.
    ours: Option<Credential>,
    /// Our credential being written.
    sending: Option<BoxFuture<'static, ()>>,
    /// The peer's credential being read.
    receiving: Option<BoxFuture<'static, Result<Credential, frame::FrameError>>>,
    /// Our outbound stream was asked for.
    requested: bool,
    /// The peer's hello was read (or failed) and handed on.
    heard: bool,
}

impl Handler {
    /// A handler that sends `ours` (none: sends nothing, and the peer will
    /// close the connection for it).
    pub(crate) fn new(ours: Option<Credential>) -> Self {
        Self {
            ours,
            sending: None,
            receiving: None,
            requested: false,
            heard: false,
        }
    }
}

impl ConnectionHandler for Handler {
    type FromBehaviour = std::convert::Infallible;
    type ToBehaviour = Heard;
    type InboundProtocol = ReadyUpgrade<StreamProtocol>;
    type OutboundProtocol = ReadyUpgrade<StreamProtocol>;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = ();

    fn listen_protocol(&self) -> SubstreamProtocol<Self::InboundProtocol, ()> {
        SubstreamProtocol::new(ReadyUpgrade::new(PROTOCOL), ())
    }

    fn connection_keep_alive(&self) -> bool {
        !self.heard
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Self::OutboundProtocol, (), Heard>> {
        if !self.requested && self.ours.is_some() {
            self.requested = true;
            return Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest {
                protocol: SubstreamProtocol::new(ReadyUpgrade::new(PROTOCOL), ()),
            });
        }
        if let Some(f) = self.sending.as_mut()
            && f.poll_unpin(cx).is_ready()
        {
            self.sending = None;
        }
        if let Some(f) = self.receiving.as_mut()
            && let Poll::Ready(r) = f.poll_unpin(cx)
        {
            self.receiving = None;
            self.heard = true;
            let heard = match r {
                Ok(c) => Heard::Credential(Box::new(c)),
                Err(e) => Heard::Unreadable(e.to_string()),
            };
            return Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(heard));
        }
        Poll::Pending
    }

    fn on_behaviour_event(&mut self, never: Self::FromBehaviour) {
        match never {}
    }

    fn on_connection_event(
        &mut self,
        event: ConnectionEvent<Self::InboundProtocol, Self::OutboundProtocol>,
    ) {
        match event {
            ConnectionEvent::FullyNegotiatedOutbound(FullyNegotiatedOutbound {
                protocol: mut stream,
                ..
            }) => {
                let Some(ours) = self.ours.take() else {
                    return;
                };
                // The hello does not hold the connection open by itself
                // (`connection_keep_alive` does, until the peer's is heard).
                stream.ignore_for_keep_alive();
                self.sending = Some(
                    async move {
                        if let Err(e) = frame::write_frame(&mut stream, &ours).await {
                            tracing::debug!(error = %e, "direct hello not sent");
                        }
                        let _ = stream.close().await;
                        let _ = tokio::time::timeout(LINGER, until_closed(&mut stream)).await;
                    }
                    .boxed(),
                );
            }
            ConnectionEvent::FullyNegotiatedInbound(FullyNegotiatedInbound {
                protocol: mut stream,
                ..
            }) => {
                if self.heard || self.receiving.is_some() {
                    // One hello per connection: the rest are dropped unread.
                    return;
                }
                stream.ignore_for_keep_alive();
                self.receiving = Some(
                    async move {
                        let read =
                            frame::read_frame::<Credential, _>(&mut stream, MAX_FRAME_BYTES).await;
                        let _ = stream.close().await;
                        read
                    }
                    .boxed(),
                );
            }
            _ => {}
        }
    }
}
