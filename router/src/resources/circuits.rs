//! Live circuits as the muxer sees them (outbound STOP streams whose
//! source is known), so a policy change or a revocation can close the ones
//! it no longer allows.
//!
//! rust-libp2p's relay gives no hook that sees both ends of a circuit and
//! keeps no handle to close one. Our muxer does see both (destination: the
//! connection's peer; source: the STOP request the relay writes), and the
//! STOP stream *is* the destination half of the circuit: when it fails,
//! the relay's copy task ends and closes the source's half too. So each
//! circuit registers a [`Cut`] here; cutting it makes the stream's next
//! read or write fail, and wakes the task so an idle circuit closes too.
//!
//! A circuit checked under the old policy and registered after a change's
//! sweep took its snapshot would survive that change; [`LiveCircuits::sweeps`]
//! closes the gap: a sweep counts itself before its snapshot, and the muxer
//! checks again when a sweep started between its check and its
//! registration (the new policy is in place before any sweep starts).
//!
//! The registry also marks circuits upgraded away ([`LiveCircuits::mark_upgraded`]):
//! a member whose circuit was replaced by a direct connection says so, and
//! only it can (the circuit is end-to-end encrypted, the direct connection
//! never touches us). A mark needs a live circuit between that member and
//! the peer it names, either end, not marked before: a lying member can
//! mark only its own live circuits, each once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Context;

use futures::task::AtomicWaker;
use libp2p::PeerId;
use parking_lot::Mutex;

/// A circuit's off switch, shared by its stream and the registry.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    cut: AtomicBool,
    waker: AtomicWaker,
}

impl Cut {
    /// Whether the circuit was cut; registers `cx` to be woken when it is.
    pub(crate) fn poll_is_cut(&self, cx: &Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.cut.load(Ordering::Acquire)
    }

    /// Cuts the circuit and wakes its stream's task.
    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A registered circuit, released (unregistered) on drop of its stream.
#[derive(Debug)]
pub(crate) struct Registered {
    pub(crate) id: u64,
    pub(crate) cut: Arc<Cut>,
}

/// The live circuits by id (one entry per STOP stream with a known source;
/// bounded by the circuit budgets that admitted them).
#[derive(Debug, Default)]
pub(crate) struct LiveCircuits {
    inner: Mutex<Inner>,
    /// Sweeps started (see the module doc).
    sweeps: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    circuits: HashMap<u64, Entry>,
}

/// One live circuit: its source, its destination, its off switch, and
/// whether a member at one of its ends said it was upgraded away.
#[derive(Debug)]
struct Entry {
    source: PeerId,
    destination: PeerId,
    cut: Arc<Cut>,
    upgraded: bool,
}

/// Why an upgrade notice marked no circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkRefusal {
    /// No live circuit runs between the member and the peer it named.
    NoSuchCircuit,
    /// Every live circuit between them is marked already.
    Duplicate,
}

impl LiveCircuits {
    /// Registers the circuit `source → destination`.
    pub(crate) fn register(&self, source: PeerId, destination: PeerId) -> Registered {
        let mut g = self.inner.lock();
        g.next += 1;
        let id = g.next;
        let cut = Arc::new(Cut::default());
        g.circuits.insert(
            id,
            Entry {
                source,
                destination,
                cut: cut.clone(),
                upgraded: false,
            },
        );
        Registered { id, cut }
    }

    /// Marks one live circuit between `member` and `peer` (either end) as
    /// upgraded away, the oldest not marked yet (see the module doc).
    pub(crate) fn mark_upgraded(&self, member: &PeerId, peer: &PeerId) -> Result<(), MarkRefusal> {
        let mut g = self.inner.lock();
        let mut between = g
            .circuits
            .iter_mut()
            .filter(|(_, e)| {
                (e.source == *member && e.destination == *peer)
                    || (e.source == *peer && e.destination == *member)
            })
            .peekable();
        if between.peek().is_none() {
            return Err(MarkRefusal::NoSuchCircuit);
        }
        let oldest = between
            .filter(|(_, e)| !e.upgraded)
            .min_by_key(|(id, _)| **id)
            .ok_or(MarkRefusal::Duplicate)?;
        oldest.1.upgraded = true;
        Ok(())
    }

    /// Sweeps started so far.
    pub(crate) fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::SeqCst)
    }

    /// Forgets circuit `id` (its stream is gone).
    pub(crate) fn release(&self, id: u64) {
        let mut g = self.inner.lock();
        g.circuits.remove(&id);
        crate::shrink::ShrinkSparse::shrink_sparse(&mut g.circuits);
    }

    /// Cuts every circuit `allowed(source, destination)` says no to;
    /// returns how many. `allowed` runs without the registry's lock held.
    pub(crate) fn cut_unless(&self, allowed: impl Fn(&PeerId, &PeerId) -> bool) -> usize {
        self.sweeps.fetch_add(1, Ordering::SeqCst);
        let live: Vec<(u64, PeerId, PeerId, Arc<Cut>)> = self
            .inner
            .lock()
            .circuits
            .iter()
            .map(|(id, e)| (*id, e.source, e.destination, e.cut.clone()))
            .collect();
        let mut n = 0;
        for (_, s, d, c) in live {
            if !c.cut.load(Ordering::Acquire) && !allowed(&s, &d) {
                c.cut();
                n += 1;
            }
        }
        n
    }

    /// Circuits registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().circuits.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_circuits_no_longer_allowed_are_cut_and_woken() {
        let live = LiveCircuits::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let ab = live.register(a, b);
        let cb = live.register(c, b);
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker = waker_counting(woken.clone());
        let cx = Context::from_waker(&waker);
        assert!(!ab.cut.poll_is_cut(&cx) && !cb.cut.poll_is_cut(&cx));
        assert_eq!(live.cut_unless(|s, _| *s != a), 1);
        assert!(ab.cut.poll_is_cut(&cx), "a→b is cut");
        assert!(!cb.cut.poll_is_cut(&cx), "c→b stays");
        assert_eq!(
            woken.load(Ordering::SeqCst),
            1,
            "the cut stream's task is woken"
        );
        assert_eq!(
            live.cut_unless(|s, _| *s != a),
            0,
            "a cut circuit is not cut twice"
        );
        live.release(ab.id);
        live.release(cb.id);
        assert_eq!(live.len(), 0, "released circuits leave the registry");
    }

    #[test]
    fn a_member_marks_only_its_own_live_circuits_each_once() {
        let live = LiveCircuits::default();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let ab = live.register(a, b);
        // c names a's circuit with b: not its own.
        assert_eq!(live.mark_upgraded(&c, &b), Err(MarkRefusal::NoSuchCircuit));
        assert_eq!(live.mark_upgraded(&c, &a), Err(MarkRefusal::NoSuchCircuit));
        // Either end may mark it, once.
        assert_eq!(live.mark_upgraded(&b, &a), Ok(()));
        assert_eq!(live.mark_upgraded(&a, &b), Err(MarkRefusal::Duplicate));
        // A second circuit between them is a second mark, and no more.
        let ba = live.register(b, a);
        assert_eq!(live.mark_upgraded(&a, &b), Ok(()));
        assert_eq!(live.mark_upgraded(&a, &b), Err(MarkRefusal::Duplicate));
        // A circuit gone is no circuit.
        live.release(ab.id);
        live.release(ba.id);
        assert_eq!(live.mark_upgraded(&a, &b), Err(MarkRefusal::NoSuchCircuit));
    }

    fn waker_counting(n: Arc<std::sync::atomic::AtomicUsize>) -> std::task::Waker {
        struct W(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for W {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        std::task::Waker::from(Arc::new(W(n)))
    }
}
