//! Inbound calls: hold a request slot from the stream's arrival (shared
//! fairly by caller PeerId, see `admission.rs`), read the request with a
//! first-byte deadline, verify the caller's credential offline (expected
//! subject = the PeerId the connection proved; revocations), apply
//! the access policy's grant (`may_call` of the caller's groups; refused
//! `NOT_GRANTED`), `--allow` on top of it, then take a call slot (shared
//! fairly by the caller's enrollment token, capped per caller: see
//! `slots.rs`) and splice the stream to the backend (`splice.rs`). Every
//! refusal is counted with its reason; those after the request is read are
//! also answered. A live call ends, counted in
//! `agentmesh_node_calls_ended_total{direction="inbound"}` with its reason,
//! when both sides are done, when it is idle for `--call-idle-timeout-secs`,
//! when its connection closes (whatever the backend does), when its slot
//! is taken for a token holding fewer, or when a new policy or revocation
//! no longer allows it (checked on each change, also counted in
//! `agentmesh_node_policy_calls_closed_total`); its backend connection is
//! closed with it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use agentmesh_proto::credential::{CredentialError, VerifiedClaims, verify};
use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{CallRefusal, CallRequest};
use agentmesh_proto::unix_now;
use agentmesh_streams::IncomingStreams;
use agentmesh_wire::call as call_wire;
use agentmesh_wire::frame::FrameError;
use futures::{AsyncWriteExt as _, StreamExt as _};
use libp2p::swarm::ConnectionId;
use libp2p::{PeerId, Stream};
use tokio::task::JoinSet;
use tokio_util::compat::FuturesAsyncReadCompatExt as _;
use tracing::Instrument as _;

use super::admission::{self, FirstByte, RequestSlot, RequestSlots};
use super::slots::{CallSlot, CallSlots, CallerKey, NoSlot};
use super::splice::{self, End, Limits};
use crate::config::{AllowRule, is_allowed};
use crate::metrics::DirectionLabel;
use crate::node::Node;
use crate::policy::Denied;

/// The provider side's policy and counters.
pub(crate) struct Inbound {
    services: HashMap<String, SocketAddr>,
    allow: Vec<AllowRule>,
    slots: CallSlots,
}

/// A refusal: what the caller is told and the metric label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub(crate) code: CallRefusal,
    pub(crate) detail: String,
    pub(crate) label: &'static str,
}

fn refusal(code: CallRefusal, label: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        code,
        detail: detail.into(),
        label,
    }
}

impl Inbound {
    pub(crate) fn new(
        services: &[(String, SocketAddr)],
        allow: &[AllowRule],
        max_total: usize,
        max_per_caller: usize,
    ) -> Self {
        Self {
            services: services.iter().cloned().collect(),
            allow: allow.to_vec(),
            slots: CallSlots::new(max_total, max_per_caller),
        }
    }

    /// Whether this node exposes `service`.
    pub(crate) fn exposes(&self, service: &str) -> bool {
        self.services.contains_key(service)
    }

    /// The share a verified caller counts against.
    pub(crate) fn key_of(&self, claims: &VerifiedClaims) -> CallerKey {
        self.slots.key_of(claims)
    }

    /// Checks service, allow rule and limits for a verified caller `peer`
    /// whose calls count against `key`.
    pub(crate) fn admit(
        &self,
        service: &str,
        peer: PeerId,
        key: CallerKey,
        labels: &BTreeMap<String, String>,
    ) -> Result<(SocketAddr, CallSlot<'_>), Refusal> {
        let Some(backend) = self.services.get(service).copied() else {
            return Err(refusal(
                CallRefusal::UnknownService,
                "unknown_service",
                format!("this node does not expose {service:?}"),
            ));
        };
        if !is_allowed(&self.allow, service, &peer, labels) {
            return Err(refusal(
                CallRefusal::NotAllowed,
                "not_allowed",
                format!("the allow rules of {service:?} do not admit this caller"),
            ));
        }
        let slot = self.slots.try_acquire(peer, key).map_err(|e| match e {
            NoSlot::PerCaller { max } => refusal(
                CallRefusal::TooManyCalls,
                "too_many_calls",
                format!("per-caller call limit reached: {max} (--max-inbound-calls-per-caller)"),
            ),
            NoSlot::TokenShare { held, fair_share } => refusal(
                CallRefusal::TooManyCalls,
                "token_share",
                format!(
                    "every inbound call slot is taken (--max-inbound-calls) and this caller's enrollment token holds {held} of them (fair share {fair_share})"
                ),
            ),
        })?;
        Ok((backend, slot))
    }
}

/// Accepts call streams until the swarm stops; each call runs in its own
/// task holding a request slot until its request is read. Tasks are
/// bounded by the call limit plus the request slots; a stream refused here
/// (no slot for its caller, or that bound) is dropped unanswered, counted.
/// Starts the inbound-call acceptor, watched as task `inbound_calls`.
pub(crate) fn spawn(
    node: Arc<Node>,
    incoming: IncomingStreams,
    tasks: &mut crate::supervise::Tasks,
) {
    let c = &node.config;
    let inbound = Arc::new(Inbound::new(
        &c.services.expose,
        &c.services.allow,
        c.calls.max_inbound,
        c.calls.max_inbound_per_caller,
    ));
    tasks.spawn("inbound_calls", accept_loop(node, inbound, incoming));
}

async fn accept_loop(node: Arc<Node>, inbound: Arc<Inbound>, mut incoming: IncomingStreams) {
    let mut calls = JoinSet::new();
    let requests = node.config.calls.max_inbound_requests.max(1);
    let slots = Arc::new(RequestSlots::new(requests, node.metrics.log.clone()));
    let bound = node.config.calls.max_inbound + requests;
    while let Some((info, stream)) = incoming.next().await {
        let (peer, conn, relayed) = (info.peer, info.connection, info.relayed);
        while calls.try_join_next().is_some() {}
        if calls.len() >= bound {
            node.metrics.call("inbound", "overflow");
            slots.log_refusal(peer, "overflow", "calls in any phase at their bound");
            drop(stream);
            continue;
        }
        let slot = match slots.try_acquire(peer) {
            Ok(slot) => slot,
            Err(r) => {
                node.metrics.call("inbound", admission::CALLER_SHARE);
                let detail = format!(
                    "every request slot is taken and this caller holds {} (fair share {}; --max-inbound-call-requests)",
                    r.held, r.fair_share
                );
                slots.log_refusal(peer, admission::CALLER_SHARE, &detail);
                drop(stream);
                continue;
            }
        };
        let node = node.clone();
        let inbound = inbound.clone();
        let slots = slots.clone();
        calls.spawn(
            async move { serve(node, inbound, &slots, (peer, conn, relayed), stream, slot).await }
                .in_current_span(),
        );
    }
}

async fn refuse(node: &Node, stream: &mut Stream, peer: PeerId, r: Refusal) {
    tracing::debug!(%peer, reason = r.label, detail = %r.detail, "inbound call refused");
    node.metrics.call("inbound", r.label);
    let t = node.config.call_timeout();
    let _ = call_wire::write_refused(stream, r.code, r.detail, t).await;
    let _ = tokio::time::timeout(t, stream.close()).await;
}

/// Verifies the caller's credential, re-fetching keys once for an unknown key id.
async fn verify_caller(
    node: &Node,
    req: &CallRequest,
    peer: PeerId,
) -> Result<VerifiedClaims, Refusal> {
    let Some(cred) = &req.credential else {
        return Err(refusal(
            CallRefusal::Malformed,
            "malformed",
            "no credential in the call request",
        ));
    };
    let skew = node.config.control_plane.credential_skew.as_secs() as i64;
    let mut r = verify(cred, &node.trust(), unix_now(), Some(&peer), skew);
    if matches!(r, Err(CredentialError::UnknownKey(_))) && node.refetch_keys().await {
        r = verify(cred, &node.trust(), unix_now(), Some(&peer), skew);
    }
    match r {
        Ok(v) if v.role() == Role::Member => Ok(v),
        Ok(_) => Err(refusal(
            CallRefusal::BadCredential,
            "bad_credential",
            "credential role is not member",
        )),
        Err(CredentialError::Revoked) => Err(refusal(
            CallRefusal::Revoked,
            "revoked",
            "caller is revoked",
        )),
        Err(e) => Err(refusal(
            CallRefusal::BadCredential,
            "bad_credential",
            e.to_string(),
        )),
    }
}

/// Completes once a change of the policy or of the revocations no longer
/// lets the caller with `claims` call `service` (checked at each change,
/// never polled); pending while it does.
async fn no_longer_allowed(node: &Node, claims: &VerifiedClaims, service: &str) -> Denied {
    let mut changes = node.policy.subscribe();
    loop {
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
        if let Err(d) = node
            .policy
            .may_call(&node.trust(), claims, service, unix_now())
        {
            return d;
        }
    }
}

/// What reading a call's request came to.
enum Read {
    /// The request.
    Request(CallRequest),
    /// Refused before it was read whole (malformed, late).
    Refused(Refusal),
    /// The stream was closed unanswered (its slot taken, or silent):
    /// counted and logged already.
    Closed,
}

/// Reads the call's request within the call timeout, its first byte within
/// `--call-first-byte-timeout-ms`, unless `slot` is taken for a caller
/// holding fewer first; the request slot is freed once done.
async fn read_request(
    node: &Node,
    slots: &RequestSlots,
    peer: PeerId,
    stream: &mut Stream,
    slot: RequestSlot,
) -> Read {
    let deadline = node.config.call_timeout();
    let mut first = FirstByte::new(stream, node.config.calls.first_byte_timeout());
    let read = tokio::select! {
        r = call_wire::read_request(&mut first, deadline) => Some(r),
        () = slot.preempted() => None,
    };
    let silent = first.timed_out();
    // The request is read (or the stream is done): its slot is free.
    drop(slot);
    let Some(read) = read else {
        node.metrics.call("inbound", admission::PREEMPTED);
        slots.log_refusal(
            peer,
            admission::PREEMPTED,
            "closed before its request: its slot was taken for a caller holding fewer",
        );
        return Read::Closed;
    };
    if silent {
        node.metrics.call("inbound", admission::SILENT);
        slots.log_refusal(
            peer,
            admission::SILENT,
            "no byte within --call-first-byte-timeout-ms",
        );
        return Read::Closed;
    }
    match read {
        Ok(r) => Read::Request(r),
        Err(FrameError::Timeout(_)) => Read::Refused(refusal(
            CallRefusal::Malformed,
            "malformed",
            "no call request in time",
        )),
        Err(e) => Read::Refused(refusal(
            CallRefusal::Malformed,
            "malformed",
            format!("bad call request: {e}"),
        )),
    }
}

/// Whether the call may go ahead: the node is not stopping, the caller's
/// credential verifies, the policy grants it the service, then (in
/// `admit`) the provider's own `--allow` on top and a call slot. Returns
/// the caller's claims, the service's backend and the call's slot.
async fn judge<'a>(
    node: &Node,
    inbound: &'a Inbound,
    req: &CallRequest,
    peer: PeerId,
) -> Result<(VerifiedClaims, SocketAddr, CallSlot<'a>), Refusal> {
    if node.is_shutting_down() {
        return Err(refusal(
            CallRefusal::ShuttingDown,
            "shutting_down",
            "provider is shutting down",
        ));
    }
    let claims = verify_caller(node, req, peer).await?;
    // The policy's grant, then (in `admit`) the provider's own `--allow`
    // on top: a call needs both.
    if inbound.exposes(&req.service)
        && let Err(d) = node
            .policy
            .may_call(&node.trust(), &claims, &req.service, unix_now())
    {
        return Err(match d {
            Denied::NotGranted => refusal(
                CallRefusal::NotGranted,
                "not_granted",
                format!(
                    "the access policy (version {}) grants none of this caller's groups {:?}",
                    node.policy.epoch_version().1,
                    req.service
                ),
            ),
            Denied::Revoked => refusal(CallRefusal::Revoked, "revoked", "caller is revoked"),
        });
    }
    let labels = claims.labels();
    let key = inbound.key_of(&claims);
    let (backend, slot) = inbound.admit(&req.service, peer, key, &labels)?;
    Ok((claims, backend, slot))
}

/// Connects to the service's backend within the connect timeout.
async fn connect_backend(
    node: &Node,
    backend: SocketAddr,
) -> Result<tokio::net::TcpStream, Refusal> {
    match tokio::time::timeout(
        node.config.connect_timeout(),
        tokio::net::TcpStream::connect(backend),
    )
    .await
    {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(refusal(
            CallRefusal::BackendUnavailable,
            "backend_unavailable",
            format!("backend: {e}"),
        )),
        Err(_) => Err(refusal(
            CallRefusal::BackendUnavailable,
            "backend_unavailable",
            "backend connect timed out",
        )),
    }
}

async fn serve(
    node: Arc<Node>,
    inbound: Arc<Inbound>,
    slots: &RequestSlots,
    (peer, conn, relayed): (PeerId, ConnectionId, bool),
    mut stream: Stream,
    slot: RequestSlot,
) {
    let _guard = node.in_flight_guard();
    // The caller's circuit stays open while its call lives, and so does the
    // router under it, even once let go after its go-away (`engine::linger`).
    let mut peer_call = node.peer_calls.begin(peer);
    peer_call.carried_by(conn);
    let deadline = node.config.call_timeout();
    let req = match read_request(&node, slots, peer, &mut stream, slot).await {
        Read::Request(req) => req,
        Read::Refused(r) => return refuse(&node, &mut stream, peer, r).await,
        Read::Closed => return,
    };
    let (claims, backend, slot) = match judge(&node, &inbound, &req, peer).await {
        Ok(x) => x,
        Err(r) => return refuse(&node, &mut stream, peer, r).await,
    };
    if req.probe {
        // `agentmesh-node ping`: judged as a call, answered, and ended;
        // the backend sees nothing.
        drop((claims, backend, slot));
        node.metrics.call("inbound", "probe");
        let _ = call_wire::write_accepted(&mut stream, deadline).await;
        let _ = tokio::time::timeout(deadline, stream.close()).await;
        tracing::debug!(%peer, service = %req.service, "inbound probe answered");
        return;
    }
    let tcp = match connect_backend(&node, backend).await {
        Ok(t) => t,
        Err(r) => return refuse(&node, &mut stream, peer, r).await,
    };
    let _ = tcp.set_nodelay(true);
    node.metrics.call("inbound", "accepted");
    let _ = call_wire::write_accepted(&mut stream, deadline).await;
    tracing::debug!(%peer, service = %req.service, "inbound call accepted");
    let m = &node.metrics;
    m.calls.inbound_calls_active.inc();
    let closed = node.control.closed(conn);
    let mut remote = stream.compat();
    let mut tcp = tcp;
    let touch = || slot.touch();
    let limits = Limits {
        buffer: node.config.calls.splice_buffer_bytes(),
        idle: node.config.calls.idle_deadline(),
        closed: &closed,
        on_activity: &touch,
    };
    let stop = async {
        tokio::select! {
            () = slot.preempted() => "preempted",
            d = no_longer_allowed(&node, &claims, &req.service) => {
                tracing::info!(%peer, service = %req.service, reason = d.label(), "live call closed: the policy or a revocation no longer allows it");
                m.policy
                    .calls_closed
                    .get_or_create(&crate::metrics::ReasonLabel { reason: d.label() })
                    .inc();
                "no_longer_allowed"
            }
        }
    };
    let out = splice::splice(&mut remote, &mut tcp, limits, stop).await;
    // The backend connection, the stream and the slot go first; then the
    // end is settled.
    drop(tcp);
    drop(remote);
    drop(slot);
    m.calls.inbound_calls_active.dec();
    let out = out.settle(&closed).await;
    m.call_ended("inbound", out.end.label());
    m.calls
        .call_bytes
        .get_or_create(&DirectionLabel {
            direction: "received",
        })
        .inc_by(out.from_stream);
    m.calls
        .call_bytes
        .get_or_create(&DirectionLabel { direction: "sent" })
        .inc_by(out.to_stream);
    let (path_sent, path_received) = m.direct.path_bytes(!relayed);
    path_received.inc_by(out.from_stream);
    path_sent.inc_by(out.to_stream);
    let (from_caller, to_caller) = (out.from_stream, out.to_stream);
    match (out.end, &out.error) {
        (End::Finished, _) => {
            tracing::debug!(%peer, from_caller, to_caller, "inbound call finished");
        }
        (end, error) => tracing::debug!(
            %peer,
            from_caller,
            to_caller,
            reason = end.label(),
            error = ?error,
            "inbound call ended"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_rules_refuse_with_reasons() {
        let backend: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let rules = vec!["db=label:team=data".parse::<AllowRule>().expect("rule")];
        let inbound = Inbound::new(
            &[("db".into(), backend), ("echo".into(), backend)],
            &rules,
            3,
            2,
        );
        let a = PeerId::random();
        let b = PeerId::random();
        // One token: the total binds them together.
        let (ka, kb) = (CallerKey::Token(1), CallerKey::Token(1));
        let data: BTreeMap<_, _> = [("team".to_string(), "data".to_string())].into();
        let none = BTreeMap::new();

        let e = inbound.admit("nope", a, ka, &none).err().expect("unknown");
        assert_eq!(e.code, CallRefusal::UnknownService);
        let e = inbound
            .admit("db", a, ka, &none)
            .err()
            .expect("not allowed");
        assert_eq!(e.code, CallRefusal::NotAllowed);

        // Per caller: two for a, the third refused; b still gets one (total 3).
        let s1 = inbound.admit("db", a, ka, &data).expect("1");
        let _s2 = inbound.admit("echo", a, ka, &none).expect("2");
        let e = inbound
            .admit("echo", a, ka, &none)
            .err()
            .expect("per caller");
        assert_eq!(e.label, "too_many_calls");
        assert!(e.detail.contains("per-caller"), "{}", e.detail);
        let _s3 = inbound.admit("echo", b, kb, &none).expect("3");
        // Total: now full for that token, which holds every slot.
        let e = inbound.admit("echo", b, kb, &none).err().expect("total");
        assert_eq!(
            (e.code, e.label),
            (CallRefusal::TooManyCalls, "token_share")
        );
        assert!(e.detail.contains("--max-inbound-calls)"), "{}", e.detail);
        // A finished call frees both its slots.
        drop(s1);
        assert!(inbound.admit("echo", a, ka, &none).is_ok());
    }
}
