//! What an inbound call stream may hold before its request is read.
//!
//! A caller's credential is in its request, so until the request is read
//! the provider knows the caller only by the PeerId its connection's
//! handshake proved. That is enough to share fairly: every call stream
//! holds one of `--max-inbound-call-requests` request slots from the moment
//! it arrives until its request is read, shared by caller PeerId (max-min,
//! binding only when all are taken: see `agentmesh_fair::FairSlots`). A
//! caller alone may use them all; once they are all taken, a caller holding
//! fewer than the heaviest takes that caller's oldest stream, and the
//! heaviest is refused more. PeerIds, not addresses: every caller is an
//! enrolled member whose identity costs an enrollment, and members behind
//! one NAT (or one relay) must not share one share.
//!
//! A stream must send its first byte within `--call-first-byte-timeout-ms`
//! ([`FirstByte`]) or it is closed: a silent stream is an attack or a
//! broken caller, never a slow one (the request follows the stream at
//! once). The whole request still has `--call-timeout-secs`.
//!
//! Every refusal is counted in `agentmesh_node_calls_total{direction="inbound"}`
//! with its reason and logged at most once a minute per caller (the node's
//! log gate, kind `call_refused`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agentmesh_fair::{FairSlots, Slot, SlotRefusal};
use agentmesh_runtime::log_gate::LogGate;
use futures::AsyncRead;
use libp2p::PeerId;
use tokio::time::Sleep;

/// Reason a stream's slot was refused: every slot is taken and its caller
/// holds at least its fair share.
pub(crate) const CALLER_SHARE: &str = "caller_share";
/// Reason a stream was closed before its request: its slot was taken for
/// a caller holding fewer.
pub(crate) const PREEMPTED: &str = "preempted";
/// Reason a stream was closed: no byte within the first-byte deadline.
pub(crate) const SILENT: &str = "silent";

/// The request slots of one provider, shared by caller PeerId.
pub(crate) struct RequestSlots {
    slots: FairSlots<PeerId>,
    log: LogGate<PeerId>,
}

impl RequestSlots {
    /// `capacity` request slots (at least 1), refusals logged through `log`.
    pub(crate) fn new(capacity: usize, log: LogGate<PeerId>) -> Self {
        Self {
            slots: FairSlots::keyed(capacity),
            log,
        }
    }

    /// A slot for a new call stream of `peer`, or why not. When this takes
    /// another caller's slot, that caller's stream sees
    /// [`RequestSlot::preempted`].
    pub(crate) fn try_acquire(&self, peer: PeerId) -> Result<RequestSlot, SlotRefusal<PeerId>> {
        let granted = self.slots.try_acquire_key(peer)?;
        Ok(RequestSlot(granted.slot))
    }

    /// Slots held now, all callers.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.in_use()
    }

    /// Logs a refusal of `peer` with `reason`, at most once a minute per caller.
    pub(crate) fn log_refusal(&self, peer: PeerId, reason: &'static str, detail: &str) {
        if let Some(suppressed) = self.log.pass(&peer, "call_refused") {
            tracing::warn!(
                %peer,
                reason,
                detail,
                suppressed,
                "inbound call stream refused before its request (logged at most once a minute per caller)"
            );
        }
    }
}

/// One call stream's request slot; freed on drop (once the request is read).
pub(crate) struct RequestSlot(Slot<PeerId>);

impl RequestSlot {
    /// Completes once the slot was taken for another caller: close the stream.
    pub(crate) async fn preempted(&self) {
        self.0.revoked().await;
    }
}

/// A reader that fails with `TimedOut` when no byte arrived within its
/// deadline; after the first byte it reads as the stream does. Wraps the
/// stream for the call's request frame, so the framing stays as it is.
pub(crate) struct FirstByte<'a, S> {
    inner: &'a mut S,
    deadline: Pin<Box<Sleep>>,
    seen: bool,
    timed_out: bool,
}

impl<'a, S> FirstByte<'a, S> {
    /// Reads from `inner`, its first byte due within `timeout`.
    pub(crate) fn new(inner: &'a mut S, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            seen: false,
            timed_out: false,
        }
    }

    /// Whether the read failed because no byte came in time.
    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstByte<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut *this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.seen |= n > 0;
                Poll::Ready(Ok(n))
            }
            Poll::Pending if !this.seen && this.deadline.as_mut().poll(cx).is_ready() => {
                this.timed_out = true;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no byte within the first-byte deadline (--call-first-byte-timeout-ms)",
                )))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::AsyncReadExt as _;
    use tokio::io::AsyncWriteExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;

    #[test]
    fn a_caller_alone_may_hold_every_slot_and_a_newcomer_takes_its_oldest() {
        let slots = RequestSlots::new(3, LogGate::default());
        let (attacker, member) = (PeerId::random(), PeerId::random());
        let held: Vec<_> = (0..3)
            .map(|_| slots.try_acquire(attacker).expect("room"))
            .collect();
        let r = slots.try_acquire(attacker).err().expect("holds all");
        assert_eq!((r.source, r.held), (attacker, 3));
        let _m = slots.try_acquire(member).expect("the member gets in");
        assert!(held[0].0.is_revoked(), "the attacker's oldest was taken");
        assert!(!held[1].0.is_revoked());
        assert_eq!(slots.in_use(), 3);
        drop(held);
        assert_eq!(slots.in_use(), 1);
    }

    /// Paused time over an in-memory stream: the deadline fires exactly
    /// when due and the late bytes come exactly after it, with no wall
    /// time spent and no race with a loaded machine.
    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_times_out_and_a_slow_one_after_its_first_byte_does_not() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut rx = rx.compat();
        // Silent: times out at the deadline.
        let mut first = FirstByte::new(&mut rx, Duration::from_millis(100));
        let mut buf = [0u8; 4];
        let e = first.read(&mut buf).await.expect_err("silent");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(first.timed_out());

        // One byte in time, the rest long after the deadline: no timeout.
        let mut first = FirstByte::new(&mut rx, Duration::from_millis(100));
        tx.write_all(b"x").await.expect("write");
        assert_eq!(first.read(&mut buf).await.expect("first byte"), 1);
        let late = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            tx.write_all(b"yz").await.expect("write");
        };
        let (n, ()) = tokio::join!(first.read(&mut buf), late);
        assert_eq!(n.expect("read after the deadline"), 2);
        assert!(!first.timed_out());
    }
}
