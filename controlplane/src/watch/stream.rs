//! One router's watch: the checks RouterLease makes (router credential,
//! proof of possession, but made for `Watch` and bound to the watch's
//! credential, so a lease proof cannot be replayed here; node enrolled and
//! not revoked), a slot among `--watch-max-streams`, then the stream.
//!
//! A stream ends with a "move" status ([`WatchMove`]: UNAVAILABLE and the
//! `watch-move` metadata) when the router should watch again at once:
//! this replica is stopping (`stopping`, sent before the gRPC server
//! drains, so routers move while their connection still answers), or the
//! stream reached its age (`max_age`: between half of
//! `--watch-max-age-secs` and all of it, drawn per stream, so a fleet
//! that opened together does not move together). Every end is counted in
//! `watch_ends_total{reason}`.

use std::{net::IpAddr, pin::Pin, sync::Arc, time::Duration};

use agentmesh_proto::{
    pb::controlplane::{RouterLeaseRequest, WatchEvent, WatchRequest},
    proof::Bound,
    revocations::peek_list,
    unix_now,
};
use futures::Stream;
use rand::Rng as _;
use tokio::{
    sync::{OwnedSemaphorePermit, watch},
    time::Instant,
};
use tonic::Status;

use crate::{
    client::WatchMove, enroll::node_refusal, metrics::Metrics, state::State, status::ServiceError,
};

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
    expires: Instant,
    /// When the stream is moved (`--watch-max-age-secs`); `None`: never.
    move_at: Option<Instant>,
    peer_id: Vec<u8>,
    token_id: String,
    metrics: Metrics,
    /// The current value has not been looked at yet.
    unread: bool,
    /// Why the stream ended (a label of `watch_ends_total`), once it did.
    ended: Option<&'static str>,
    _slot: Slot,
}

impl Drop for Watcher {
    /// Counts the end; a stream dropped before it ended was closed by the
    /// router or with its connection.
    fn drop(&mut self) {
        self.metrics.watch_ended(self.ended.unwrap_or("closed"));
    }
}

/// A stream's age at which it is moved: uniform between half of `max` and
/// `max` (`None` when `max` is zero: never).
fn move_after(max: Duration) -> Option<Duration> {
    if max.is_zero() {
        return None;
    }
    Some(max.mul_f64(rand::thread_rng().gen_range(0.5..=1.0)))
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
/// current when the stream opened), or an end: the control plane stops
/// (a move elsewhere), the stream reaches its age (a move), the
/// credential expires (UNAUTHENTICATED: watch again), or an event revokes
/// the router itself (PERMISSION_DENIED).
async fn next_item(mut w: Watcher) -> Option<(Result<WatchEvent, Status>, Watcher)> {
    if w.ended.is_some() {
        return None;
    }
    loop {
        if std::mem::take(&mut w.unread) {
            let ev = w.current.borrow_and_update().clone();
            if let Some(ev) = ev {
                if w.revoked_by(&ev, unix_now()) {
                    w.ended = Some("revoked");
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
            Aged,
            Changed,
        }
        let move_at = w.move_at;
        let woke = tokio::select! {
            biased;
            _ = w.stopped.wait_for(|s| *s) => Woke::Stopped,
            _ = tokio::time::sleep_until(w.expires) => Woke::Expired,
            _ = sleep_until_some(move_at) => Woke::Aged,
            r = w.current.changed() => if r.is_ok() { Woke::Changed } else { Woke::Stopped },
        };
        let (reason, status) = match woke {
            // `changed` marked the value seen: read it on the next turn.
            Woke::Changed => {
                w.unread = true;
                continue;
            }
            Woke::Stopped => (
                "stopping",
                WatchMove::Stopping
                    .status("this control-plane replica is stopping: watch again on another"),
            ),
            Woke::Aged => (
                "max_age",
                WatchMove::MaxAge.status(
                    "this watch reached --watch-max-age-secs: watch again (the next replica)",
                ),
            ),
            Woke::Expired => (
                "credential_expired",
                Status::unauthenticated(
                    "the watch's credential expired; watch again with the refreshed one",
                ),
            ),
        };
        w.ended = Some(reason);
        return Some((Err(status), w));
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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
        let opened = Instant::now();
        let max_age = Duration::from_secs(self.config.watch_max_age_secs);
        let w = Watcher {
            current,
            stopped: self.watch.stopped.subscribe(),
            expires: opened + Duration::from_secs(left),
            move_at: move_after(max_age).map(|age| opened + age),
            peer_id,
            token_id: claims.claims.token_id.clone(),
            metrics: self.metrics.clone(),
            unread: true,
            ended: None,
            _slot: slot,
        };
        Ok(Box::pin(futures::stream::unfold(w, next_item)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_moves_between_half_its_max_age_and_all_of_it() {
        assert_eq!(move_after(Duration::ZERO), None, "0: never");
        let max = Duration::from_secs(300);
        let ages: Vec<_> = (0..500).map(|_| move_after(max).expect("an age")).collect();
        assert!(ages.iter().all(|a| *a >= max / 2 && *a <= max));
        let early = ages.iter().filter(|a| **a < max * 3 / 4).count();
        // Uniform: about half below three quarters; far from all or none.
        assert!((100..400).contains(&early), "spread: {early} of 500");
    }
}
