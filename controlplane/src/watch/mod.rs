//! The `Watch` stream: routers hold one server-streaming call and receive
//! the policy in force, the active revocations and the key set, in full at
//! once and again on every change, instead of polling `GetDirectory`.
//!
//! One place owns the current event: [`WatchHub`] holds it in a tokio
//! `watch` channel, written only by the publisher ([`run_watch_publisher`]),
//! which rebuilds it when told something changed ([`WatchHub::changed`]:
//! a policy applied or re-signed, a node or token revoked, a key rotated)
//! and every `--policy-check-interval-ms` while anyone watches (what
//! another process on the same database changed). A watcher reads the
//! latest value when it is ready to send: a slow router skips states it
//! was too slow for and never has a queue that grows. Streams are bounded
//! by `--watch-max-streams` (refusals counted as limiter `watch_streams`);
//! a dead router's stream ends with its connection, which the HTTP/2
//! keepalive (`--grpc-keepalive-*`) closes; every stream ends when the
//! router's credential expires (it watches again with the refreshed one)
//! and when the control plane stops.

mod publisher;
mod stream;

use std::sync::Arc;

use agentmesh_proto::pb::controlplane::WatchEvent;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

pub use publisher::run_watch_publisher;
pub use stream::WatchStream;

/// The current watch event and the watchers' bound.
#[derive(Debug)]
pub struct WatchHub {
    current: watch::Sender<Option<Arc<WatchEvent>>>,
    stopped: watch::Sender<bool>,
    dirty: Notify,
    slots: Arc<Semaphore>,
}

impl WatchHub {
    /// A hub with no event yet, allowing `max_streams` watchers.
    pub fn new(max_streams: usize) -> Self {
        Self {
            current: watch::channel(None).0,
            stopped: watch::channel(false).0,
            dirty: Notify::new(),
            slots: Arc::new(Semaphore::new(max_streams.max(1))),
        }
    }

    /// Something an event carries changed: the publisher rebuilds it.
    pub fn changed(&self) {
        self.dirty.notify_one();
    }

    /// Watchers open now.
    pub fn watchers(&self) -> usize {
        self.current.receiver_count()
    }

    /// The event in force (`None` until the publisher first built one).
    pub fn current(&self) -> Option<Arc<WatchEvent>> {
        self.current.borrow().clone()
    }

    fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Publishes `ev` unless it carries what the current one does (the
    /// instant it was made aside). Returns whether it was published.
    fn publish(&self, ev: WatchEvent) -> bool {
        self.current.send_if_modified(|cur| {
            let same = cur.as_deref().is_some_and(|c| {
                c.policy == ev.policy && c.revocations == ev.revocations && c.keys == ev.keys
            });
            if !same {
                *cur = Some(Arc::new(ev));
            }
            !same
        })
    }

    /// Ends every stream (the control plane is stopping).
    fn stop(&self) {
        self.stopped.send_replace(true);
    }
}
