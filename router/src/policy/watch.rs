//! The control-plane `Watch` stream: the router holds one server-streaming
//! call (its credential and a proof of possession made for `Watch`; a
//! control plane from before that purpose refuses it, and the router stays
//! on the directory poll until the control plane is upgraded too), and takes each event (policy,
//! revocations, keys) at once, so a change reaches it in one round trip
//! instead of one lease interval.
//!
//! When the control plane asks the router to move the watch (the replica
//! is stopping, or the watch reached the replica's maximum age: a "move"
//! status, `agentmesh_controlplane::client::WatchMove`), the router watches
//! again at once, after a jitter of at most 250 ms so a fleet told together
//! does not arrive together: not on a stopping replica (the client avoids
//! it), and after a maximum age on the next replica of the client's
//! rotation, so routers' watches spread over the replicas. Nothing is
//! lost: every watch's first event is the whole state in force.
//!
//! When the control plane does not serve it (`UNIMPLEMENTED`, an older
//! control plane) or the stream fails, the directory poll (`crate::cp`)
//! still brings the policy every lease interval, and the watch is tried
//! again after a jittered backoff that doubles up to
//! `--policy-watch-backoff-max-ms`. `agentmesh_router_policy_watch_up`
//! says which of the two is in charge, and
//! `agentmesh_router_policy_watch_ends_total{reason}` why watches ended. A
//! quiet stream is legitimate (no change); the shared client's HTTP/2
//! keep-alives (sent while a stream is open,
//! `--control-plane-keepalive-*-secs`) notice a replica that is gone. The
//! watch is opened by the same `Client` the lease uses
//! (`Client::open_watch`), so it shares its channels, TLS and bounded
//! retries.

use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientError, WatchMove, move_jitter};
use libp2p::identity::Keypair;
use rand::Rng as _;
use tokio_util::sync::CancellationToken;

use super::PolicyCtx;

/// First wait after a failed attempt.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// How often a router with no credential yet looks again.
const NO_CREDENTIAL_WAIT: Duration = Duration::from_secs(1);

/// What the watch needs.
#[derive(Clone)]
pub(crate) struct Watch {
    pub(crate) ctx: PolicyCtx,
    pub(crate) keypair: Keypair,
    /// The router's control-plane client (its channel, TLS, keep-alive and
    /// bounded retries of the opening; the proof signs its URL).
    pub(crate) client: Client,
    pub(crate) backoff_max: Duration,
}

/// Why one watch attempt ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchEnd {
    #[error("control plane does not serve Watch")]
    Unimplemented,
    #[error("watch not opened: {0}")]
    Open(ClientError),
    #[error("the control plane moved the watch ({})", .0.as_str())]
    Moved(WatchMove),
    #[error("watch refused: {0}")]
    Status(tonic::Status),
    #[error("watch stream ended")]
    Ended,
}

impl WatchEnd {
    /// The label of `agentmesh_router_policy_watch_ends_total`.
    fn reason(&self) -> &'static str {
        match self {
            Self::Moved(m) => m.as_str(),
            Self::Open(_) | Self::Unimplemented => "open_failed",
            Self::Status(s) if lost_connection(s) => "connection_lost",
            Self::Status(_) => "refused",
            Self::Ended => "ended",
        }
    }
}

/// Whether a stream's error is its connection breaking (a reset, a
/// keep-alive unanswered) rather than an answer: a status the control
/// plane sent comes from the stream's trailers and has no source error;
/// one tonic made from a transport failure carries that failure.
fn lost_connection(s: &tonic::Status) -> bool {
    std::error::Error::source(s).is_some()
}

/// Holds the watch until `cancel` fires.
pub(crate) async fn run(w: Watch, cancel: CancellationToken) {
    let mut backoff = BACKOFF_MIN;
    let mut said_unimplemented = false;
    loop {
        let end = tokio::select! {
            _ = cancel.cancelled() => return,
            end = attempt(&w, &mut backoff) => end,
        };
        let metrics = w.ctx.state.metrics();
        metrics.watch_up.set(0);
        metrics.watch_ended(end.reason());
        let wait = match end {
            WatchEnd::Moved(m) => {
                tracing::debug!(
                    reason = m.as_str(),
                    "control plane moved the Watch; watching again at once"
                );
                backoff = BACKOFF_MIN;
                move_jitter()
            }
            WatchEnd::Unimplemented if !said_unimplemented => {
                said_unimplemented = true;
                tracing::info!(
                    "control plane does not serve Watch yet: the directory poll brings the policy; retrying with backoff"
                );
                next_backoff(&mut backoff, w.backoff_max)
            }
            WatchEnd::Unimplemented => next_backoff(&mut backoff, w.backoff_max),
            e => {
                tracing::warn!(error = %e, "control-plane Watch ended; the directory poll covers until it is back");
                next_backoff(&mut backoff, w.backoff_max)
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The jittered wait after a failure, doubling `backoff` up to `max`.
fn next_backoff(backoff: &mut Duration, max: Duration) -> Duration {
    let wait = jittered(*backoff);
    *backoff = (*backoff * 2).min(max.max(BACKOFF_MIN));
    wait
}

/// One watch: open it (`Client::open_watch`: a fresh `Purpose::Watch`
/// proof per attempt, retried within the client's budget), then take
/// events until it ends. Resets `backoff` once the stream is up.
async fn attempt(w: &Watch, backoff: &mut Duration) -> WatchEnd {
    let credential = loop {
        if let Some(c) = w.ctx.link.credential.read().clone() {
            break c;
        }
        tokio::time::sleep(NO_CREDENTIAL_WAIT).await;
    };
    let mut watching = match w.client.open_watch(&credential, &w.keypair).await {
        Ok(s) => s,
        Err(e)
            if e.status()
                .is_some_and(|s| s.code() == tonic::Code::Unimplemented) =>
        {
            return WatchEnd::Unimplemented;
        }
        Err(e) => return WatchEnd::Open(e),
    };
    w.ctx.state.metrics().watch_up.set(1);
    *backoff = BACKOFF_MIN;
    tracing::info!(endpoint = %watching.endpoint, "control-plane Watch up");
    loop {
        match watching.stream.message().await {
            Ok(Some(ev)) => {
                w.ctx.state.metrics().watch_events.inc();
                if let Some(keys) = ev.keys.clone().filter(|k| !k.keys.is_empty()) {
                    // A failure is logged and counted by the handle; the
                    // lease round's key sync installs them.
                    let _ = w.ctx.tables.set_keys(keys).await;
                }
                w.ctx
                    .take(ev.policy.as_ref(), ev.revocations.as_ref(), "watch")
                    .await;
            }
            Ok(None) => return WatchEnd::Ended,
            Err(s) if s.code() == tonic::Code::Unimplemented => return WatchEnd::Unimplemented,
            Err(s) => {
                return match w.client.watch_ended(&watching.endpoint, &s) {
                    Some(m) => WatchEnd::Moved(m),
                    None => WatchEnd::Status(s),
                };
            }
        }
    }
}

/// `d` ± 20%.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.8..1.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_is_counted_under_its_reason() {
        let moved = WatchMove::Stopping.status("stopping");
        assert_eq!(
            WatchEnd::Moved(WatchMove::of(&moved).expect("a move")).reason(),
            "stopping"
        );
        assert_eq!(WatchEnd::Moved(WatchMove::MaxAge).reason(), "max_age");
        // A status the control plane sent (from the trailers: no source).
        let refused = tonic::Status::unauthenticated("the watch's credential expired");
        assert_eq!(WatchEnd::Status(refused).reason(), "refused");
        // The connection broke under the stream (tonic keeps the cause).
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost = tonic::Status::from_error(Box::new(io));
        assert_eq!(WatchEnd::Status(lost).reason(), "connection_lost");
        assert_eq!(WatchEnd::Ended.reason(), "ended");
        assert_eq!(WatchEnd::Unimplemented.reason(), "open_failed");
        // Every reason is a pre-created label.
        for r in [
            "stopping",
            "max_age",
            "connection_lost",
            "refused",
            "ended",
            "open_failed",
        ] {
            assert!(crate::policy_metrics::WATCH_ENDS.contains(&r), "{r}");
        }
    }
}
