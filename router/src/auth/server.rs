//! Serving one inbound auth stream: read the request, verify (fetching keys
//! once on an unknown key id), pass the admission gate, record the
//! admission, answer.

use std::sync::Arc;

use agentmesh_proto::pb::mesh::AuthRefusal;
use agentmesh_proto::unix_now;
use futures::AsyncWriteExt;
use libp2p::{PeerId, Stream};
use tokio::sync::watch;

use agentmesh_wire::auth as wire;

use super::{Refusal, decide, purpose_of};
use crate::admission::gate::{self, Conditions, NotAdmitted};
use crate::admission::{Admissions, Purpose};
use crate::config::{Config, Sizing};
use crate::cp::{Link, fetch_keys_rate_limited};
use crate::directory::Directory;
use crate::goaway::{GoAways, Reason};
use crate::metrics::Metrics;
use crate::resources::ResourceManager;

/// What serving auth streams needs.
#[derive(Clone)]
pub(crate) struct AuthServer {
    pub(crate) config: Arc<Config>,
    pub(crate) sizing: Sizing,
    pub(crate) link: Arc<Link>,
    pub(crate) admissions: Admissions,
    pub(crate) resources: Arc<ResourceManager>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) goaways: GoAways,
    pub(crate) metrics: Metrics,
    /// Whether a drain was requested.
    pub(crate) draining: watch::Receiver<bool>,
}

/// Serves one auth stream from `peer` (proved by the noise handshake).
pub(crate) async fn serve(ctx: AuthServer, peer: PeerId, mut stream: Stream) {
    let t = ctx.config.stream_timeout;
    let req = match wire::read_request(&mut stream, t).await {
        Ok(r) => r,
        Err(e) => {
            let malformed = e.is_malformed();
            ctx.metrics
                .auth_result(Purpose::Attach, if malformed { "malformed" } else { "io" });
            tracing::info!(%peer, error = %e, "auth request unreadable");
            if malformed {
                ctx.resources.failed_login(&peer, "malformed");
                let refusal = Refusal {
                    reason: AuthRefusal::Malformed,
                    label: "malformed",
                    detail: e.to_string(),
                };
                let _ = wire::write_refused(&mut stream, refusal.reason, refusal.detail, t).await;
            }
            return;
        }
    };
    let label_purpose = purpose_of(&req).unwrap_or(Purpose::Attach);
    let skew = i64::try_from(ctx.config.clock_skew.as_secs()).unwrap_or(i64::MAX);
    let mut outcome = decide(&req, &ctx.link.trust.read(), unix_now(), &peer, skew);
    if matches!(&outcome, Err(r) if r.is_unknown_key())
        && fetch_keys_rate_limited(&ctx.link, &ctx.metrics, t).await
    {
        outcome = decide(&req, &ctx.link.trust.read(), unix_now(), &peer, skew);
    }
    let written = match outcome {
        Ok(admission) => {
            let (until, purpose) = (admission.until, admission.purpose);
            let when = Conditions {
                connected: ctx.resources.is_connected(&peer),
                draining: *ctx.draining.borrow(),
                high_watermark: ctx.sizing.high_watermark,
            };
            let reason = match gate::admit_or_refuse(&ctx.admissions, peer, admission, when) {
                Ok(()) => None,
                Err(NotAdmitted::Disconnected) => {
                    // Nobody is left to answer.
                    ctx.metrics.auth_result(purpose, "disconnected");
                    tracing::debug!(%peer, "verified, but the peer left meanwhile: not admitted");
                    return;
                }
                Err(NotAdmitted::Draining) => Some(Reason::Draining),
                Err(NotAdmitted::Overloaded) => Some(Reason::Overloaded),
            };
            if let Some(reason) = reason {
                ctx.metrics.auth_result(purpose, "go_away");
                ctx.goaways.count(reason, "on_auth");
                tracing::info!(%peer, reason = reason.as_str(), "go-away instead of admission");
                let msg = ctx.goaways.message(reason);
                if let Err(e) = wire::write_go_away(&mut stream, msg, t).await {
                    tracing::debug!(%peer, error = %e, "go-away answer not delivered");
                }
                let _ = tokio::time::timeout(t, stream.close()).await;
                return;
            }
            if purpose == Purpose::Router {
                ctx.directory.router_admitted(peer);
            }
            ctx.metrics.auth_result(purpose, "admitted");
            tracing::debug!(%peer, purpose = purpose.as_str(), until, "admitted");
            wire::write_admitted(&mut stream, until, t).await
        }
        Err(refusal) => {
            ctx.metrics.auth_result(label_purpose, refusal.label);
            ctx.resources.failed_login(&peer, refusal.label);
            tracing::info!(%peer, reason = refusal.label, detail = %refusal.detail, "auth refused");
            wire::write_refused(&mut stream, refusal.reason, refusal.detail, t).await
        }
    };
    if let Err(e) = written {
        tracing::debug!(%peer, error = %e, "auth answer not delivered");
    }
    let _ = tokio::time::timeout(t, stream.close()).await;
}
