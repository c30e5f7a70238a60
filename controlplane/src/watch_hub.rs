//! The one owner of the current `Watch` event (see `crate::watch` for the
//! stream and its publisher): a tokio `watch` channel, the dirty flag that
//! asks the publisher to rebuild it, and the watchers' bound. Below the
//! state that holds it and the stream that reads it.

use std::sync::Arc;

use agentmesh_proto::pb::controlplane::WatchEvent;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

/// The current watch event and the watchers' bound.
#[derive(Debug)]
pub struct WatchHub {
    pub(crate) current: watch::Sender<Option<Arc<WatchEvent>>>,
    pub(crate) stopped: watch::Sender<bool>,
    pub(crate) dirty: Notify,
    pub(crate) slots: Arc<Semaphore>,
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

    pub(crate) fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Publishes `ev` unless it carries what the current one does (the
    /// instant it was made aside). Returns whether it was published.
    pub(crate) fn publish(&self, ev: WatchEvent) -> bool {
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
    pub(crate) fn stop(&self) {
        self.stopped.send_replace(true);
    }
}
