//! The control-plane `Watch` stream: the router holds one server-streaming
//! call (its credential and a proof of possession made for `Watch`; a
//! control plane from before that purpose refuses it, and the router stays
//! on the directory poll until the control plane is upgraded too), and takes each event (policy,
//! revocations, keys) at once, so a change reaches it in one round trip
//! instead of one lease interval.
//!
//! When the control plane does not serve it (`UNIMPLEMENTED`, an older
//! control plane) or the stream fails, the directory poll (`crate::cp`)
//! still brings the policy every lease interval, and the watch is tried
//! again after a jittered backoff that doubles up to
//! `--policy-watch-backoff-max-ms`. `agentmesh_router_policy_watch_up`
//! says which of the two is in charge. A quiet stream is legitimate (no
//! change); the shared client's HTTP/2 keep-alives (sent while a stream
//! is open) notice a control plane that is gone. The watch is opened by
//! the same `Client` the lease uses (`Client::watch`), so it shares its
//! channel, TLS and bounded retries.

use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientError};
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
    #[error("watch refused: {0}")]
    Status(tonic::Status),
    #[error("watch stream ended")]
    Ended,
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
        w.ctx.state.metrics().watch_up.set(0);
        match end {
            WatchEnd::Unimplemented if !said_unimplemented => {
                said_unimplemented = true;
                tracing::info!(
                    "control plane does not serve Watch yet: the directory poll brings the policy; retrying with backoff"
                );
            }
            WatchEnd::Unimplemented => {}
            e => {
                tracing::warn!(error = %e, "control-plane Watch ended; the directory poll covers until it is back")
            }
        }
        let wait = jittered(backoff);
        backoff = (backoff * 2).min(w.backoff_max.max(BACKOFF_MIN));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One watch: open it (`Client::watch`: a fresh `Purpose::Watch` proof
/// per attempt, retried within the client's budget), then take events
/// until it ends. Resets `backoff` once the stream is up.
async fn attempt(w: &Watch, backoff: &mut Duration) -> WatchEnd {
    let credential = loop {
        if let Some(c) = w.ctx.link.credential.read().clone() {
            break c;
        }
        tokio::time::sleep(NO_CREDENTIAL_WAIT).await;
    };
    let mut stream = match w.client.watch(&credential, &w.keypair).await {
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
    tracing::info!("control-plane Watch up");
    loop {
        match stream.message().await {
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
            Err(s) => return WatchEnd::Status(s),
        }
    }
}

/// `d` ± 20%.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.8..1.2))
}
