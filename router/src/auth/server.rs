//! Serving one inbound auth stream: wait for its first byte (a stream of a
//! peer not admitted, silent past `--auth-first-byte-timeout-ms`, is a
//! failed login of its source), read the request, verify (fetching keys once on an unknown key
//! id), pass the admission gate, record the admission, answer.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{AuthRefusal, AuthRequest};
use agentmesh_proto::unix_now;
use agentmesh_streams::ConnectionInfo;
use futures::{AsyncReadExt as _, AsyncWriteExt};
use libp2p::{PeerId, Stream};
use tokio::sync::watch;

use agentmesh_wire::auth as wire;
use agentmesh_wire::frame::FrameError;

use super::first_byte::{FirstByte, first_byte};

use super::{Refusal, decide, purpose_of};
use crate::admission::gate::{Conditions, NotAdmitted};
use crate::admission::{Admissions, Purpose};
use crate::config::{Config, Sizing};
use crate::cp::{Link, fetch_keys_rate_limited};
use crate::directory::Directory;
use crate::goaway::{GoAways, Reason};
use crate::metrics::Metrics;
use crate::policy::state::Reported;
use crate::resources::ResourceManager;
use crate::resources::source::ip_of;

/// What serving auth streams needs.
#[derive(Clone)]
pub(crate) struct AuthServer {
    pub(crate) config: Arc<Config>,
    pub(crate) sizing: Sizing,
    pub(crate) link: Arc<Link>,
    pub(crate) admissions: Admissions,
    /// Admissions are recorded by the table's owner (the swarm loop).
    pub(crate) tables: crate::tables::Handle,
    pub(crate) resources: Arc<ResourceManager>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) goaways: GoAways,
    pub(crate) metrics: Metrics,
    /// Whether a drain was requested.
    pub(crate) draining: watch::Receiver<bool>,
    /// The policy held: admissions carry their groups under it, and the
    /// answer carries it to a member that lacks it.
    pub(crate) policy: Arc<crate::policy::state::PolicyState>,
}

/// Longest time the busy answer may take to write and close.
const BUSY_ANSWER_DEADLINE: Duration = Duration::from_secs(2);

/// Answers an auth stream that waited for a slot in vain (see
/// `crate::streams`): busy, ask again after `retry_after`; the request is
/// not read. Not a failed login: the stream did nothing wrong.
pub(crate) async fn busy(
    ctx: AuthServer,
    info: ConnectionInfo,
    mut stream: Stream,
    retry_after: Duration,
) {
    ctx.metrics.auth_result(Purpose::Attach, "busy");
    let t = ctx
        .config
        .connections
        .stream_timeout
        .min(BUSY_ANSWER_DEADLINE);
    let detail = format!(
        "router busy admitting others: no auth slot within {:?}",
        ctx.config.auth.queue_wait
    );
    if let Err(e) = wire::write_busy(&mut stream, retry_after, detail, t).await {
        tracing::debug!(peer = %info.peer, error = %e, "busy answer not delivered");
    }
    let _ = tokio::time::timeout(t, stream.close()).await;
}

/// Reads the auth request of `peer` (from `source`), within the
/// first-byte deadline of a stranger or the stream timeout of an admitted
/// peer; `None` once the stream was answered (malformed), counted and
/// closed.
async fn read_request(
    ctx: &AuthServer,
    peer: PeerId,
    source: Option<IpAddr>,
    stream: &mut Stream,
) -> Option<AuthRequest> {
    let t = ctx.config.connections.stream_timeout;
    // A member re-presenting its credential on a connection it is admitted
    // on is no stranger holding a slot: its request may be late because
    // the member or this router is short of CPU (credentials refreshed
    // every few seconds on a loaded host), and closing it at the
    // first-byte deadline would fail the re-presentation, then the
    // admission, and put its load back as a re-attach. It gets the whole
    // stream timeout, and a late request is never a failed login; its
    // streams stay under the members' per-peer caps.
    let admitted = ctx.admissions.read().is_admitted(&peer, unix_now());
    let first_deadline = if admitted {
        t
    } else {
        ctx.config.auth.first_byte_timeout
    };
    let first = first_byte(stream, first_deadline).await;
    let first = match first {
        FirstByte::Byte(b) => b,
        FirstByte::Silent if admitted => {
            ctx.metrics.auth_result(Purpose::Attach, "io");
            tracing::debug!(%peer, "admitted peer's auth stream sent nothing within the stream timeout; closed");
            return None;
        }
        FirstByte::Silent => {
            ctx.metrics.auth_result(Purpose::Attach, "silent");
            ctx.resources.failed_login(source, "silent");
            tracing::debug!(%peer, ?source, "auth stream silent past the first-byte deadline; closed");
            return None;
        }
        FirstByte::Closed(e) => {
            ctx.metrics.auth_result(Purpose::Attach, "io");
            tracing::debug!(%peer, error = ?e, "auth stream closed before its request");
            return None;
        }
    };
    let read = {
        let mut whole = futures::io::Cursor::new([first]).chain(&mut *stream);
        wire::read_request(&mut whole, t).await
    };
    match read {
        Ok(r) => Some(r),
        Err(e) => {
            let malformed = e.is_malformed();
            ctx.metrics
                .auth_result(Purpose::Attach, if malformed { "malformed" } else { "io" });
            let key = ctx.resources.log_key(source, &peer);
            if let Some(suppressed) = ctx.resources.log_pass(&key, "auth_unreadable") {
                tracing::info!(%peer, source = key, error = %e, suppressed, "auth request unreadable (logged at most once a minute per source)");
            }
            if malformed {
                ctx.resources.failed_login(source, "malformed");
                let refusal = Refusal {
                    reason: AuthRefusal::Malformed,
                    label: "malformed",
                    detail: e.to_string(),
                };
                let _ = wire::write_refused(stream, refusal.reason, refusal.detail, t).await;
            }
            None
        }
    }
}

/// Serves one auth stream from `info.peer` (proved by the noise handshake).
pub(crate) async fn serve(ctx: AuthServer, info: ConnectionInfo, mut stream: Stream) {
    let (peer, source) = (info.peer, ip_of(&info.remote_addr));
    let t = ctx.config.connections.stream_timeout;
    let Some(req) = read_request(&ctx, peer, source, &mut stream).await else {
        return;
    };
    let label_purpose = purpose_of(&req).unwrap_or(Purpose::Attach);
    let skew = ctx.config.control_plane.skew_secs();
    let policy = ctx.policy.policy();
    let mut outcome = decide(
        &req,
        &ctx.link.trust.read(),
        unix_now(),
        &peer,
        skew,
        &policy,
    );
    if matches!(&outcome, Err(r) if r.is_unknown_key())
        && fetch_keys_rate_limited(&ctx.link, &ctx.tables, &ctx.metrics, t).await
    {
        outcome = decide(
            &req,
            &ctx.link.trust.read(),
            unix_now(),
            &peer,
            skew,
            &policy,
        );
    }
    let written = match outcome {
        Ok(admission) => match admit(&ctx, &info, &req, admission, &mut stream).await {
            Some(written) => written,
            None => return,
        },
        Err(refusal) => {
            ctx.metrics.auth_result(label_purpose, refusal.label);
            ctx.resources.failed_login(source, refusal.label);
            let key = ctx.resources.log_key(source, &peer);
            if let Some(suppressed) = ctx.resources.log_pass(&key, "auth_refused") {
                tracing::info!(%peer, source = key, reason = refusal.label, detail = %refusal.detail, suppressed, "auth refused (logged at most once a minute per source)");
            }
            wire::write_refused(&mut stream, refusal.reason, refusal.detail, t).await
        }
    };
    if let Err(e) = written {
        tracing::debug!(%peer, error = %e, "auth answer not delivered");
    }
    let _ = tokio::time::timeout(t, stream.close()).await;
}

/// Records `peer`'s verified `admission` through the table's owner and
/// answers: admitted (with what it lacks of the policy), go-away, or busy
/// when the owner did not answer in time. `None` when the stream was
/// answered and closed here (or nobody is left to answer).
async fn admit(
    ctx: &AuthServer,
    info: &ConnectionInfo,
    req: &AuthRequest,
    mut admission: crate::admission::Admission,
    stream: &mut Stream,
) -> Option<Result<(), FrameError>> {
    let (t, peer) = (ctx.config.connections.stream_timeout, info.peer);
    let (until, purpose) = (admission.until, admission.purpose);
    // A member (not a router) that lacks the held policy or
    // revocation list gets what it lacks in the answer: current at
    // once. Noted on its admission, so a push round for that state
    // skips it.
    let reported = Reported {
        policy: (req.policy_epoch, req.policy_version),
        revocations: (req.revocations_epoch, req.revocations_generation),
    };
    let push = (purpose != Purpose::Router)
        .then(|| ctx.policy.push_for(reported))
        .flatten()
        .map(|(generation, push)| {
            admission.push.holds_generation = Some(generation);
            push
        });
    let when = Conditions {
        connected: ctx.resources.is_connected(&peer),
        draining: *ctx.draining.borrow(),
        high_watermark: ctx.sizing.high_watermark,
    };
    let gate = match ctx.tables.admit(peer, admission, when).await {
        Ok(gate) => gate,
        Err(e) => {
            // The swarm loop did not record it in time (counted
            // and logged by the handle): busy, ask again later.
            ctx.metrics.auth_result(purpose, "busy");
            let detail = format!("router busy: {e}");
            let retry = ctx.config.auth.busy_retry_after;
            if let Err(e) = wire::write_busy(&mut *stream, retry, detail, t).await {
                tracing::debug!(%peer, error = %e, "busy answer not delivered");
            }
            let _ = tokio::time::timeout(t, stream.close()).await;
            return None;
        }
    };
    let reason = match gate {
        Ok(()) => None,
        Err(NotAdmitted::Disconnected) => {
            // Nobody is left to answer.
            ctx.metrics.auth_result(purpose, "disconnected");
            tracing::debug!(%peer, "verified, but the peer left meanwhile: not admitted");
            return None;
        }
        Err(NotAdmitted::Draining) => Some(Reason::Draining),
        Err(NotAdmitted::Overloaded) => Some(Reason::Overloaded),
    };
    if let Some(reason) = reason {
        ctx.metrics.auth_result(purpose, "go_away");
        ctx.goaways.count(reason, "on_auth");
        if let Some(suppressed) = ctx.resources.log_pass(&peer.to_string(), "auth_goaway") {
            tracing::info!(%peer, reason = reason.as_str(), suppressed, "go-away instead of admission (logged at most once a minute per peer)");
        }
        let msg = ctx.goaways.message(reason);
        if let Err(e) = wire::write_go_away(&mut *stream, msg, t).await {
            tracing::debug!(%peer, error = %e, "go-away answer not delivered");
        }
        let _ = tokio::time::timeout(t, stream.close()).await;
        return None;
    }
    ctx.resources.peer_admitted(&peer);
    if purpose == Purpose::Router {
        ctx.directory.router_admitted(peer);
    }
    ctx.metrics.auth_result(purpose, "admitted");
    tracing::debug!(%peer, purpose = purpose.as_str(), until, "admitted");
    // The member learns the address we observed it at (its NAT mapping,
    // for direct connections), not through identify.
    let observed = (!info.dialed).then_some(&info.remote_addr);
    Some(wire::write_admitted_observed(stream, until, push, observed, t).await)
}
