//! Serving one inbound auth stream: read the request, verify (fetching keys
//! once on an unknown key id), record the admission, answer.

use std::sync::Arc;

use agentmesh_proto::pb::mesh::AuthRefusal;
use agentmesh_proto::unix_now;
use futures::AsyncWriteExt;
use libp2p::{PeerId, Stream};

use super::{Refusal, decide, purpose_of, wire};
use crate::admission::Purpose;
use crate::cp::fetch_keys_rate_limited;
use crate::goaway::NotAdmitted;
use crate::state::Shared;

/// Serves one auth stream from `peer` (proved by the noise handshake).
pub(crate) async fn serve(shared: Arc<Shared>, peer: PeerId, mut stream: Stream) {
    let t = shared.config.stream_timeout;
    let req = match wire::read_request(&mut stream, t).await {
        Ok(r) => r,
        Err(e) => {
            let malformed = e.is_malformed();
            shared
                .metrics
                .auth_result(Purpose::Attach, if malformed { "malformed" } else { "io" });
            tracing::info!(%peer, error = %e, "auth request unreadable");
            if malformed {
                shared.resources.failed_login(&peer, "malformed");
                let refusal = Refusal {
                    reason: AuthRefusal::Malformed,
                    label: "malformed",
                    detail: e.to_string(),
                };
                let _ = wire::write_refused(&mut stream, &refusal, t).await;
            }
            return;
        }
    };
    let label_purpose = purpose_of(&req).unwrap_or(Purpose::Attach);
    let skew = i64::try_from(shared.config.clock_skew.as_secs()).unwrap_or(i64::MAX);
    let mut outcome = decide(&req, &shared.trust.read(), unix_now(), &peer, skew);
    if matches!(&outcome, Err(r) if r.is_unknown_key()) && fetch_keys_rate_limited(&shared, t).await
    {
        outcome = decide(&req, &shared.trust.read(), unix_now(), &peer, skew);
    }
    let written = match outcome {
        Ok(admission) => {
            let (until, purpose) = (admission.until, admission.purpose);
            match crate::goaway::admit_or_refuse(&shared, peer, admission) {
                Ok(()) => {}
                Err(NotAdmitted::Disconnected) => {
                    // Nobody is left to answer.
                    shared.metrics.auth_result(purpose, "disconnected");
                    tracing::debug!(%peer, "verified, but the peer left meanwhile: not admitted");
                    return;
                }
                Err(NotAdmitted::GoAway(reason)) => {
                    shared.metrics.auth_result(purpose, "go_away");
                    crate::goaway::count(&shared, reason, "on_auth");
                    tracing::info!(%peer, reason = reason.as_str(), "go-away instead of admission");
                    let msg = crate::goaway::message(&shared, reason);
                    if let Err(e) = wire::write_go_away(&mut stream, msg, t).await {
                        tracing::debug!(%peer, error = %e, "go-away answer not delivered");
                    }
                    let _ = tokio::time::timeout(t, stream.close()).await;
                    return;
                }
            }
            if purpose == Purpose::Router {
                // Its next connections get the router DHT even before the
                // directory names it.
                shared.router_set.write().insert(peer);
            }
            shared.metrics.auth_result(purpose, "admitted");
            tracing::debug!(%peer, purpose = purpose.as_str(), until, "admitted");
            wire::write_admitted(&mut stream, until, t).await
        }
        Err(refusal) => {
            shared.metrics.auth_result(label_purpose, refusal.label);
            shared.resources.failed_login(&peer, refusal.label);
            tracing::info!(%peer, reason = refusal.label, detail = %refusal.detail, "auth refused");
            wire::write_refused(&mut stream, &refusal, t).await
        }
    };
    if let Err(e) = written {
        tracing::debug!(%peer, error = %e, "auth answer not delivered");
    }
    let _ = tokio::time::timeout(t, stream.close()).await;
}
