//! `agentmesh-node ping SERVICE`: one call set up to SERVICE exactly as
//! `call` sets it up (lookup, route, circuit, the provider's checks of
//! credential, policy, `--allow` and a call slot), marked as a probe so the
//! provider answers it without connecting to its backend, then closed at
//! once. What it reports: which way the call went (the provider,
//! the router the circuit went through, whether that router is one we hold
//! or one we reached for transit), the round trip of the call request (from
//! sending it to the provider's answer), the whole set-up time, and the
//! verdict with its typed reason when refused or failed.
//!
//! Asked over the node's Unix socket (`PING <name>`, one [`PingReply`] JSON
//! line back); `crate::cli::ping` is the client. The caller counts a ping
//! in `agentmesh_node_calls_total` and
//! `agentmesh_node_call_duration_seconds` like a call; the provider counts
//! it as `result="probe"` and its backend sees nothing.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::call::{CallError, CallRoute};
use crate::node::Node;

/// Longest wait for the provider to close its side once the ping has
/// closed its own: the stream is dropped after it anyway.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Most bytes of a backend's answer read (and dropped) while closing.
const MAX_DRAIN_BYTES: u64 = 64 * 1024;

/// The verdict of one ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The provider accepted the call.
    Granted,
    /// A router refused the circuit by its access policy, or the provider
    /// refused the call (policy, `--allow`, revoked, limits, backend down).
    Refused,
    /// No answer to judge by: not ready, no provider, lookup or connect
    /// failed, timed out.
    Failed,
}

/// How the call travelled: through a router's relay, or on a direct
/// connection between the two members (then `router` is none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingRoute {
    /// `relayed` (through `router`'s relay) or `direct` (a connection
    /// between the members, punched through their NATs).
    pub path: String,
    /// The router whose relay carried the circuit (`None` on a direct path).
    pub router: Option<String>,
    /// Whether that router is one we reached only for this (transit: the
    /// provider shares none of our routers), not one we hold.
    pub transit: bool,
    /// The provider's PeerId.
    pub provider: String,
}

impl From<&CallRoute> for PingRoute {
    fn from(r: &CallRoute) -> Self {
        Self {
            path: r.path().to_string(),
            router: (!r.direct).then(|| r.via_router.to_string()),
            transit: r.transit,
            provider: r.provider.to_string(),
        }
    }
}

/// One ping's answer, as one JSON line on the socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingReply {
    /// The service pinged.
    pub service: String,
    /// Granted, refused or failed.
    pub verdict: Verdict,
    /// When not granted, the typed reason: the provider's refusal
    /// (`not_granted`, `not_allowed`, `revoked`, `too_many_calls`,
    /// `backend_unavailable`, ...) or the call's result (`denied`: a
    /// router's policy; `no_providers`, `not_ready`, `timeout`, ...).
    pub reason: Option<String>,
    /// When not granted, why in words (one line).
    pub detail: Option<String>,
    /// The way the call went, when granted.
    pub route: Option<PingRoute>,
    /// From sending the call request to the provider's answer,
    /// milliseconds, when granted.
    pub rtt_ms: Option<f64>,
    /// The whole set-up (lookup, route, circuit, answer), milliseconds.
    pub setup_ms: f64,
}

impl PingReply {
    /// A ping that got no answer from the node: `reason` and `detail` say
    /// why (used by the client for its own timeouts).
    pub fn failed(service: &str, reason: &str, detail: String, setup: Duration) -> Self {
        Self {
            service: service.to_string(),
            verdict: Verdict::Failed,
            reason: Some(reason.to_string()),
            detail: Some(detail),
            route: None,
            rtt_ms: None,
            setup_ms: ms(setup),
        }
    }

    fn from_error(service: &str, e: &CallError, setup: Duration) -> Self {
        Self {
            service: service.to_string(),
            verdict: if e.is_refusal() {
                Verdict::Refused
            } else {
                Verdict::Failed
            },
            reason: Some(e.reason()),
            detail: Some(e.to_string().replace('\n', " ")),
            route: None,
            rtt_ms: None,
            setup_ms: ms(setup),
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1_000.0
}

/// Pings `service` once through `node`: a call set up and closed.
pub(crate) async fn ping(node: &Arc<Node>, service: &str) -> PingReply {
    let started = Instant::now();
    match crate::call::outbound::call_as(node, service, crate::call::outbound::Intent::Probe).await
    {
        Err(e) => PingReply::from_error(service, &e, started.elapsed()),
        Ok(mut stream) => {
            let setup = started.elapsed();
            let reply = PingReply {
                service: service.to_string(),
                verdict: Verdict::Granted,
                reason: None,
                detail: None,
                route: Some(PingRoute::from(stream.route())),
                rtt_ms: Some(ms(stream.answered_in())),
                setup_ms: ms(setup),
            };
            // Close our side, so the provider ends the call with its
            // backend as finished rather than as a reset stream; bounded.
            let close = async {
                stream.shutdown().await?;
                let mut sink = tokio::io::sink();
                tokio::io::copy(&mut (&mut stream).take(MAX_DRAIN_BYTES), &mut sink).await
            };
            let _ = tokio::time::timeout(CLOSE_GRACE, close).await;
            reply
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_one_json_line_and_reads_back() {
        let r = PingReply {
            service: "upper".into(),
            verdict: Verdict::Refused,
            reason: Some("not_granted".into()),
            detail: Some("call to \"upper\" failed\nafter 1 provider(s)".replace('\n', " ")),
            route: None,
            rtt_ms: None,
            setup_ms: 12.5,
        };
        let json = serde_json::to_string(&r).expect("json");
        assert!(!json.contains('\n'), "{json}");
        assert!(json.contains(r#""verdict":"refused""#), "{json}");
        assert_eq!(serde_json::from_str::<PingReply>(&json).expect("read"), r);
        assert_eq!(ms(Duration::from_micros(1_234_567)), 1234.567);
    }

    #[test]
    fn a_direct_call_reports_the_direct_path_and_no_router() {
        let (provider, router) = (libp2p::PeerId::random(), libp2p::PeerId::random());
        let relayed = CallRoute {
            provider,
            via_router: router,
            transit: false,
            direct: false,
        };
        let r = PingRoute::from(&relayed);
        assert_eq!(
            (r.path.as_str(), r.router),
            ("relayed", Some(router.to_string()))
        );
        let r = PingRoute::from(&CallRoute {
            direct: true,
            ..relayed
        });
        assert_eq!((r.path.as_str(), r.router), ("direct", None));
    }

    #[test]
    fn refusals_are_told_from_failures_with_their_typed_reason() {
        use agentmesh_proto::pb::mesh::CallRefusal;
        let refused = CallError::Failed {
            service: "s".into(),
            attempts: 1,
            last: "provider P refused: CALL_REFUSAL_NOT_GRANTED".into(),
            refused: true,
            refusal: Some(CallRefusal::NotGranted),
            timed_out: false,
        };
        let r = PingReply::from_error("s", &refused, Duration::from_millis(3));
        assert_eq!(r.verdict, Verdict::Refused);
        assert_eq!(r.reason.as_deref(), Some("not_granted"));
        let denied = CallError::Denied {
            service: "s".into(),
            detail: "the access policy (version 1) grants none".into(),
        };
        let r = PingReply::from_error("s", &denied, Duration::ZERO);
        assert_eq!(
            (r.verdict, r.reason.as_deref()),
            (Verdict::Refused, Some("denied"))
        );
        let none = CallError::NoProviders("s".into());
        let r = PingReply::from_error("s", &none, Duration::ZERO);
        assert_eq!(
            (r.verdict, r.reason.as_deref()),
            (Verdict::Failed, Some("no_providers"))
        );
    }
}
