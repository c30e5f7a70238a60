//! Outbound calls: look the service up through one of our routers, prefer a
//! provider sharing one of our routers (circuit through it), else open a
//! transit connection to one of the provider's routers; connect and call
//! timeouts; fall back to the next provider.
//!
//! A call has one deadline, set when it starts: its budget, connect +
//! call timeout ([`crate::Config::call_budget`]). Every step (each router
//! asked in the lookup, each transit connect and auth, each relayed
//! connect, each call exchange, the pauses) waits at most its own timeout
//! cut to what is left of the budget, and the whole call is bounded by the
//! deadline too, so `call()` returns (a stream or an error) within its
//! budget however many routers, providers and retries it goes through.
//! Before, only the retry was held to the deadline: a first round trying
//! `--call-attempts` providers gave each step its full timeout, one after
//! the other, and could run for several budgets (seen as calls that had
//! not returned after 22 s while a router drained under 10,000 members).
//!
//! A route can fail under a call when a router drains or a provider moves
//! off it (circuit or connection closed, stream reset, the relayed dial's
//! oneshot canceled, no answer at all), and a relay denies a circuit at
//! once when the provider has too many circuits being set up through it
//! (the router's STOP handshake cap). Such a failure, when it was the
//! last, is retried up to [`MAX_ROUTE_RETRIES`] times: a fresh lookup,
//! routes avoiding the routers that failed, after a pause that grows and is
//! jittered, all within the call's deadline. Never after a provider
//! answered: an answer (accepted or refused) is final, and so is a router's
//! refusal of the circuit by its access policy (the relay's
//! PERMISSION_DENIED): no other provider or router is tried, and the error
//! says why with the node's own copy of the policy (`super::refusal`). A lookup where every router
//! asked knew no provider is asked once more too (once, apart from the
//! route retry), after a short pause: mid-move that is a gap in the catalog.

mod attempt;
mod failure;
mod round;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use libp2p::PeerId;
use rand::Rng as _;
use tokio::time::Instant;

use super::{CallError, CallStream};
use crate::node::Node;
use round::round;

/// Least time left of the call's deadline for a retry to be worth it.
const MIN_RETRY_TIME: Duration = Duration::from_secs(1);

/// Pause before the first route retry (jittered up to ×3, ×4 for each
/// retry after it): lets the failed circuit or connection finish closing,
/// so the retry does not reuse it, and spreads callers denied together.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Route retries of one call at most (within its deadline): 50, 200 and
/// 800 ms base pauses, so a storm of denied circuits is not retried at once
/// and the call still ends well inside its budget.
const MAX_ROUTE_RETRIES: u32 = 3;

/// Pause before asking again after no router knew a provider (jittered up
/// to ×3): time for a moving provider's record to reach its new router.
const NO_PROVIDERS_PAUSE: Duration = Duration::from_millis(250);

/// The deadline of one call: every step waits at most its own timeout cut
/// to what is left.
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: Instant,
}

impl Budget {
    /// What a step may wait: `step`, or less when less is left.
    fn cap(&self, step: Duration) -> Duration {
        step.min(self.deadline.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed.
    fn spent(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// What an outbound call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// A call: the provider connects its backend and bytes flow.
    Call,
    /// A probe (`agentmesh-node ping`): set up and judged by the provider
    /// exactly as a call, which answers without touching its backend.
    Probe,
}

/// Calls `service`, counting the result and how long it took to set up
/// (`agentmesh_node_call_duration_seconds{service, result}`).
pub(crate) async fn call(node: &Arc<Node>, service: &str) -> Result<CallStream, CallError> {
    call_as(node, service, Intent::Call).await
}

/// [`call`] for `intent`.
pub(crate) async fn call_as(
    node: &Arc<Node>,
    service: &str,
    intent: Intent,
) -> Result<CallStream, CallError> {
    let started = Instant::now();
    let r = call_inner(node, service, intent).await;
    let label = match &r {
        Ok(_) => "ok",
        Err(e) => e.result_label(),
    };
    node.metrics.call("outbound", label);
    node.metrics
        .calls
        .durations
        .observe(service, label, started.elapsed());
    if let Err(e) = &r {
        tracing::debug!(service, error = %e, "call failed");
    }
    r
}

async fn call_inner(
    node: &Arc<Node>,
    service: &str,
    intent: Intent,
) -> Result<CallStream, CallError> {
    if node.is_shutting_down() {
        return Err(CallError::ShuttingDown);
    }
    let limit = node.config.call_budget();
    let budget = Budget {
        deadline: Instant::now() + limit,
    };
    // Every step inside is cut to the deadline; this bounds what is not
    // (the command queue to the engine, anything added later).
    match tokio::time::timeout_at(budget.deadline, rounds(node, service, intent, budget)).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Failed {
            service: service.to_string(),
            attempts: 0,
            last: format!("the call's budget of {limit:?} (connect + call timeout) ran out"),
            refused: false,
            refusal: None,
            timed_out: true,
        }),
    }
}

/// A first round, up to [`MAX_ROUTE_RETRIES`] route retries and one retry
/// after an empty lookup, all by `budget`.
async fn rounds(
    node: &Arc<Node>,
    service: &str,
    intent: Intent,
    budget: Budget,
) -> Result<CallStream, CallError> {
    let mut avoid: HashSet<PeerId> = HashSet::new();
    let (mut route_retries, mut lookup_retried) = (0u32, false);
    // A stream failed on a relayed connection to the provider: which one
    // is not known, so the retry closes every relayed connection to it.
    let mut close_all = false;
    // A stream failed on this direct connection: the retry closes it
    // alone and goes relayed (the fallback), still within the budget.
    let mut suspect = None;
    let mut earlier: Vec<String> = Vec::new();
    loop {
        let retry = route_retries > 0 || lookup_retried;
        let failed = match round(
            node,
            service,
            &avoid,
            retry,
            (close_all, suspect),
            intent,
            budget,
        )
        .await
        {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let (reason, pause) = match (&failed.error, failed.routes.last()) {
            (_, Some(f)) if route_retries < MAX_ROUTE_RETRIES => {
                close_all = f.reason == failure::STREAM_FAILED && f.direct.is_none();
                suspect = f.direct;
                let pause = RETRY_PAUSE * 4u32.pow(route_retries);
                route_retries += 1;
                (f.reason, pause)
            }
            // Every router we asked knew no provider: mid-move (a provider
            // between its old and new routers) that is a moment's gap in
            // the catalog, so ask once more.
            (CallError::NoProviders(_), None) if !lookup_retried => {
                lookup_retried = true;
                ("no_providers", NO_PROVIDERS_PAUSE)
            }
            _ => return Err(with_earlier(failed.error, &earlier)),
        };
        if node.is_shutting_down() || Instant::now() + MIN_RETRY_TIME > budget.deadline {
            return Err(with_earlier(failed.error, &earlier));
        }
        // No provider answered: once more, on a fresh lookup, avoiding the
        // routers whose routes failed.
        node.metrics
            .calls
            .call_retries
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
        // A failure on a direct connection is not its router's.
        avoid.extend(
            failed
                .routes
                .iter()
                .filter(|r| r.direct.is_none())
                .map(|r| r.via),
        );
        tracing::debug!(service, error = %failed.error, ?avoid, "retrying the call on a fresh route");
        earlier.push(failed.error.to_string());
        let pause = pause.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..=2.0));
        tokio::time::sleep(budget.cap(pause)).await;
    }
}

/// `error`, naming the failures that were retried before it.
fn with_earlier(error: CallError, earlier: &[String]) -> CallError {
    match error {
        CallError::Failed {
            service,
            attempts,
            last,
            refused,
            refusal,
            timed_out,
        } if !earlier.is_empty() => CallError::Failed {
            service,
            attempts,
            last: format!("{last} (retried after: {})", earlier.join("; ")),
            refused,
            refusal,
            timed_out,
        },
        other => other,
    }
}
