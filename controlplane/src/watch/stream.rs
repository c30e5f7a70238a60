//! One router's watch: the checks RouterLease makes (router credential,
//! proof of possession, but made for `Watch` and bound to the watch's
//! credential, so a lease proof cannot be replayed here; node enrolled and
//! not revoked), a slot among `--watch-max-streams`, then the stream.

use std::{net::IpAddr, pin::Pin, sync::Arc, time::Duration};

use agentmesh_proto::{
    pb::controlplane::{RouterLeaseRequest, WatchEvent, WatchRequest},
    proof::Bound,
    revocations::peek_list,
    unix_now,
};
use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tonic::Status;

use crate::{enroll::node_refusal, metrics::Metrics, state::State, status::ServiceError};

/// The stream the `Watch` RPC answers with.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

/// Holds the slot and the watchers gauge for as long as the stream lives.
struct Slot {
    _permit: OwnedSemaphorePermit,
    metrics: Metrics,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.metrics.watchers_add(-1);
    }
}

struct Watcher {
    current: watch::Receiver<Option<Arc<WatchEvent>>>,
    stopped: watch::Receiver<bool>,
    /// The credential's expiry, on the runtime's clock.
    expires: tokio::time::Instant,
    peer_id: Vec<u8>,
    token_id: String,
    metrics: Metrics,
    /// The current value has not been looked at yet.
    unread: bool,
    done: bool,
    _slot: Slot,
}

impl Watcher {
    /// Whether `ev` revokes the watcher itself (the list is this
    /// process's own, so it is read without verifying).
    fn revoked_by(&self, ev: &WatchEvent, now: i64) -> bool {
        let Some(list) = ev.revocations.as_ref().and_then(peek_list) else {
            return false;
        };
        list.entries.iter().any(|r| {
            r.until_unix_secs >= now
                && ((!r.peer_id.is_empty() && r.peer_id == self.peer_id)
                    || (r.peer_id.is_empty()
                        && !r.token_id.is_empty()
                        && r.token_id == self.token_id))
        })
    }
}

/// The next item: the latest event once it changed (the first is the one
/// current when the stream opened), or an end: the control plane stops,
/// the credential expires (UNAUTHENTICATED: watch again), or an event
/// revokes the router itself (PERMISSION_DENIED).
async fn next_item(mut w: Watcher) -> Option<(Result<WatchEvent, Status>, Watcher)> {
    if w.done {
        return None;
    }
    loop {
        if std::mem::take(&mut w.unread) {
            let ev = w.current.borrow_and_update().clone();
            if let Some(ev) = ev {
                if w.revoked_by(&ev, unix_now()) {
                    w.done = true;
                    let s = Status::permission_denied("this router is revoked");
                    return Some((Err(s), w));
                }
                w.metrics.watch_event_sent();
                return Some((Ok((*ev).clone()), w));
            }
        }
        enum Woke {
            Stopped,
            Expired,
            Changed(bool),
        }
        let woke = tokio::select! {
            biased;
            _ = w.stopped.wait_for(|s| *s) => Woke::Stopped,
            _ = tokio::time::sleep_until(w.expires) => Woke::Expired,
            r = w.current.changed() => Woke::Changed(r.is_ok()),
        };
        match woke {
            Woke::Stopped | Woke::Changed(false) => return None,
            Woke::Expired => {
                w.done = true;
                let s = Status::unauthenticated(
                    "the watch's credential expired; watch again with the refreshed one",
                );
                return Some((Err(s), w));
            }
            // `changed` marked the value seen: read it on the next turn.
            Woke::Changed(true) => w.unread = true,
        }
    }
}

impl State {
    /// `Watch`, in [`crate::request_limits`]'s order: nothing to verify from a
    /// source over its failures is refused at once; the source's
    /// unauthenticated share; the lease's checks (a failure is judged
    /// against the source, a verified router is served whatever its
    /// address's failures); the node in the database; then a slot.
    pub async fn watch_stream(
        &self,
        source: Option<IpAddr>,
        req: WatchRequest,
    ) -> Result<WatchStream, ServiceError> {
        if req.credential.is_none() || req.proof.is_none() {
            self.limits
                .refuse_unverifiable(source, "credential and proof of possession")?;
        }
        self.limits.check_unauth(source)?;
        let now = unix_now();
        let bound = req.binding();
        let lease_like = RouterLeaseRequest {
            credential: req.credential,
            proof: req.proof,
            ..Default::default()
        };
        // A proof made for `Watch` with this credential: a lease proof, or a
        // watch proof seen with another credential, is refused (`bad_proof`).
        let (claims, peer) = self
            .limits
            .judge(source, self.verify_lease(&lease_like, &bound, now))?;
        let peer_id = peer.to_bytes();
        self.db
            .run(self.db.store().touch_node(&peer_id, now, None))
            .await?
            .map_err(node_refusal)?;
        let permit = self.watch.try_slot().ok_or(ServiceError::Limited {
            limiter: "watch_streams",
            wait: Duration::from_secs(1),
        })?;
        self.metrics.watchers_add(1);
        let slot = Slot {
            _permit: permit,
            metrics: self.metrics.clone(),
        };
        let left = (claims.claims.expires_at_unix_secs - now).max(0) as u64;
        let current = self.watch.current.subscribe();
        if current.borrow().is_none() {
            self.watch.changed();
        }
        let w = Watcher {
            current,
            stopped: self.watch.stopped.subscribe(),
            expires: tokio::time::Instant::now() + Duration::from_secs(left),
            peer_id,
            token_id: claims.claims.token_id.clone(),
            metrics: self.metrics.clone(),
            unread: true,
            done: false,
            _slot: slot,
        };
        Ok(Box::pin(futures::stream::unfold(w, next_item)))
    }
}
