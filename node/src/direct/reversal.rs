//! Connection reversal (`/agentmesh/direct-reverse/1`): a member behind an
//! endpoint-dependent NAT cannot take part in a punch (the port its peer
//! would aim at is not the one its dial leaves from), but it can dial a
//! peer that an unsolicited connection reaches (a public host, a
//! full-cone NAT). It asks over the relayed connection it shares with the
//! peer, which is how it learns the peer's observed address: the peer
//! answers with the address its routers agree on (its punch candidate),
//! or refuses (its own NAT is endpoint-dependent too, or it has no
//! address yet). Agreeing opens the peer's window for one inbound direct
//! connection from the asker (`gate.rs`, as a punch does), and the asker
//! dials that address at once.
//!
//! The asker cannot tell a full-cone peer from an `eim` one (both show
//! one observed port); against an `eim` peer the dial is dropped by that
//! NAT's filtering and fails at the connect timeout, counted
//! `reversal_failed` and backed off like a failed punch.
//!
//! Wire: the asker opens one stream and writes one byte ([`ASK`]); the
//! answer is one length byte and that many bytes of the binary multiaddr
//! (`/ip4|ip6/…/tcp/…`), a zero length for a refusal. Every exchange has
//! a deadline ([`EXCHANGE_TIMEOUT`]); one question per relayed connection
//! each way, later streams are dropped unread.

use std::task::{Context, Poll};
use std::time::Duration;

use agentmesh_proto::protocols::DIRECT_REVERSE;
use futures::future::BoxFuture;
use futures::{AsyncReadExt as _, AsyncWriteExt as _, FutureExt as _};
use libp2p::core::upgrade::ReadyUpgrade;
use libp2p::swarm::handler::{
    ConnectionEvent, DialUpgradeError, FullyNegotiatedInbound, FullyNegotiatedOutbound,
};
use libp2p::swarm::{ConnectionHandler, ConnectionHandlerEvent, Stream, SubstreamProtocol};
use libp2p::{Multiaddr, StreamProtocol};

/// The protocol's id.
pub(crate) const PROTOCOL: StreamProtocol = StreamProtocol::new(DIRECT_REVERSE);
/// The question's one byte.
pub(crate) const ASK: u8 = 1;
/// How long one exchange may take, either side.
pub(crate) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the handler reports to the behaviour.
#[derive(Debug)]
pub(crate) enum Out {
    /// The peer asks us to accept its direct dial; answer with
    /// [`In::Reply`].
    Asked,
    /// The peer answered our question: the address to dial, or `None`
    /// (refused); `Err` when the exchange failed (the peer does not speak
    /// the protocol, the stream failed, the deadline passed, a malformed
    /// answer).
    Answered(Result<Option<Multiaddr>, String>),
}

/// What the behaviour tells the handler.
#[derive(Debug)]
pub(crate) enum In {
    /// Our answer to the peer's question.
    Reply(Option<Multiaddr>),
}

/// Encodes an answer: a length byte and the binary address (zero: refused).
pub(crate) fn encode_answer(addr: Option<&Multiaddr>) -> Vec<u8> {
    let bytes = addr.map(|a| a.to_vec()).unwrap_or_default();
    match u8::try_from(bytes.len()) {
        Ok(n) => std::iter::once(n).chain(bytes).collect(),
        // An address longer than 255 bytes is no address we offer.
        Err(_) => vec![0],
    }
}

/// Reads an answer (see [`encode_answer`]).
pub(crate) async fn read_answer<S>(s: &mut S) -> Result<Option<Multiaddr>, String>
where
    S: futures::AsyncRead + Unpin,
{
    let mut len = [0u8; 1];
    s.read_exact(&mut len).await.map_err(|e| e.to_string())?;
    if len[0] == 0 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; usize::from(len[0])];
    s.read_exact(&mut bytes).await.map_err(|e| e.to_string())?;
    Multiaddr::try_from(bytes)
        .map(Some)
        .map_err(|e| format!("malformed address: {e}"))
}

type Exchange<T> = BoxFuture<'static, Result<T, String>>;

fn with_deadline<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Exchange<T> {
    async move {
        tokio::time::timeout(EXCHANGE_TIMEOUT, f)
            .await
            .unwrap_or_else(|_| Err("no answer within the deadline".into()))
    }
    .boxed()
}

/// See the module doc. One per relayed connection (beside dcutr's).
pub(crate) struct Handler {
    /// We ask the peer (our NAT is endpoint-dependent), once.
    ask: bool,
    /// Our stream was asked for.
    requested: bool,
    /// Our question and its answer.
    asking: Option<Exchange<Option<Multiaddr>>>,
    /// The peer's question being read.
    reading: Option<Exchange<Stream>>,
    /// A question read, waiting for the behaviour's reply.
    waiting: Option<Stream>,
    /// Our reply being written.
    replying: Option<Exchange<()>>,
    /// A question from the peer was taken (later ones are dropped).
    taken: bool,
    /// Events for the behaviour.
    out: Option<Out>,
}

impl Handler {
    /// A handler that asks the peer when `ask`, and answers its question
    /// either way.
    pub(crate) fn new(ask: bool) -> Self {
        Self {
            ask,
            requested: false,
            asking: None,
            reading: None,
            waiting: None,
            replying: None,
            taken: false,
            out: None,
        }
    }

    /// Whether this handler asks the peer.
    #[cfg(test)]
    pub(crate) fn asks(&self) -> bool {
        self.ask
    }
}

impl ConnectionHandler for Handler {
    type FromBehaviour = In;
    type ToBehaviour = Out;
    type InboundProtocol = ReadyUpgrade<StreamProtocol>;
    type OutboundProtocol = ReadyUpgrade<StreamProtocol>;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = ();

    fn listen_protocol(&self) -> SubstreamProtocol<Self::InboundProtocol, ()> {
        SubstreamProtocol::new(ReadyUpgrade::new(PROTOCOL), ())
    }

    fn connection_keep_alive(&self) -> bool {
        // The exchange is short and has a deadline; it does not hold the
        // relayed connection open past it.
        self.asking.is_some() || self.reading.is_some() || self.replying.is_some()
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Self::OutboundProtocol, (), Out>> {
        if let Some(out) = self.out.take() {
            return Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(out));
        }
        if self.ask && !self.requested {
            self.requested = true;
            return Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest {
                protocol: SubstreamProtocol::new(ReadyUpgrade::new(PROTOCOL), ())
                    .with_timeout(EXCHANGE_TIMEOUT),
            });
        }
        if let Some(f) = self.asking.as_mut()
            && let Poll::Ready(r) = f.poll_unpin(cx)
        {
            self.asking = None;
            return Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(Out::Answered(r)));
        }
        if let Some(f) = self.reading.as_mut()
            && let Poll::Ready(r) = f.poll_unpin(cx)
        {
            self.reading = None;
            match r {
                Ok(stream) => {
                    self.waiting = Some(stream);
                    return Poll::Ready(ConnectionHandlerEvent::NotifyBehaviour(Out::Asked));
                }
                Err(e) => tracing::debug!(error = %e, "reversal question not read"),
            }
        }
        if let Some(f) = self.replying.as_mut()
            && let Poll::Ready(r) = f.poll_unpin(cx)
        {
            self.replying = None;
            if let Err(e) = r {
                tracing::debug!(error = %e, "reversal answer not sent");
            }
        }
        Poll::Pending
    }

    fn on_behaviour_event(&mut self, event: In) {
        let In::Reply(addr) = event;
        let Some(mut stream) = self.waiting.take() else {
            return;
        };
        let answer = encode_answer(addr.as_ref());
        self.replying = Some(with_deadline(async move {
            stream.write_all(&answer).await.map_err(|e| e.to_string())?;
            stream.close().await.map_err(|e| e.to_string())
        }));
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
                self.asking = Some(with_deadline(async move {
                    stream.write_all(&[ASK]).await.map_err(|e| e.to_string())?;
                    stream.flush().await.map_err(|e| e.to_string())?;
                    read_answer(&mut stream).await
                }));
            }
            ConnectionEvent::FullyNegotiatedInbound(FullyNegotiatedInbound {
                protocol: mut stream,
                ..
            }) => {
                if self.taken {
                    // One question per connection: the rest are dropped.
                    return;
                }
                self.taken = true;
                self.reading = Some(with_deadline(async move {
                    let mut b = [0u8; 1];
                    stream.read_exact(&mut b).await.map_err(|e| e.to_string())?;
                    if b[0] != ASK {
                        return Err(format!("unknown question {}", b[0]));
                    }
                    Ok(stream)
                }));
            }
            ConnectionEvent::DialUpgradeError(DialUpgradeError { error, .. }) => {
                self.out = Some(Out::Answered(Err(error.to_string())));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_reads_back_as_written_and_a_malformed_one_is_an_error() {
        let addr: Multiaddr = "/ip4/192.0.2.7/tcp/4500".parse().expect("addr");
        let mut bytes = futures::io::Cursor::new(encode_answer(Some(&addr)));
        assert_eq!(read_answer(&mut bytes).await, Ok(Some(addr)));
        let mut refused = futures::io::Cursor::new(encode_answer(None));
        assert_eq!(read_answer(&mut refused).await, Ok(None));
        // A length past the bytes sent, and bytes that are no address.
        let mut short = futures::io::Cursor::new(vec![9u8, 1, 2]);
        assert!(read_answer(&mut short).await.is_err());
        let mut garbage = futures::io::Cursor::new(vec![3u8, 0xff, 0xff, 0xff]);
        assert!(read_answer(&mut garbage).await.is_err());
    }
}
