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
//! change); HTTP/2 keep-alives notice a control plane that is gone.

use std::time::Duration;

use agentmesh_proto::pb::controlplane::WatchRequest;
use agentmesh_proto::pb::controlplane::control_plane_client::ControlPlaneClient;
use agentmesh_proto::proof::{Purpose, make_proof};
use agentmesh_proto::unix_now;
use libp2p::identity::Keypair;
use rand::Rng as _;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::PolicyCtx;

/// First wait after a failed attempt.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// How often a router with no credential yet looks again.
const NO_CREDENTIAL_WAIT: Duration = Duration::from_secs(1);
/// HTTP/2 keep-alive on the watch channel: a control plane that stops
/// answering pings is given up after interval + timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the watch needs.
#[derive(Clone)]
pub(crate) struct Watch {
    pub(crate) ctx: PolicyCtx,
    pub(crate) keypair: Keypair,
    /// The control plane's URL (as the lease proofs sign it).
    pub(crate) url: String,
    pub(crate) ca_pem: Option<Vec<u8>>,
    /// Deadline of connecting and of the first answer.
    pub(crate) rpc_timeout: Duration,
    pub(crate) backoff_max: Duration,
}

/// Why one watch attempt ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchEnd {
    #[error("control plane does not serve Watch")]
    Unimplemented,
    #[error("watch channel: {0}")]
    Channel(String),
    #[error("watch refused: {0}")]
    Status(tonic::Status),
    #[error("watch stream ended")]
    Ended,
}

/// Holds the watch until `cancel` fires.
pub(crate) async fn run(w: Watch, cancel: CancellationToken) {
    let channel = match channel(&w) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no control-plane Watch: the directory poll alone brings the policy");
            return;
        }
    };
    let mut backoff = BACKOFF_MIN;
    let mut said_unimplemented = false;
    loop {
        let end = tokio::select! {
            _ = cancel.cancelled() => return,
            end = attempt(&w, channel.clone(), &mut backoff) => end,
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

fn channel(w: &Watch) -> Result<Channel, String> {
    let url = w.url.trim().trim_end_matches('/').to_string();
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("bad url {url:?}: {e}"))?
        .connect_timeout(w.rpc_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        let pem = w.ca_pem.as_ref().ok_or("https without a CA certificate")?;
        agentmesh_controlplane::tls::ensure_crypto_provider();
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .map_err(|e| format!("tls: {e}"))?;
    }
    Ok(endpoint.connect_lazy())
}

/// One watch: open it, then take events until it ends. Resets `backoff`
/// once the stream is up.
async fn attempt(w: &Watch, channel: Channel, backoff: &mut Duration) -> WatchEnd {
    let credential = loop {
        if let Some(c) = w.ctx.link.credential.read().clone() {
            break c;
        }
        tokio::time::sleep(NO_CREDENTIAL_WAIT).await;
    };
    let public_url = w.url.trim().trim_end_matches('/');
    let req = tonic::Request::new(WatchRequest {
        credential: Some(credential),
        proof: Some(make_proof(
            Purpose::Watch,
            public_url,
            &w.keypair,
            unix_now(),
        )),
    });
    // Bounds the opening only: tonic's request timeout would end the
    // stream too.
    let opened =
        tokio::time::timeout(w.rpc_timeout, ControlPlaneClient::new(channel).watch(req)).await;
    let mut stream = match opened {
        Err(_) => return WatchEnd::Channel(format!("no answer within {:?}", w.rpc_timeout)),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => return WatchEnd::Unimplemented,
        Ok(Err(s)) => return WatchEnd::Status(s),
        Ok(Ok(r)) => r.into_inner(),
    };
    w.ctx.state.metrics().watch_up.set(1);
    *backoff = BACKOFF_MIN;
    tracing::info!("control-plane Watch up");
    loop {
        match stream.message().await {
            Ok(Some(ev)) => {
                w.ctx.state.metrics().watch_events.inc();
                if let Some(keys) = ev.keys.as_ref().filter(|k| !k.keys.is_empty()) {
                    w.ctx.link.trust.write().set_keys(keys);
                }
                w.ctx.take(ev.policy.as_ref(), &ev.revocations, "watch");
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
