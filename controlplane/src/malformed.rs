//! Requests tonic refuses before a handler sees them: a message that does
//! not decode (or is missing), one larger than `--grpc-max-message-bytes`,
//! one in a compression the server does not accept. tonic decodes in its
//! codec, before the handler runs, and answers such a request itself
//! (`INTERNAL` for a message that does not decode), so without this layer
//! they were counted nowhere and cost their source nothing.
//!
//! [`Malformed`] wraps the `ControlPlane` service (every RPC, admin ones
//! included). It knows the method (the path) and the source (the remote
//! address tonic puts in the request's extensions); the handler marks the
//! call as seen ([`mark_handled`], from [`crate::service`]'s one exit), so a
//! refusal without the mark came from tonic. Such a refusal is counted in
//! `rpc_total{method,code}` and `malformed_requests_total{method,reason}`,
//! spends the source's unauthenticated share (the decoding was work done
//! before the caller was known) and is a failure of the source for the
//! failure guard ([`crate::request_limits`]). It is answered with, in order: the
//! guard's refusal when the source was already over its failures, the
//! unauthenticated budget's when its share is spent (both
//! `RESOURCE_EXHAUSTED` with `retry-after`), else `INVALID_ARGUMENT` naming
//! the method and what did not decode (`too_large` and
//! `unsupported_encoding` keep tonic's `OUT_OF_RANGE` and `UNIMPLEMENTED`).
//! Other refusals without a handler (the transport failed under the call)
//! are only counted in `rpc_total`.
//!
//! A caller gone mid-request is not malformed: when its connection drops
//! (or it resets the stream) after the request's headers and before its
//! message, tonic answers "missing request message" (`INTERNAL`) as for an
//! empty body. The layer watches the request body ([`WatchedBody`]); a
//! refusal after the body failed is counted `CANCELLED` and charges the
//! source nothing. Members behind one NAT share a source, so counting
//! their timed-out or restarting calls as malformed tripped the failure
//! guard for all of them.

use std::{
    cell::Cell,
    net::IpAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};

use tokio::time::Instant;
use tonic::{
    Code, Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

use crate::{
    grpc_limits::peer_of,
    metrics::METHODS,
    state::State,
    status::{ServiceError, counted_status},
};

tokio::task_local! {
    /// Set by the handler of the call this layer is waiting on.
    static HANDLED: Cell<bool>;
}

/// Marks the call in progress as seen by its handler. Outside the layer
/// (an in-process caller) it does nothing.
pub fn mark_handled() {
    let _ = HANDLED.try_with(|h| h.set(true));
}

/// The layer (see the module docs) around the `ControlPlane` service `S`.
#[derive(Debug, Clone)]
pub struct Malformed<S> {
    inner: S,
    state: Arc<State>,
}

impl<S> Malformed<S> {
    /// Wraps `inner`, charging refusals to `state`'s request limits.
    pub fn new(inner: S, state: Arc<State>) -> Self {
        Self { inner, state }
    }
}

impl<S: NamedService> NamedService for Malformed<S> {
    const NAME: &'static str = S::NAME;
}

/// The method of `path` (`/<service>/<Method>`), as a label value.
fn method_of(service: &str, path: &str) -> Option<&'static str> {
    let m = path
        .strip_prefix('/')?
        .strip_prefix(service)?
        .strip_prefix('/')?;
    METHODS.iter().copied().find(|known| *known == m)
}

impl<S> Service<http::Request<Body>> for Malformed<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Some(method) = method_of(S::NAME, req.uri().path()) else {
            return Box::pin(self.inner.call(req));
        };
        let source = peer_of(&req).map(|a| a.ip());
        let started = Instant::now();
        let body_failed = Arc::new(AtomicBool::new(false));
        let failed = body_failed.clone();
        let req = req.map(|inner| Body::new(WatchedBody { inner, failed }));
        let call = self.inner.call(req);
        let state = self.state.clone();
        Box::pin(async move {
            let (handled, res) = HANDLED
                .scope(Cell::new(false), async {
                    let res = call.await;
                    (HANDLED.with(Cell::get), res)
                })
                .await;
            let res = res?;
            if handled {
                return Ok(res);
            }
            let Some(status) = res.extensions().get::<Status>().cloned() else {
                return Ok(res);
            };
            if body_failed.load(Ordering::Relaxed) {
                // The caller went away: nothing it sent was malformed.
                let secs = started.elapsed().as_secs_f64();
                state.metrics.rpc_done(method, Code::Cancelled, secs);
                return Ok(Status::cancelled(format!(
                    "the {method} request ended before its message: {}",
                    status.message()
                ))
                .into_http());
            }
            let answer = refused_by_tonic(&state, method, source, &status);
            let code = answer.as_ref().map_or(status.code(), Status::code);
            state
                .metrics
                .rpc_done(method, code, started.elapsed().as_secs_f64());
            Ok(answer.map_or(res, Status::into_http))
        })
    }
}

/// A request body that notes when reading it failed (the stream was reset
/// or the connection lost), which a body that simply ended never does.
struct WatchedBody {
    inner: Body,
    failed: Arc<AtomicBool>,
}

impl HttpBody for WatchedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            this.failed.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts and charges a request tonic refused with `status` before the
/// handler; the answer to send instead of tonic's, if another.
fn refused_by_tonic(
    state: &State,
    method: &'static str,
    source: Option<IpAddr>,
    status: &Status,
) -> Option<Status> {
    let reason = match status.code() {
        Code::Internal => "undecodable",
        Code::OutOfRange => "too_large",
        Code::Unimplemented => "unsupported_encoding",
        _ => return None,
    };
    state.metrics.malformed(method, reason);
    let limits = &state.limits;
    let charged = limits.check_unauth(source);
    let detail = format!(
        "the {method} request could not be read: {}",
        status.message()
    );
    let judged = limits.judge::<()>(source, Err(ServiceError::Invalid(detail)));
    let refusal = match (judged, charged) {
        (Err(e @ ServiceError::Blocked { .. }), _) | (_, Err(e)) => e,
        (Err(e), Ok(())) if reason == "undecodable" => e,
        _ => return None,
    };
    Some(counted_status(&state.metrics, method, &refusal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_services_known_methods_are_watched() {
        let svc = "agentmesh.controlplane.v1.ControlPlane";
        assert_eq!(method_of(svc, &format!("/{svc}/Refresh")), Some("Refresh"));
        assert_eq!(method_of(svc, &format!("/{svc}/Nope")), None);
        assert_eq!(method_of(svc, "/grpc.health.v1.Health/Check"), None);
        assert_eq!(method_of(svc, &format!("{svc}/Refresh")), None);
    }
}
