//! One protocol's queue of negotiated inbound streams waiting for its
//! accept loop, shared fairly by the peers that fill it.
//!
//! The bound binds only when the queue is full, and then by peer (the
//! PeerId the connection proved): a stream from a peer holding fewer
//! queued streams than the heaviest peer takes the place of that peer's
//! oldest one (which is dropped, `preempted`); a stream from a peer that
//! already holds the most is dropped (`queue_full`). So one peer opening
//! streams faster than the accept loop takes them cannot keep another
//! peer's stream out, while any one peer may fill the queue when nobody
//! else needs it. The same max-min rule as the programs' fair slot budgets
//! (`agentmesh-fair`), here keyed by peer: an unauthenticated peer mints a
//! fresh PeerId per connection, so this is also a per-connection share for
//! strangers, and the programs bound strangers per source after the queue.

use std::collections::{HashMap, VecDeque};
use std::task::{Context, Poll, Waker};

use libp2p::PeerId;
use parking_lot::Mutex;

/// What became of an item offered to a full queue.
#[derive(Debug)]
pub(crate) enum Pushed<T> {
    /// Queued; nothing dropped.
    Queued,
    /// Queued in the place of the heaviest peer's oldest item, returned
    /// here to be dropped.
    Preempted(T),
    /// Not queued: the queue is full and this peer holds the most.
    Full(T),
    /// Not queued: nobody takes from the queue any more.
    Closed(T),
}

struct Inner<T> {
    items: VecDeque<(PeerId, T)>,
    /// Queued items per peer (no entry at 0).
    held: HashMap<PeerId, usize>,
    waker: Option<Waker>,
    closed: bool,
}

/// A bounded queue of `(peer, item)`, fair by peer when full; one consumer.
pub(crate) struct FairQueue<T> {
    inner: Mutex<Inner<T>>,
    capacity: usize,
}

impl<T> FairQueue<T> {
    /// A queue of at most `capacity` (at least 1) items.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                held: HashMap::new(),
                waker: None,
                closed: false,
            }),
            capacity: capacity.max(1),
        }
    }

    /// Offers `item` from `peer`. O(capacity) when full (the queue is
    /// small by design), O(1) otherwise.
    pub(crate) fn push(&self, peer: PeerId, item: T) -> Pushed<T> {
        let mut inner = self.inner.lock();
        if inner.closed {
            return Pushed::Closed(item);
        }
        let mut dropped = None;
        if inner.items.len() >= self.capacity {
            let mine = inner.held.get(&peer).copied().unwrap_or(0);
            let heaviest = inner
                .held
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(p, n)| (*p, *n));
            match heaviest {
                Some((h, n)) if mine < n => {
                    let Some(i) = inner.items.iter().position(|(p, _)| *p == h) else {
                        return Pushed::Full(item);
                    };
                    let (_, old) = inner.items.remove(i).expect("position is in range");
                    release(&mut inner.held, h);
                    dropped = Some(old);
                }
                _ => return Pushed::Full(item),
            }
        }
        inner.items.push_back((peer, item));
        *inner.held.entry(peer).or_insert(0) += 1;
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
        match dropped {
            Some(old) => Pushed::Preempted(old),
            None => Pushed::Queued,
        }
    }

    /// The oldest item, or registers the waker for the next push.
    pub(crate) fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<T> {
        let mut inner = self.inner.lock();
        match inner.items.pop_front() {
            Some((peer, item)) => {
                release(&mut inner.held, peer);
                Poll::Ready(item)
            }
            None => {
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// Refuses further pushes and drops what is queued.
    pub(crate) fn close(&self) {
        let items = {
            let mut inner = self.inner.lock();
            inner.closed = true;
            inner.held.clear();
            std::mem::take(&mut inner.items)
        };
        drop(items);
    }

    /// Whether [`FairQueue::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }
}

fn release(held: &mut HashMap<PeerId, usize>, peer: PeerId) {
    if let Some(n) = held.get_mut(&peer) {
        *n -= 1;
        if *n == 0 {
            held.remove(&peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pop(q: &FairQueue<u32>) -> Option<u32> {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        match q.poll_pop(&mut cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }

    fn drain(q: &FairQueue<u32>) -> Vec<u32> {
        std::iter::from_fn(|| pop(q)).collect()
    }

    #[test]
    fn one_peer_may_fill_the_queue_when_alone() {
        let q = FairQueue::new(4);
        let a = PeerId::random();
        for i in 0..4 {
            assert!(matches!(q.push(a, i), Pushed::Queued));
        }
        assert!(matches!(q.push(a, 4), Pushed::Full(4)));
        assert_eq!(drain(&q), [0, 1, 2, 3]);
    }

    #[test]
    fn a_peer_holding_fewer_takes_the_heaviest_peers_oldest_place() {
        let q = FairQueue::new(4);
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        for i in 0..4 {
            q.push(a, i);
        }
        // b holds none: it takes a's oldest (0).
        assert!(matches!(q.push(b, 10), Pushed::Preempted(0)));
        // a holds 3, b 1: b still holds fewer and takes a's next oldest.
        assert!(matches!(q.push(b, 11), Pushed::Preempted(1)));
        // 2 and 2: b is among the heaviest now and is refused; so is a.
        assert!(matches!(q.push(b, 12), Pushed::Full(12)));
        assert!(matches!(q.push(a, 5), Pushed::Full(5)));
        // c holds none and takes from a heaviest one.
        assert!(matches!(q.push(c, 20), Pushed::Preempted(_)));
        let left = drain(&q);
        assert_eq!(left.len(), 4);
        assert!(left.contains(&20) && left.contains(&11), "{left:?}");
        // The counts follow what was taken: a peer alone may fill it again.
        for i in 0..4 {
            assert!(matches!(q.push(c, 30 + i), Pushed::Queued));
        }
    }

    #[test]
    fn a_closed_queue_refuses_and_forgets() {
        let q = FairQueue::new(2);
        let a = PeerId::random();
        q.push(a, 1);
        q.close();
        assert!(q.is_closed());
        assert!(matches!(q.push(a, 2), Pushed::Closed(2)));
        assert_eq!(drain(&q), Vec::<u32>::new());
    }
}
